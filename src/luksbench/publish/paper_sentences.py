"""The paper's sentences: the TL;DR, the recommendation, several hosts, what the intervals
cover, the sequential design, order effects. Every number a sentence quotes is read from a
processed table (the TL;DR's from ``paper_numbers.parquet``, written by the loss stage); the
wording is here."""

from __future__ import annotations

import re
from functools import partial

import pandas as pd

from luksbench.analysis.contrasts import Pair, comparison_pairs, label
from luksbench.analysis.paper_numbers import (
    DECIDED,
    NUMBERS_TABLE,
    decision_tally,
    notes,
    paper_numbers,
    quoted_rows,
)
from luksbench.analysis.stats import METRIC_FAMILIES
from luksbench.publish.recommend import paper_recommendation
from luksbench.publish.run import Run
from luksbench.publish.text import (
    cell_words,
    cpu_basis,
    decision_words,
    effect_ci,
    fmt_ci,
    fmt_num,
    fmt_pct,
    metric_heading,
    multi_job,
    sorted_metrics,
)


def margins(rows: pd.DataFrame) -> str:
    """``5 / 20 %``: the decision margins of a metric's rows, as the loss table records them."""
    lower, upper = rows["decision_lower_pct"].iloc[0], rows["decision_upper_pct"].iloc[0]
    return f"{fmt_num(lower, 0)} / {fmt_num(upper, 0)} %"


def decision_counts(rows: pd.DataFrame) -> str:
    """``2 material, 1 moderate, 3 undecided, 2 withheld (too few I/Os)``: the rows' decisions,
    worst first (:func:`~luksbench.analysis.paper_numbers.decision_tally`)."""
    return _counts_text(decision_tally(rows))


def _counts_text(tally) -> str:
    return ", ".join(f"{count} {kind}" for kind, count in tally)


def _decision_sentence(
    family: pd.DataFrame, loss: pd.DataFrame, describe, cpu_words: str | None = None
) -> str:
    """How a metric's cells fall into its regions and, where some cost, the largest effect with
    its selection-adjusted interval and, where it differs, the decision of the cell's own interval
    (the one the tables list): the numbers from paper_numbers.parquet (``family``: one metric of
    one comparison), the words (which cell, what it is called) from the loss row each number
    names (``source_row``). ``cpu_words``: what the CPU metrics measure (:func:`cpu_measures`)."""
    value = _values(family)
    first = _source(family, "cells", loss, "margin_lower_pct")
    metric, kind = str(first["metric"]), str(first["effect"])
    name = sentence_start(metric_heading(metric))
    counts = family[family["quantity"].eq("count")]
    tally = [(k, int(v)) for k, v in zip(counts["label"], counts["value"], strict=True)]
    margins = f"{fmt_num(value['margin_lower_pct'], 0)} / {fmt_num(value['margin_upper_pct'], 0)} %"
    # what a CPU metric measures goes after the margins, not inside the metric's name
    measures = f"; {cpu_words}" if cpu_words else ""
    text = (
        f"{name} {kind} ({margins} margins{measures}): {_counts_text(tally)} of "
        f"{int(value['cells'])} cells."
    )
    costs = any(kind_ in ("material", "moderate") for kind_, _ in tally)
    if costs and "largest_effect_pct" in value:
        w = _source(family, "largest", loss, "largest_effect_pct")
        ci = fmt_ci(value["largest_ci_low_pct"], value["largest_ci_high_pct"])
        text += (
            f" Largest {kind}: {describe(w)}, {fmt_pct(value['largest_effect_pct'])} {ci} "
            f"({int(value['largest_pairs'])} pairs) with the interval adjusted for picking the "
            f"largest of {int(value['family_cells'])} cells (at "
            f"{fmt_num(value['largest_confidence_pct'], 2)} %): "
            f"{_largest_decisions(w)}."
        )
    return text


def _largest_decisions(row: pd.Series) -> str:
    """The largest cell's decision on the selection-adjusted interval and, where the cell's own
    interval (the tables', the heatmap's) decides otherwise, that one too, each named."""
    adjusted, own = str(row["selection_decision"]), str(row["decision"])
    own_interval = (
        "the cell's own interval (a repeated confidence interval at the look where it stopped)"
        if row.get("interval") == "sequential"
        else "the cell's own interval"
    )
    if adjusted == own:
        return f"{decision_words(adjusted)} on it, as on {own_interval} in the tables"
    return (
        f"{decision_words(adjusted)} on it; {decision_words(own)} on {own_interval}, "
        "as the tables list it"
    )


def sentence_start(text: str) -> str:
    """``text`` fit to start a sentence: its first letter capitalised, or ``The`` before a
    symbol that is written lower-case (``p99 ...`` -> ``The p99 ...``)."""
    if re.match(r"[a-z][\d.]+\b", text):
        return f"The {text}"
    return text[:1].upper() + text[1:]


def cpu_measures(net: bool) -> str:
    """What a CPU metric of the run measures, from the fio table's ``cpu_net`` column
    (:func:`~luksbench.publish.text.cpu_net`)."""
    return f"CPU of the whole machine, {cpu_basis(net)}"


def _values(numbers: pd.DataFrame) -> dict[str, float]:
    """{quantity: value} of one family's single numbers (counts apart)."""
    single = numbers[numbers["quantity"].ne("count")]
    return dict(zip(single["quantity"], single["value"].astype(float), strict=True))


def _source(numbers: pd.DataFrame, what: str, loss: pd.DataFrame, quantity: str) -> pd.Series:
    """The loss row a number of ``numbers`` was read from; a numbers table that names a row of
    another family (written from another loss table) is refused."""
    number = numbers[numbers["quantity"].eq(quantity)].iloc[0]
    row = loss.iloc[int(number["source_row"])]
    family = ("baseline", "variant", "metric")
    if any(str(row[k]) != str(number[k]) for k in family):
        raise ValueError(
            f"{NUMBERS_TABLE}.parquet names loss row {int(number['source_row'])} for the {what} "
            f"of {number['key']}, which is another family's: re-run the loss step"
        )
    return row


def tldr_sentences(
    losses: pd.DataFrame,
    hosts: list[dict],
    matrix: dict,
    numbers: pd.DataFrame | None = None,
    cpu_net: bool | None = None,
) -> list[str]:
    """The TL;DR: per comparison, headline first; per metric the decisions by magnitude (IOPS
    rows that repeat bandwidth at a fixed block size are left out: the same test). Every number
    from ``numbers`` (paper_numbers.parquet, :func:`quoted_numbers`; None: derived from
    ``losses``), the words from the loss rows they name. ``cpu_net``: whether the CPU values are
    net of the idle baseline (the fio table's ``cpu_net``), said beside each CPU metric."""
    losses = losses.reset_index(drop=True)
    numbers = quoted_numbers(losses, numbers)
    conf = fmt_num(_values(numbers[numbers["key"].eq("confidence_pct")])["confidence_pct"], 0)
    multi_host, several_jobs = losses["host"].nunique() > 1, multi_job(losses)
    describe = partial(cell_words, multi_host=multi_host, with_job=several_jobs)
    backends = sorted({h["backend_short"] for h in hosts}) or ["an unknown backend"]
    quoted = quoted_rows(losses)
    cpu_words = None if cpu_net is None else cpu_measures(cpu_net)
    out = []
    for baseline, variant in comparison_pairs(losses):
        mine = numbers[numbers["baseline"].eq(baseline) & numbers["variant"].eq(variant)]
        lv = quoted[(quoted["baseline"] == baseline) & (quoted["variant"] == variant)]
        host_names = ", ".join(f"`{h}`" for h in sorted(lv["host"].dropna().unique()))
        cells = _values(mine[mine["quantity"].eq("comparison_cells")])["comparison_cells"]
        out.append(
            f"`{variant}` against `{baseline}` on {host_names}, "
            f"measured with {' / '.join(backends)}: {int(cells)} cells, "
            f"{matrix['reps_text']} paired repetitions each, decided on {conf} % confidence "
            "intervals."
        )
        said = False  # what the CPU metrics measure, said at the first of them
        for metric in sorted_metrics(set(mine["metric"]) - {""}):
            family = mine[mine["metric"].eq(metric)]
            cpu = METRIC_FAMILIES.get(metric) == "cpu"
            words = cpu_words if cpu and not said else None
            said = said or cpu
            out.append(_decision_sentence(family, losses, describe, words))
    return out


def quoted_numbers(losses: pd.DataFrame, numbers: pd.DataFrame | None) -> pd.DataFrame:
    """paper_numbers.parquet as read (None: derived from ``losses`` the same way the loss stage
    writes it); refused when it was written from a loss table of another length."""
    if numbers is None:
        return paper_numbers(losses)
    rows = numbers.loc[numbers["key"].eq("loss_rows"), "value"]
    if len(rows) != 1 or int(rows.iloc[0]) != len(losses):
        raise ValueError(
            f"{NUMBERS_TABLE}.parquet was written from a loss table of "
            f"{int(rows.iloc[0]) if len(rows) else 'unknown'} rows, loss.parquet has "
            f"{len(losses)}: re-run the loss step"
        )
    return numbers


def recommendation(losses: pd.DataFrame, hosts: list[dict]) -> dict:
    """The recommendation over every metric an operator pays for
    (:func:`luksbench.publish.recommend.paper_recommendation`)."""
    multi_host, several_jobs = losses["host"].nunique() > 1, multi_job(losses)
    describe = partial(cell_words, multi_host=multi_host, with_job=several_jobs)
    return paper_recommendation(losses, hosts, describe)


def host_summary(losses: pd.DataFrame, hosts: list[dict], run: str) -> dict:
    """Several hosts: what the paper says about them, and one row per host and variant (bandwidth
    loss: cells, material, median, worst material with its interval). Empty for a single host."""
    names = sorted(losses["host"].dropna().unique())
    if len(names) < 2:
        return {"present": False, "rows": []}
    facts = {h["host"]: h for h in hosts}
    rows = []
    order = {pair: k for k, pair in enumerate(comparison_pairs(losses))}
    bw = losses[losses["metric"] == "bw_bytes"]
    groups = sorted(
        bw.groupby(["host", "baseline", "variant"], sort=False),
        key=lambda kg: (kg[0][0], order.get((kg[0][1], kg[0][2]), len(order))),
    )
    for (host, baseline, variant), g in groups:
        material = g[g["decision"] == "material"]
        worst = "none material"
        if len(material):
            w = material.loc[material["effect_pct"].idxmax()]
            worst = f"{cell_words(w)}: {effect_ci(w)}"
        h = facts.get(host, {})
        rows.append(
            {"host": host, "compared": label((baseline, variant)), "cells": len(g)}
            | {"backend": h.get("backend", "n/a"), "kernel": h.get("kernel", "n/a")}
            | {"cpu": h.get("cpu_model", "n/a"), "material": len(material)}
            | {"median": fmt_pct(g["effect_pct"].median()), "worst": worst}
        )
    pair = f"`luksbench compare {run} {run} --host {names[0]}={names[1]} --out DIR`"
    coordinators = sorted({h["coordinator"] for h in hosts if h.get("coordinator")})
    what = (
        "the fio servers of a fleet run (fio client/server mode, coordinated from "
        + ", ".join(f"`{c}`" for c in coordinators)
        + "): every repetition ran on all of them at once against the same stacks, and each "
        "server's results are its own"
        if coordinators
        else "separate test boxes, each measured with its own stacks"
    )
    return {
        "present": True,
        "text": (
            f"This run has {len(names)} hosts ({', '.join(f'`{n}`' for n in names)}): {what}. "
            "Every host's stacks are compared only "
            "with that host's own baseline; pairs never cross hosts (repetition k on one host is "
            "never paired with repetition k on another). The Benjamini-Hochberg adjustment runs "
            "over the rows of all hosts together (one family per metric and comparison). Whether two hosts differ is a different "
            f"question, with its own intervals: {pair}."
        ),
        "rows": rows,
    }


def intervals_cover(losses: pd.DataFrame) -> str:
    """What the loss table's intervals cover (its ``covers`` and ``sessions`` columns), in words."""
    covers = losses.get("covers", pd.Series(dtype=str)).fillna("repetitions within one session")
    parts = []
    if (covers == "sessions").any():
        k = int(losses.loc[covers == "sessions", "sessions"].max())
        parts.append(
            f"cover sessions: each of the run's sessions (up to {k} per cell) had its own stack-up "
            "(a fresh LUKS format and key, fresh arrays, preconditioning), and the interval of a "
            "cell is a "
            "t-interval over its session means, so it includes the variation from one stack-up "
            "to the next (the loss table gives each cell's between- and within-session SD of d "
            "as variance components)"
        )
    if (covers == "repetitions within sessions").any():
        parts.append(
            "pool the pairs of a run resumed in a new stack-up (pairs never cross stack-ups): "
            "they cover repetition within those sessions, not the variation between sessions"
        )
    if (covers == "repetitions within one session").any():
        parts.append(
            "cover repetition within this run's session (one stack-up, one measuring window), "
            "not the variation between sessions or machines (config `sessions: k` measures it)"
        )
    return "; where marked otherwise they ".join(parts) if parts else "are not computed"


def interval_adjustments(losses: pd.DataFrame) -> list[str]:
    """What widened or borrowed for the intervals, from the loss table's ``drift_*`` and
    ``moderated``/``prior_df`` columns: drift of d across pairs the pairing does not cancel, and
    sessions intervals moderated across a host's cells."""
    out = []
    rho = pd.to_numeric(losses.get("drift_inflation", pd.Series(dtype=float)), errors="coerce")
    if rho.notna().any():
        widened = losses[rho > 1]
        if widened.empty:
            out.append(
                "No drift of d across pairs beyond what independent pairs give was found (lag-1 "
                "and lag-2 autocorrelation pooled over each host's cells, 1 % test): the "
                "intervals stand as computed."
            )
        else:
            pct = widened["drift_widening_pct"].astype(float)
            names = (metric_heading(m) for m in sorted_metrics(widened["metric"].unique()))
            metrics = ", ".join(n[:1].lower() + n[1:] for n in names)
            out.append(
                f"Drift the pairing does not cancel was found in {metrics} (AR(1) coefficient "
                f"{fmt_num(widened['drift_rho'].astype(float).max(), 2)} at most, pooled over "
                f"each host's cells): {len(widened)} intervals were widened for it, by "
                f"{fmt_num(pct.median(), 0)} % in the median and {fmt_num(pct.max(), 0)} % at "
                "most (column `drift_widening_pct`)."
            )
    flags = losses.get("moderated", pd.Series(False, index=losses.index))
    moderated = losses[flags.eq(True)]
    if len(moderated):
        df = pd.to_numeric(moderated["prior_df"], errors="coerce")
        finite = df[df.abs() < float("inf")]
        prior = (
            f"prior degrees of freedom {fmt_num(finite.median(), 1)} in the median"
            if len(finite)
            else "the cells share one variance"
        )
        out.append(
            f"{len(moderated)} sessions interval(s) over at most 3 sessions borrow variance from "
            f"their host's other cells of the same metric (empirical Bayes; {prior}; column "
            "`moderated`)."
        )
    return out


def sequential_design(run: Run, pairs: list[Pair]) -> dict | None:
    """The sequential design's cells (headline comparison, the first metric with sequential
    intervals): pairs, device seconds, decision and interval, and what the fixed 3-pair design
    would have decided (the loss table's :data:`FIXED_COLUMNS`); None without such cells."""
    loss = run.loss
    rows = loss[loss["interval"].eq("sequential") & loss["variant"].eq(pairs[0][1])]
    if rows.empty:
        return None
    rows = rows[rows["metric"].eq(rows["metric"].iloc[0])]
    cells = rows.groupby("workload")
    seconds, fixed_s = cells["device_seconds"].first(), cells["fixed3_seconds"].first()
    decided = rows[["decision", "fixed3_decision"]].isin(DECIDED).groupby(rows["workload"]).all()
    return {
        "level_pct": fmt_num(100 * pd.to_numeric(run.fio["look_confidence"]).max(), 2),
        "level_min_pct": fmt_num(100 * pd.to_numeric(run.fio["look_confidence"]).min(), 2),
        "metric": metric_heading(rows["metric"].iloc[0]),
        "cells": [
            {
                "cell": r["workload"],
                "pairs": int(r["n"]),
                "seconds": fmt_num(r["device_seconds"], 0),
                "ci": fmt_ci(r["ci_low"], r["ci_high"]),
                "decision": r["decision"],
                "fixed": r["fixed3_decision"],
            }
            for _, r in rows.iterrows()
        ],
        "n_cells": len(cells),
        "n_decided": int(decided["decision"].sum()),
        "seconds": fmt_num(seconds.sum(), 0),
        "per_cell": fmt_num(seconds.mean(), 0),
        "fixed_decided": int(decided["fixed3_decision"].sum()),
        "fixed_seconds": fmt_num(fixed_s.sum(), 0),
        "fixed_per_cell": fmt_num(fixed_s.mean(), 0),
    }


def order_effect_phrases(
    order: pd.DataFrame, baseline: str, variant: str, losses: pd.DataFrame | None = None
) -> list[str]:
    """The headline comparison's order effect per metric (order.parquet), in words. With the
    loss table, a metric is quoted only over cells its loss rows decide: where the order effect
    counts more cells than the table leaves unwithheld (e.g. CPU withheld as within idle noise),
    it rests on data the paper does not show and is left out (:func:`order_withheld` says so)."""
    rows = order[(order["baseline"] == baseline) & (order["variant"] == variant)]
    rows = rows[rows["n_cells"] >= 2].set_index("metric")
    if losses is not None:
        shown = _shown_cells(losses, baseline, variant)
        rows = rows[[int(r["n_cells"]) <= shown.get(m, 0) for m, r in rows.iterrows()]]
    return [
        f"{metric_heading(m)} {fmt_pct(r['order_pct'])} {fmt_ci(r['ci_low'], r['ci_high'])}"
        f" over {int(r['n_cells'])} cells"
        for m, r in rows.loc[sorted_metrics(rows.index)].iterrows()
    ]


def _shown_cells(losses: pd.DataFrame, baseline: str, variant: str) -> dict[str, int]:
    """Per metric: how many cells of a comparison the loss table decides (not withheld)."""
    rows = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
    rows = rows[notes(rows).eq("") & rows["n"].ge(2)]
    return (
        rows.drop_duplicates(["host", "workload", "job_slot", "direction", "metric"])["metric"]
        .value_counts()
        .to_dict()
    )


def order_withheld(
    order: pd.DataFrame, baseline: str, variant: str, losses: pd.DataFrame
) -> list[str]:
    """Metrics whose order effect :func:`order_effect_phrases` leaves out, with why (the loss table's
    notes of that metric)."""
    rows = order[(order["baseline"] == baseline) & (order["variant"] == variant)]
    shown = _shown_cells(losses, baseline, variant)
    mine = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
    out = []
    for metric in sorted_metrics(set(rows.loc[rows["n_cells"] >= 2, "metric"])):
        n = int(rows.loc[rows["metric"] == metric, "n_cells"].iloc[0])
        if n <= shown.get(metric, 0):
            continue
        said = notes(mine[mine["metric"] == metric])
        reasons = sorted(set(said[said.ne("")].str.split(":").str[0]))
        why = f"withheld ({', '.join(reasons)})" if reasons else "without a decision"
        decided = shown.get(metric, 0)
        out.append(
            f"{metric_heading(metric)}: not quoted, "
            + (f"all its cells are {why}" if not decided else f"its cells are partly {why}")
        )
    return out
