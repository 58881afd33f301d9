"""Which dm-crypt settings pay off on this box: the tuning arms of a run (``tuning.parquet``).

Each stack ``analysis.comparisons`` compares with the headline variant (the reference, e.g. the
LUKS2 default in config/studies/tune-dmcrypt.yaml) is a setting. Per setting, metric and cell:
the effect against the reference and, beside it, the row against the ceiling (the top-level
``baseline``). Throughput and p99 latency in the cells at full speed, CPU per I/O at equal load
in the cells of fixed-rate patterns. The rows against the reference are one Bonferroni family
(:func:`family_decisions`); a setting is ``recommended`` with at least one gain and no cost, else
``costs``, ``undecided`` or ``no measured benefit``, and ``not measured`` when the box did not
apply or build it (:func:`not_applied`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from luksbench.analysis import stats
from luksbench.analysis.contrasts import parse

#: metric -> what the paper calls it, in the order it lists them
TUNING_METRICS = {
    "bw_bytes": "throughput",
    "clat_p99_ns": "p99 latency",
    "busy_cpu_us_per_io": "CPU per I/O at equal load",
}
#: a setting's recommendation, in the order the paper lists them
RECOMMENDATIONS = ("recommended", "undecided", "no measured benefit", "costs", "not measured")
_KEYS = ["host", "workload", "direction", "metric"]
_SHOWN = ["effect_pct", "ci_low", "ci_high", "decision"]
TUNING_COLUMNS = ["host", "setting", "reference", "ceiling", "recommendation", "rank", "n_gains"]
TUNING_COLUMNS += ["n_costs", "n_undecided", "not_applied", "metric", "metric_label", "workload"]
TUNING_COLUMNS += ["direction", "pattern", "effect_pct", "ci_low", "ci_high", "decision"]
TUNING_COLUMNS += ["n_decisions", "row_confidence", "family_confidence"]
TUNING_COLUMNS += ["decision_lower_pct", "decision_upper_pct"]
TUNING_COLUMNS += ["fio_bound", "cpu_saturated", *(f"ceiling_{c}" for c in _SHOWN)]


def settings(reference: str, comparisons) -> list[str]:
    """The stacks config ``analysis.comparisons`` compares with ``reference``."""
    return [c["variant"] for c in parse(comparisons) if c["baseline"] == reference]


def planned_settings(plan_stacks: pd.DataFrame, perf_flags: pd.DataFrame) -> dict[str, dict]:
    """host -> {stack: the luks settings its plan asked for on the top layer: ``cipher``,
    ``key_bits``, ``sector_size`` (where asked) and ``perf_flags`` (a list)} from the
    ``plan_stacks`` and ``perf_flags`` tables."""
    out: dict[str, dict] = {}
    keys = ["cipher", "key_bits", "sector_size"]
    for row in plan_stacks.reindex(columns=["host", "stack", *keys]).itertuples(index=False):
        asked = {k: v for k, v in zip(keys, row[2:], strict=True) if not pd.isna(v)}
        out.setdefault(row.host, {})[row.stack] = asked | {"perf_flags": []}
    flags = perf_flags.reindex(columns=["host", "stack", "flag", "planned"])
    for row in flags[flags["planned"].astype("boolean").fillna(False)].itertuples(index=False):
        out.setdefault(row.host, {}).setdefault(row.stack, {"perf_flags": []})
        out[row.host][row.stack]["perf_flags"].append(row.flag)
    return out


def _value(x):
    return None if pd.isna(x) else x


def unapplied(asked: dict, built: dict, flags: pd.DataFrame) -> list[str]:
    """What of the luks settings the plan ``asked`` for a stack its row of the stacks table
    (``built``) and its rows of the perf_flags table (``flags``) do not show applied (a perf
    flag: by cryptsetup and, where a dm table is recorded, in it)."""
    out = []
    by_flag = {r.flag: r for r in flags.itertuples(index=False)}
    for flag in asked.get("perf_flags") or []:
        row = by_flag.get(flag)
        applied = row is not None and _value(row.applied) is not None and bool(row.applied)
        in_table = None if row is None or _value(row.in_dm_table) is None else bool(row.in_dm_table)
        if not applied or in_table is False:
            why = None if row is None else _value(row.skipped_reason)
            why = why or (
                "not in the dm table" if in_table is not None else "not recorded as applied"
            )
            out.append(f"perf flag {flag} not applied: {why}")
    keys = [k for k in ("sector_size", "cipher", "key_bits") if k in asked]
    return out + [
        f"{k} {_value(built.get(k))}, plan asked {asked[k]}"
        for k in keys
        if _value(built.get(k)) != asked[k]
    ]


def not_applied(
    stacks: pd.DataFrame, planned: dict[str, dict], perf_flags: pd.DataFrame
) -> dict[tuple[str, str], str]:
    """(host, stack) -> why the arm does not measure its setting: not built, or :func:`unapplied`
    (``planned``: :func:`planned_settings`)."""
    out = {}
    flags = perf_flags.reindex(columns=["host", "stack", "flag", "applied", "in_dm_table"])
    flags["skipped_reason"] = perf_flags.get("skipped_reason")
    by_stack = dict(list(flags.groupby(["host", "stack"])))
    empty = flags.iloc[:0]
    for row in stacks.to_dict("records"):
        host, stack = row["host"], row["stack"]
        asked = planned.get(host, {}).get(stack) or {}
        why = unapplied(asked, row, by_stack.get((host, stack), empty))
        why = [f"not built: {row['reason']}"] if not row["available"] else why
        if why:
            out[(host, stack)] = "; ".join(why)
    return out


def _rows(loss: pd.DataFrame, patterns: pd.DataFrame) -> pd.DataFrame:
    """The loss rows the table reads: each metric in the cells where it answers the question."""
    fixed = patterns.reindex(columns=["host", "pattern", "rate_pct"]).dropna(subset=["rate_pct"])
    fixed = set(zip(fixed["host"], fixed["pattern"], strict=True))
    rows = loss[loss["metric"].isin(TUNING_METRICS)]
    at_rate = [(h, p) in fixed for h, p in zip(rows["host"], rows["pattern"], strict=True)]
    per_io = rows["metric"].eq("busy_cpu_us_per_io").to_numpy()
    return rows[per_io == pd.Series(at_rate, dtype=bool).to_numpy()]


def family_decisions(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` of the loss table with their intervals at the Bonferroni level of their family
    (the rows with an interval) and decided on them; the point estimates stay."""
    scales = stats.interval_scales(rows)
    decided = np.isfinite(scales["half"]).to_numpy()
    half, level = stats.bonferroni(scales["half"], scales["se"], scales["df"], int(decided.sum()))
    mean, sign = scales["mean"].to_numpy(float), scales["sign"].to_numpy(float)
    ends = sign[:, None] * np.expm1(np.stack([mean - half, mean + half], axis=1)) * 100
    out = rows.assign(ci_low=ends.min(axis=1), ci_high=ends.max(axis=1), row_confidence=level)
    margins = out[["ci_low", "ci_high", "decision_lower_pct", "decision_upper_pct"]]
    out["decision"] = [stats.decision(*r) for r in margins.to_numpy(float).tolist()]
    return out.assign(n_decisions=int(decided.sum()), family_confidence=rows["confidence"])


def _recommend(table: pd.DataFrame) -> pd.DataFrame:
    """Per (host, setting): its counts of gains, costs and undecided rows, its recommendation,
    and the rank of the recommended ones (more gains first)."""
    d = table["decision"].fillna("")
    table = table.assign(
        n_gains=d.str.endswith("gain"),
        n_costs=d.isin(["moderate", "material"]),
        n_undecided=d.str.startswith("undecided") | d.eq("insufficient"),
    )
    counts = ["n_gains", "n_costs", "n_undecided"]
    table[counts] = table.groupby(["host", "setting"])[counts].transform("sum").astype(int)
    rec = np.select(
        [
            table["not_applied"].ne(""),
            table["n_costs"] > 0,
            table["n_gains"] > 0,
            table["n_undecided"] > 0,
        ],
        ["not measured", "costs", "recommended", "undecided"],
        "no measured benefit",
    )
    gains = table["n_gains"].where(rec == "recommended")
    rank = gains.groupby(table["host"]).rank(method="dense", ascending=False)
    return table.assign(recommendation=rec, rank=rank.astype("Int64"))


def tuning_table(loss, tables: dict, reference: str, ceiling: str, comparisons) -> pd.DataFrame:
    """The rows of :data:`TUNING_COLUMNS` (module doc) from the loss table and the processed
    tables (``stacks``, ``plan_stacks``, ``perf_flags``, ``patterns`` by name; a missing one:
    empty); empty when the run has no tuning arms."""
    wanted = settings(reference, comparisons)
    if not wanted or loss.empty:
        return pd.DataFrame(columns=TUNING_COLUMNS)
    stacks, plan_stacks, flags, patterns = (
        tables.get(name, pd.DataFrame(columns=columns))
        for name, columns in (
            ("stacks", ["host", "stack", "available", "reason"]),
            ("plan_stacks", ["host", "stack"]),
            ("perf_flags", ["host", "stack", "flag", "planned"]),
            ("patterns", ["host", "pattern", "rate_pct"]),
        )
    )
    skipped = not_applied(stacks, planned_settings(plan_stacks, flags), flags)
    rows = _rows(loss, patterns)
    vs_ceiling = rows[rows["baseline"] == ceiling][[*_KEYS, "variant", *_SHOWN]]
    vs_ceiling = vs_ceiling.rename(columns={c: f"ceiling_{c}" for c in _SHOWN})
    vs_ceiling = vs_ceiling.rename(columns={"variant": "setting"})
    table = rows[(rows["baseline"] == reference) & rows["variant"].isin(wanted)]
    table = table.rename(columns={"variant": "setting"})
    applied = [(h, s) not in skipped for h, s in zip(table["host"], table["setting"], strict=True)]
    table = pd.concat([family_decisions(table[applied]), table[~np.array(applied, bool)]])
    table = table.merge(vs_ceiling, on=[*_KEYS, "setting"], how="left")
    missing = [
        {"host": h, "setting": s}
        for h in sorted(set(loss["host"]))
        for s in wanted
        if not ((table["host"] == h) & (table["setting"] == s)).any()
    ]
    table = pd.concat(
        [table, pd.DataFrame(missing, columns=["host", "setting"])], ignore_index=True
    )
    table["not_applied"] = [
        skipped.get((h, s), "no results" if pd.isna(m) else "")
        for h, s, m in zip(table["host"], table["setting"], table["metric"], strict=True)
    ]
    flags = ["fio_bound", "cpu_saturated"]
    table[flags] = table[flags].astype("boolean").fillna(False).astype(bool)
    table = _recommend(table).assign(reference=reference, ceiling=ceiling)
    table["metric_label"] = table["metric"].map(TUNING_METRICS)
    order = table["metric"].map({m: i for i, m in enumerate(TUNING_METRICS)})
    listed = table["recommendation"].map({r: i for i, r in enumerate(RECOMMENDATIONS)})
    table = table.assign(_order=order, _listed=listed)
    table = table.sort_values(["host", "rank", "_listed", "setting", "_order", "workload"])
    return table.reindex(columns=TUNING_COLUMNS).reset_index(drop=True)
