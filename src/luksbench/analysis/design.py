"""Adaptive repetitions, two-stage (Stein): spend device time where the noise is.

Stage 1 (pilot): every cell runs ``pilot_pairs`` (n0) pairs; from them alone each cell gets its
target N (:func:`luksbench.analysis.stats.stein_pairs` on the largest pilot SD of d over the
cell's directions, jobs and comparisons). Stage 2 tops every cell up to its N; no further look at
the data. Cells over ``max_pairs``, or without n0 usable pilot pairs, stop at the cap: *noisy*,
with an honest but wider interval. The loss table gives these cells Stein's interval. N counts
unflagged pairs: after stage 2 each pair fio flagged is measured again
(:mod:`luksbench.analysis.remeasure`, ``remeasure_flagged_max``), so a cell ends with its N usable
pairs as far as that cap allows.
``luksbench targets`` and the workflow's ``plan_repetitions`` rule both call :func:`write_design_targets`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from luksbench.analysis import stats
from luksbench.formats.targets import write_targets as write_targets_document

TARGETS_KIND = "luksbench adaptive repetitions targets v1"


def _pilot_sds(
    fio: pd.DataFrame, baseline: str, variant: str, metric: str, pilot_pairs: int
) -> dict[tuple[str, str], float]:
    """(host, workload) -> largest pilot SD of d over the cell's directions/jobs (NaN: incomplete)."""
    pilot = fio[fio["rep"] <= pilot_pairs]
    paired = stats.pair_values(pilot, baseline, variant, [metric])
    out: dict[tuple[str, str], float] = {}
    for (host, workload), cell in paired.groupby(["host", "workload"], sort=True):
        sds = []
        for _, g in cell.groupby(["job_slot", "direction"], sort=True):
            b, v = g["baseline_value"].to_numpy(float), g["variant_value"].to_numpy(float)
            # a pair fio flagged is left out of the loss table, so of the pilot too: a cell
            # with one has fewer than n0 usable pilot pairs and goes to the cap
            ok = stats.usable_pairs(b, v) & ~g[list(stats.REP_FLAGS)].any(axis=1).to_numpy()
            sds.append(
                float(np.log(v[ok] / b[ok]).std(ddof=1)) if ok.sum() == pilot_pairs else math.nan
            )
        out[(str(host), str(workload))] = math.nan if any(map(math.isnan, sds)) else max(sds)
    return out


def pilot_targets(
    fio: pd.DataFrame,
    baseline: str,
    variants: list[str],
    *,
    metric: str = "bw_bytes",
    pilot_pairs: int = 4,
    target_half_width_pct: float = 2.0,
    max_pairs: int = 12,
    confidence: float = 0.95,
    cells: list[str] | None = None,
    comparisons: list[tuple[str, str]] | None = None,
) -> dict[str, dict]:
    """Per host, the targets document from the pilot pairs of a fio table.

    ``cells``: workload ids the plan measures (a cell missing from the pilot gets the cap).
    ``comparisons``: the (baseline, variant) pairs whose pilot SDs count (default every stack of
    ``variants`` against ``baseline``), but for those with a stack without pilot results."""
    stats.higher_is_better(metric)
    compared = list(comparisons) if comparisons else [(baseline, v) for v in variants]
    measured = set(fio["stack"].dropna()) if len(fio) else set()
    compared = [p for p in compared if set(p) <= measured]
    sds: dict[tuple[str, str], float] = {}
    for pair_baseline, variant in compared:
        for key, sd in _pilot_sds(fio, pair_baseline, variant, metric, pilot_pairs).items():
            old = sds.get(key, -math.inf)
            sds[key] = math.nan if (math.isnan(sd) or math.isnan(old)) else max(old, sd)
    hosts = {h for h, _ in sds} | (set(fio["host"].dropna().astype(str)) if len(fio) else set())
    docs = {}
    for host in sorted(hosts):
        workloads = sorted({w for h, w in sds if h == host} | set(cells or ()))
        sd = np.array([sds.get((host, w), math.nan) for w in workloads], dtype=float)
        design = (pilot_pairs, target_half_width_pct, max_pairs, confidence)
        pairs, required, capped = map(np.atleast_1d, stats.stein_pairs(sd, *design))
        per_cell = {
            w: {
                "pairs": int(n),
                "pilot_sd_log_ratio": None if math.isnan(s) else round(float(s), 6),
                "required_pairs": round(float(r), 3) if math.isfinite(r) else None,
                "capped": bool(c),
            }
            for w, s, n, r, c in zip(workloads, sd, pairs, required, capped, strict=True)
        }
        docs[host] = {
            "kind": TARGETS_KIND,
            "method": (
                "Stein two-stage: N = min(max_pairs, max(n0, ceil((t_{1-alpha/2,n0-1} s / "
                "h)^2))), s = pilot SD of ln(variant/baseline) (largest over directions, jobs and "
                "comparisons), h = ln(1 + target_half_width_pct/100); no further looks after the "
                "pilot. Interval of these cells (Stein): mean of all N pairs +- t_{n0-1} s0 / "
                "sqrt(N), s0 = the SD of the cell's n0 pilot pairs"
            ),
            "host": host,
            "metric": metric,
            "baseline": baseline,
            "variants": list(variants),
            "comparisons": [list(p) for p in compared],
            "confidence": confidence,
            "pilot_pairs": pilot_pairs,
            "max_pairs": max_pairs,
            "target_half_width_pct": target_half_width_pct,
            "half_width_log": stats.half_width_log(target_half_width_pct),
            "t_quantile": float(stats._t_quantile(confidence, pilot_pairs - 1)),
            "pairs": {w: c["pairs"] for w, c in per_cell.items()},
            "noisy": [w for w, c in per_cell.items() if c["capped"]],
            "cells": per_cell,
        }
    return docs


def write_design_targets(
    fio: pd.DataFrame,
    host: str,
    out: Path,
    *,
    baseline: str,
    variants: list[str],
    adaptive: dict,
    confidence: float = 0.95,
    cells: list[str] | None = None,
    log: Path | None = None,
    comparisons: list[tuple[str, str]] | None = None,
) -> dict:
    """Compute the targets of one host from its pilot (``fio``: the run's fio table, strict ingest)
    and write them as JSON to ``out``; a readable summary goes to ``log``. ``adaptive``: the
    validated config's (or the command line's) metric, pilot_pairs, target_half_width_pct and
    max_pairs, every one given: the schema holds their defaults."""
    docs = pilot_targets(
        fio[fio["host"] == host],
        baseline,
        variants,
        metric=adaptive["metric"],
        pilot_pairs=int(adaptive["pilot_pairs"]),
        target_half_width_pct=float(adaptive["target_half_width_pct"]),
        max_pairs=int(adaptive["max_pairs"]),
        confidence=confidence,
        cells=cells,
        comparisons=comparisons,
    )
    if host not in docs:
        raise ValueError(f"no pilot data for host {host!r}")
    doc = docs[host]
    out = Path(out)
    write_targets_document(out, doc)
    if log is not None:
        lines = [
            f"{w}: pilot sd {c['pilot_sd_log_ratio']}, requires {c['required_pairs']} pairs -> "
            f"{c['pairs']}{' (cap: noisy)' if c['capped'] else ''}"
            for w, c in doc["cells"].items()
        ]
        total = sum(doc["pairs"].values())
        lines.append(f"{total} pairs in all ({len(doc['noisy'])} noisy cells); wrote {out}")
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("\n".join(lines) + "\n")
    return doc
