"""Sequential design: measure in rounds, decide every cell between rounds, stop when decided.

Looks at n = min_pairs, ..., max_pairs pairs, one per round: K planned looks, each interval the
paired t at the level the boundary gives that look (:mod:`luksbench.analysis.boundary`: Pocock,
O'Brien-Fleming or Bonferroni, calibrated so that all K of a cell hold together at the confidence),
so the one where it stopped (a repeated confidence interval) covers whatever chose that look; a
decision rests on its two one-sided bounds. Drift of d across pairs widens every look
(:mod:`luksbench.analysis.drift`, in the loss table). A cell stops when every row of the
design metric is decided by magnitude, at ``max_pairs``, or when the device-time budget is spent
(which goes first to the cells closest to a decision). :func:`next_round` writes the targets file
(:mod:`luksbench.formats.targets`) for ``luksbench next`` and the workflow's rounds alike.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from luksbench.analysis import boundary as boundaries
from luksbench.analysis import stats
from luksbench.analysis.cells import CELL_KEYS
from luksbench.formats.targets import read_looks, write_targets

KIND = "luksbench sequential targets v1"
#: the decisions that settle a cell (the others: undecided, insufficient)
DECIDED = ("negligible", "moderate", "material", "moderate gain", "material gain")
#: the fixed default design the sequential one is set against: this many pairs per cell
FIXED_PAIRS = 3
#: loss-table columns of a sequential cell's rows: its device time, and what the fixed design
#: would have decided on its first FIXED_PAIRS pairs at the nominal confidence, at what cost
FIXED_COLUMNS = ["device_seconds", "fixed3_decision", "fixed3_pairs", "fixed3_seconds"]


def look_confidence(confidence: float, min_pairs: int, max_pairs: int) -> float:
    """Level of every look's interval: 1 - (1 - confidence) / K, K = the planned looks."""
    if not 2 <= min_pairs <= max_pairs:
        raise ValueError(f"need 2 <= min_pairs <= max_pairs, not {min_pairs}, {max_pairs}")
    return 1 - (1 - confidence) / (max_pairs - min_pairs + 1)


def cycle_looks(min_pairs: int, max_pairs: int, sessions: int) -> list[int]:
    """The looks of a sequential design over ``sessions`` k >= 2: after whole cycles of the
    rounds (a pair in every session), at n = k j pairs, min_pairs <= n <= max_pairs."""
    looks = [n for n in range(sessions, max_pairs + 1, sessions) if n >= min_pairs]
    if not looks:
        raise ValueError(
            f"no whole cycle of {sessions} sessions between min_pairs {min_pairs} and "
            f"max_pairs {max_pairs}: raise max_pairs to >= {sessions * -(-min_pairs // sessions)}"
        )
    return looks


def session_look_levels(
    confidence: float, min_pairs: int, max_pairs: int, sessions: int
) -> dict[int, float]:
    """Pairs n -> level of the look at n with sessions: Bonferroni over the K whole-cycle looks
    (:func:`cycle_looks`), 1 - (1 - confidence) / K at every n. The calibrated boundaries
    (Pocock, O'Brien-Fleming) assume independent increments (the look statistics a Brownian
    motion in the pairs); a look over session means does not have them (each look re-estimates
    every session's mean and the between-session variance from k - 1 degrees of freedom), so
    only Bonferroni's bound, which holds for any dependence between the looks, is used."""
    k = len(cycle_looks(min_pairs, max_pairs, sessions))
    return dict.fromkeys(range(min_pairs, max_pairs + 1), 1 - (1 - confidence) / k)


def planned_sessions(fio: pd.DataFrame) -> int:
    """Sessions the manifests of the run plan (ingest's ``sessions_planned``; 1 without)."""
    if not len(fio) or "sessions_planned" not in fio.columns:
        return 1
    return int(pd.to_numeric(fio["sessions_planned"], errors="coerce").fillna(1).max())


def whole_cycles(fio: pd.DataFrame, sessions: int) -> pd.Series:
    """Per workload: whether every one of the ``sessions`` sessions holds the same number of
    usable pairs (pairs fio did not flag), i.e. the rounds stand after a whole cycle."""
    if not len(fio) or "session" not in fio.columns:
        return pd.Series(dtype=bool)
    bad = stats._rep_flags(fio).any(axis=1)
    flagged = set(zip(fio.loc[bad, "workload"], fio.loc[bad, "rep"], strict=True))
    reps = fio[["workload", "rep", "session"]].drop_duplicates(["workload", "rep"])
    reps = reps[[(w, r) not in flagged for w, r in zip(reps["workload"], reps["rep"], strict=True)]]
    counts = reps.groupby("workload")["session"].agg(lambda s: s.value_counts().tolist())
    return counts.map(lambda c: len(c) == sessions and len(set(c)) == 1)


def device_seconds(fio: pd.DataFrame, host: str = "host") -> pd.DataFrame:
    """Per (``host`` column, workload, rep): the pair's device seconds (the sum of its runs' fio
    runtimes). ``host``: ``host`` (a loss table's hosts) or ``host_dir`` (the raw host folder:
    a fleet run's servers measure at once, so a run lasts as long as its slowest server)."""
    runs = fio.groupby([host, "workload", "rep", "stack"], as_index=False)["runtime_ms"].max()
    return (
        runs.groupby([host, "workload", "rep"], as_index=False)["runtime_ms"]
        .sum()
        .eval("seconds = runtime_ms / 1000")
    )


def host_results(fio: pd.DataFrame, host: str) -> pd.DataFrame:
    """The rows measured from the raw host folder ``host``: ``host_dir`` (a fleet run's rows name
    their fio servers in ``host``, all under the coordinator's folder), else ``host``."""
    if not len(fio):
        return fio
    column = "host_dir" if "host_dir" in fio.columns else "host"
    return fio[fio[column] == host]


def flagged_reps(fio: pd.DataFrame) -> pd.Series:
    """Per workload: the repetitions fio flagged in some stack (an error, a steady state not
    attained: :data:`luksbench.analysis.stats.REP_FLAGS`), which the loss table leaves out."""
    if not len(fio):
        return pd.Series(dtype="int64")
    bad = stats._rep_flags(fio).any(axis=1)
    return fio[bad].groupby("workload")["rep"].nunique().astype("int64")


def usable_reps(fio: pd.DataFrame) -> pd.Series:
    """Per workload: repetitions on disk less those fio flagged (the pairs a look counts)."""
    measured = fio.groupby("workload")["rep"].max()
    return measured.sub(flagged_reps(fio).reindex(measured.index, fill_value=0))


def _cell_looks(loss: pd.DataFrame) -> pd.DataFrame:
    """Per workload: pairs, decision (undecided when any row is), interval and closeness."""
    half = (loss["ci_high"] - loss["ci_low"]) / 2
    lower, upper = loss["decision_lower_pct"].to_numpy(), loss["decision_upper_pct"].to_numpy()
    edges = np.stack([-upper, -lower, lower, upper], axis=1)
    distance = np.abs(loss["effect_pct"].to_numpy(float)[:, None] - edges).min(axis=1)
    rows = loss.assign(closeness=distance / half)
    rows["undecided"] = ~rows["decision"].isin(DECIDED)
    out = rows.groupby("workload").agg(
        n=("n", "min"),
        undecided=("undecided", "any"),
        closeness=("closeness", "min"),
        low=("ci_low", "min"),
        high=("ci_high", "max"),
    )
    decisions = rows.groupby("workload")["decision"].agg(lambda s: "; ".join(sorted(set(s))))
    return out.assign(decision=decisions)


def next_round(
    fio: pd.DataFrame,
    host: str,
    out: Path,
    *,
    comparisons: list,
    min_pairs: int = 3,
    max_pairs: int = 12,
    budget_s: float = 0.0,
    metric: str = "bw_bytes",
    confidence: float = 0.95,
    cells: list[str] | None = None,
    decision_regions: dict | None = None,
    boundary: str = boundaries.DEFAULT_BOUNDARY,
    sessions: int = 1,
) -> dict:
    """Decide every cell of ``host`` from its pairs so far and write the next round's targets to
    ``out`` (workload id -> pairs wanted so far); ``budget_s`` 0: no budget, the cap bounds it.
    ``boundary``: the level of each look (:data:`luksbench.analysis.boundary.BOUNDARIES`).

    With sessions k >= 2 (the manifests' ``sessions``, or ``sessions``: the plan's, which the
    first round needs before any manifest exists) the rounds cycle the sessions, one pair
    of each continuing cell per round: a cell is looked at only after whole cycles (every
    session the same number of pairs), with the sessions interval at Bonferroni's level over
    those looks (:func:`session_look_levels`; ``boundary`` is then not used)."""
    fio = host_results(fio, host)
    sessions = max(planned_sessions(fio), sessions)
    if sessions >= 2:
        levels = session_look_levels(confidence, min_pairs, max_pairs, sessions)
        boundary = "bonferroni"
    else:
        levels = boundaries.look_levels(boundary, confidence, min_pairs, max_pairs)
    level_at = lambda n: levels[min(max(int(n), min_pairs), max_pairs)]  # noqa: E731
    comparisons = [tuple(p) for p in comparisons]
    looks = pd.DataFrame(columns=["n"])
    pair_s = pd.DataFrame(columns=["host", "workload", "rep", "seconds"])
    if len(fio):
        # a comparison with a stack that has no results (an optional stack not built) does not count
        compared = [p for p in comparisons if set(p) <= set(fio["stack"])]
        settings = {"metrics": [metric], "confidence": confidence}
        loss = stats.loss_tables(
            _at_looks(fio, level_at), compared, **settings, decision_regions=decision_regions
        )
        looks = _cell_looks(loss) if len(loss) else looks
        pair_s = device_seconds(fio, "host_dir" if "host_dir" in fio.columns else "host")
    spent = float(pair_s["seconds"].sum())
    cost = pair_s.groupby("workload")["seconds"].mean()
    measured = pair_s.groupby("workload")["rep"].max()
    flagged = flagged_reps(fio)
    remaining = budget_s - spent if budget_s > 0 else math.inf
    rules = _Design(min_pairs, max_pairs, sessions, whole_cycles(fio, sessions), metric)
    per_cell, queue = {}, []
    for w in sorted(set(cells or ()) | set(looks.index)):
        c = looks.loc[w] if w in looks.index else None
        # pairs on disk: a pair without a usable value of the metric still counts as measured;
        # one fio flagged does not (the loss table leaves it out): the next round replaces it
        cell, reserve = _cell_state(rules, w, c, int(measured.get(w, 0)), int(flagged.get(w, 0)))
        remaining -= reserve * float(cost.get(w, 0.0))  # a cycle once begun is finished
        if "why" not in cell:  # undecided between looks: another cycle while the budget lasts
            queue.append((-float(np.nan_to_num(c["closeness"], nan=0.0)), w))
        per_cell[w] = cell
    for _, w in sorted(queue):  # closest to a decision first, while the budget lasts
        cycle = float(cost.get(w, 0.0)) * sessions  # one more pair in every session
        if cycle <= remaining:
            remaining -= cycle
            per_cell[w].update(pairs=per_cell[w]["pairs"] + 1, why="continue: undecided")
        else:
            per_cell[w]["why"] = "stop: budget spent"
    for cell in per_cell.values():  # the level of the look its interval will be read at
        cell["look_confidence"] = level_at(cell["pairs"] - cell["flagged_pairs"])
    design = (min_pairs, max_pairs, boundary, levels)
    doc = _document(host, metric, comparisons, confidence, design, per_cell)
    doc.update(budget_s=budget_s, spent_s=round(spent, 1), sessions=sessions)
    doc["looks"] = _history(Path(out), per_cell)
    write_targets(Path(out), doc)
    return doc


@dataclass(frozen=True)
class _Design:
    """What a cell's state at a look depends on besides its own pairs."""

    min_pairs: int
    max_pairs: int
    sessions: int
    whole: pd.Series  # per workload: the rounds stand after a whole cycle (sessions >= 2)
    metric: str


def _cell_state(design: _Design, w: str, c, on_disk: int, bad: int) -> tuple[dict, int]:
    """(the cell's entry, pairs reserved to finish its cycle) from its look ``c`` (None: no
    interval); an entry without ``why`` is undecided and queued for the budget."""
    n = max(int(c["n"]) if c is not None else 0, on_disk - bad)
    k = design.sessions
    last = cycle_looks(design.min_pairs, design.max_pairs, k)[-1] if k >= 2 else design.max_pairs
    # with sessions one pair per round (each round one session), else the first look's at once
    start = 1 if k >= 2 else design.min_pairs - n
    cell = {"n": n, "pairs": on_disk + max(0, start if n < design.min_pairs else 0)}
    cell["flagged_pairs"] = bad
    if c is not None and n >= 2:
        cell.update(decision=c["decision"], ci_low=round(float(c["low"]), 4))
        cell.update(ci_high=round(float(c["high"]), 4))
    mid_cycle = k >= 2 and n >= design.min_pairs and not bool(design.whole.get(w, False))
    if on_disk >= 2 * design.max_pairs and n < last:  # replacements are bounded too
        cell.update(pairs=on_disk, why=f"stop: {bad} of {on_disk} pairs flagged by fio")
    elif n < design.min_pairs:
        cell["why"] = f"continue: {n} of min_pairs {design.min_pairs} pairs"
    elif mid_cycle:
        cell.update(pairs=on_disk + 1, why=f"continue: within a cycle of {k} sessions")
        return cell, -n % k
    elif c is None:
        cell["why"] = f"stop: no usable pairs of {design.metric}"
    elif not c["undecided"]:
        cell["why"] = f"stop: decided ({c['decision']})"
    elif n >= last:
        cell["why"] = f"stop: undecided at max_pairs {design.max_pairs}"
    return cell, 0


def _at_looks(fio: pd.DataFrame, level_at) -> pd.DataFrame:
    """``fio`` with each cell's look level at the pairs it has now (the design columns the loss
    table reads, as ingest writes them from targets.json)."""
    n = fio["workload"].map(usable_reps(fio))
    return fio.assign(target_pairs=n.astype(float), look_confidence=n.map(level_at).astype(float))


def fixed_design(table: pd.DataFrame, fio: pd.DataFrame, *settings, **options) -> pd.DataFrame:
    """:data:`FIXED_COLUMNS` of every row of the loss table ``table``, filled in sequential cells;
    ``settings``/``options``: the loss table's, as for :func:`stats.loss_tables`."""
    keys, cell = [*CELL_KEYS, "metric", "baseline", "variant"], ["host", "workload"]
    seq = table["interval"].eq("sequential").to_numpy()
    found = pd.DataFrame(columns=FIXED_COLUMNS)
    if seq.any():
        rows = table.loc[seq, keys]
        fio = fio.merge(rows[cell].drop_duplicates(), on=cell)
        first = fio[fio["rep"] <= FIXED_PAIRS].drop(columns="look_confidence")
        pairs = list(dict.fromkeys(zip(rows["baseline"], rows["variant"], strict=True)))
        fixed = stats.loss_tables(first, pairs, *settings, **options)[[*keys, "decision", "n"]]
        spent = {
            c: device_seconds(f).groupby(cell)["seconds"].sum()
            for c, f in (("device_seconds", fio), ("fixed3_seconds", first))
        }
        found = rows.merge(fixed, on=keys, how="left").join(pd.DataFrame(spent), on=cell)
        found = found.rename(columns={"decision": "fixed3_decision", "n": "fixed3_pairs"})
        found.index = table.index[seq]
    found = found[FIXED_COLUMNS].reindex(table.index).fillna({"fixed3_decision": ""})
    return found.astype({c: float for c in FIXED_COLUMNS} | {"fixed3_decision": "string"})


def _document(host, metric, comparisons, confidence, design, per_cell):
    min_pairs, max_pairs, boundary, levels = design
    return {
        "kind": KIND,
        "method": (
            "sequential: looks at min_pairs..max_pairs pairs, one per round; paired t-interval "
            f"at the level of the {boundary} boundary at that look (look_levels: pairs -> level; "
            "all K = max_pairs - min_pairs + 1 looks of a cell hold together at the confidence: "
            "valid at any stopping time), widened by the drift of d the loss table finds; a "
            "cell stops when every row of the metric is decided by magnitude, at max_pairs, or "
            "when the budget is spent; with sessions k >= 2 the rounds cycle the sessions, "
            "looks only after whole cycles, each the sessions interval (or the pairs' "
            "drift-widened one where wider) at Bonferroni's level over the whole-cycle looks"
        ),
        "boundary": boundary,
        "look_levels": {str(n): level for n, level in levels.items()},
        "host": host,
        "metric": metric,
        "baseline": comparisons[0][0],
        "variants": sorted({v for _, v in comparisons}),
        "comparisons": [list(p) for p in comparisons],
        "confidence": confidence,
        "look_confidence": levels[max_pairs],
        "min_pairs": min_pairs,
        "max_pairs": max_pairs,
        "pairs": {w: c["pairs"] for w, c in per_cell.items()},
        "noisy": [w for w, c in per_cell.items() if c["why"].startswith("stop: undecided")],
        "done": all(c["why"].startswith("stop") for c in per_cell.values()),
        "cells": per_cell,
    }


def _history(out: Path, per_cell: dict) -> list[dict]:
    """The looks so far (from the previous targets file) and this one, when it saw new pairs."""
    looks = read_looks(out)
    seen = {w: c["n"] for w, c in per_cell.items()}
    if not looks or {w: c["n"] for w, c in looks[-1]["cells"].items()} != seen:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        looks.append({"at": stamp, "cells": per_cell})
    return looks
