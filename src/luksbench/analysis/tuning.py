"""Which dm-crypt settings pay off on this box: the tuning arms of a run, ranked (``tuning.parquet``).

A run has tuning arms when ``analysis.comparisons`` compares stacks with the headline variant
(``analysis.variant``, the reference: the LUKS2 default in config/studies/tune-dmcrypt.yaml);
each such stack is a setting. Per setting, metric and cell the table keeps the loss table's
effect, interval and decision by magnitude against the reference and, beside it, against the
ceiling (the top-level ``baseline``, the device without dm-crypt). Metrics: throughput and p99
latency in the cells at full speed, CPU per I/O at equal load in the cells of fixed-rate patterns
(``rate_pct``, read from the plan in env.json). The rank orders the settings by their decisions
against the reference (material gain +2, moderate gain +1, moderate cost -1, material cost -2,
summed over the rows); a setting the box did not apply (a perf flag, a sector size skipped with
its reason) or could not build is listed with ``not_applied`` and never ranked.
"""

from __future__ import annotations

import json

import pandas as pd

from luksbench.analysis.contrasts import parse

#: metric -> what the paper calls it, in the order it lists them
TUNING_METRICS = {
    "bw_bytes": "throughput",
    "clat_p99_ns": "p99 latency",
    "busy_cpu_us_per_io": "CPU per I/O at equal load",
}
SCORES = {"material gain": 2, "moderate gain": 1, "moderate": -1, "material": -2}
_KEYS = ["host", "workload", "direction", "metric"]
_SHOWN = ["effect_pct", "ci_low", "ci_high", "decision"]
TUNING_COLUMNS = ["host", "setting", "reference", "ceiling", "rank", "score", "n_gains"]
TUNING_COLUMNS += ["n_costs", "n_undecided", "not_applied", "metric", "metric_label", "workload"]
TUNING_COLUMNS += ["direction", "pattern", "effect_pct", "ci_low", "ci_high", "decision"]
TUNING_COLUMNS += [f"ceiling_{c}" for c in _SHOWN]


def settings(reference: str, comparisons) -> list[str]:
    """The stacks config ``analysis.comparisons`` compares with ``reference``."""
    return [c["variant"] for c in parse(comparisons) if c["baseline"] == reference]


def not_applied(stacks: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(host, stack) -> why the arm does not measure its setting: not built, or a setting the
    backend skipped (its notes: "perf flag ... skipped: ...", "... plan asked 4096")."""
    out = {}
    for row in stacks.itertuples():
        notes = json.loads(row.description_json).get("notes") or []
        why = [n for n in notes if "skipped" in n or "plan asked" in n]
        why = [f"not built: {row.reason}"] if not row.available else why
        if why:
            out[(row.host, row.stack)] = "; ".join(why)
    return out


def fixed_rate_patterns(env: pd.DataFrame) -> dict[str, set[str]]:
    """host -> the patterns its plan runs at a fixed rate (CPU per I/O at equal load)."""
    out = {}
    for row in env.itertuples():
        patterns = (json.loads(row.env_json).get("plan") or {}).get("patterns") or {}
        out[row.host] = {n for n, p in patterns.items() if (p or {}).get("rate_pct")}
    return out


def _rows(loss: pd.DataFrame, fixed: dict[str, set[str]]) -> pd.DataFrame:
    """The loss rows the ranking reads: each metric in the cells where it answers the question."""
    rows = loss[loss["metric"].isin(TUNING_METRICS)]
    at_rate = [p in fixed.get(h, set()) for h, p in zip(rows["host"], rows["pattern"], strict=True)]
    per_io = rows["metric"].eq("busy_cpu_us_per_io").to_numpy()
    return rows[per_io == pd.Series(at_rate, dtype=bool).to_numpy()]


def tuning_table(loss, stacks, env, reference: str, ceiling: str, comparisons) -> pd.DataFrame:
    """The rows of :data:`TUNING_COLUMNS` (module doc); empty when the run has no tuning arms."""
    wanted = settings(reference, comparisons)
    if not wanted or loss.empty:
        return pd.DataFrame(columns=TUNING_COLUMNS)
    rows = _rows(loss, fixed_rate_patterns(env))
    against = rows[rows["baseline"] == reference]
    vs_ceiling = rows[rows["baseline"] == ceiling][[*_KEYS, "variant", *_SHOWN]]
    vs_ceiling = vs_ceiling.rename(columns={c: f"ceiling_{c}" for c in _SHOWN})
    vs_ceiling = vs_ceiling.rename(columns={"variant": "setting"})
    table = against[against["variant"].isin(wanted)].rename(columns={"variant": "setting"})
    table = table.merge(vs_ceiling, on=[*_KEYS, "setting"], how="left")
    skipped = not_applied(stacks)
    hosts = sorted(set(loss["host"]))
    missing = [
        {"host": h, "setting": s}
        for h in hosts
        for s in wanted
        if not ((table["host"] == h) & (table["setting"] == s)).any()
    ]
    table = pd.concat([table, pd.DataFrame(missing, columns=["host", "setting"])])
    table["not_applied"] = [
        skipped.get((h, s), "no results" if pd.isna(m) else "")
        for h, s, m in zip(table["host"], table["setting"], table["metric"], strict=True)
    ]
    table["score"] = table["decision"].map(SCORES).fillna(0).astype(int)
    decided = table.groupby(["host", "setting"])["decision"]
    table["n_gains"] = decided.transform(lambda d: d.str.endswith("gain").sum())
    table["n_costs"] = decided.transform(lambda d: d.isin(["moderate", "material"]).sum())
    table["n_undecided"] = decided.transform(lambda d: d.str.startswith("undecided").sum())
    table["score"] = table.groupby(["host", "setting"])["score"].transform("sum")
    ranked = table["not_applied"].eq("")
    score = table["score"].where(ranked)
    table["rank"] = (
        score.groupby(table["host"]).rank(method="dense", ascending=False).astype("Int64")
    )
    table = table.assign(reference=reference, ceiling=ceiling)
    table["metric_label"] = table["metric"].map(TUNING_METRICS)
    order = table["metric"].map({m: i for i, m in enumerate(TUNING_METRICS)})
    table = table.assign(_order=order).sort_values(
        ["host", "rank", "setting", "_order", "workload"]
    )
    return table.reindex(columns=TUNING_COLUMNS).reset_index(drop=True)
