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
from luksbench.formats.envdoc import parse_env_json

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
TUNING_COLUMNS += ["fio_bound", "cpu_saturated", *(f"ceiling_{c}" for c in _SHOWN)]


def settings(reference: str, comparisons) -> list[str]:
    """The stacks config ``analysis.comparisons`` compares with ``reference``."""
    return [c["variant"] for c in parse(comparisons) if c["baseline"] == reference]


def plans(env: pd.DataFrame) -> dict[str, dict]:
    """host -> the plan its env.json records ({} without one)."""
    return {r.host: parse_env_json(r.env_json).get("plan") or {} for r in env.itertuples()}


def unapplied(asked: dict, desc: dict) -> list[str]:
    """What of the luks settings the plan ``asked`` for a stack its description ``desc`` does not
    show applied (a perf flag: by cryptsetup and in the dm table)."""
    luks = desc.get("layers") or {}
    while isinstance(luks, dict) and luks.get("kind") not in (None, "luks"):
        luks = luks.get("over")
    luks = luks if isinstance(luks, dict) else {}
    table, skipped = (luks.get("dm_table") or "").split(), luks.get("perf_flags_skipped") or {}
    out = []
    for flag in asked.get("perf_flags") or []:
        if flag not in (desc.get("perf_flags") or []) or (table and flag not in table):
            why = skipped.get(flag) or (
                "not in the dm table" if table else "not recorded as applied"
            )
            out.append(f"perf flag {flag} not applied: {why}")
    keys = [k for k in ("sector_size", "cipher", "key_bits") if k in asked]
    return out + [
        f"{k} {desc.get(k)}, plan asked {asked[k]}" for k in keys if desc.get(k) != asked[k]
    ]


def not_applied(stacks: pd.DataFrame, plans: dict[str, dict]) -> dict[tuple[str, str], str]:
    """(host, stack) -> why the arm does not measure its setting: not built, or :func:`unapplied`."""
    out = {}
    for row in stacks.itertuples():
        asked = (plans.get(row.host, {}).get("stacks") or {}).get(row.stack) or {}
        why = unapplied(asked, parse_env_json(row.description_json))
        why = [f"not built: {row.reason}"] if not row.available else why
        if why:
            out[(row.host, row.stack)] = "; ".join(why)
    return out


def _rows(loss: pd.DataFrame, plans: dict[str, dict]) -> pd.DataFrame:
    """The loss rows the table reads: each metric in the cells where it answers the question."""
    fixed = {
        h: {n for n, p in (p.get("patterns") or {}).items() if (p or {}).get("rate_pct")}
        for h, p in plans.items()
    }
    rows = loss[loss["metric"].isin(TUNING_METRICS)]
    at_rate = [p in fixed.get(h, set()) for h, p in zip(rows["host"], rows["pattern"], strict=True)]
    per_io = rows["metric"].eq("busy_cpu_us_per_io").to_numpy()
    return rows[per_io == pd.Series(at_rate, dtype=bool).to_numpy()]


def family_decisions(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` of the loss table with their intervals at the Bonferroni level of their family
    (the rows with an interval) and decided on them; the point estimates stay."""
    stein, two_level = rows["interval"].eq("stein"), rows["interval"].eq("sessions")
    n_eff = rows["sessions"].where(two_level, rows["n"]).astype(float)
    sd = rows["pilot_sd_log_ratio"].where(stein, rows["sd_log_ratio"]).astype(float)
    df = rows["pilot_pairs"].where(stein, n_eff).astype(float) - 1  # Stein: the pilot's n0 - 1
    if "interval_df" in rows:  # the df each interval rests on (moderated sessions: d0 + k - 1)
        df = rows["interval_df"].astype(float).fillna(df)
    # effect % = sign * (ratio - 1) * 100: a loss for throughput, an increase otherwise
    sign = np.where(rows["higher_is_better"].astype(bool), -1.0, 1.0)
    bounds = np.log1p(sign[:, None] * rows[["ci_low", "ci_high"]].to_numpy(float) / 100)
    decided = np.isfinite(bounds).all(axis=1)
    half, level = stats.bonferroni(
        np.abs(bounds[:, 1] - bounds[:, 0]) / 2, sd / np.sqrt(n_eff), df, int(decided.sum())
    )
    mean = rows["mean_log_ratio"].to_numpy(float)
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


def tuning_table(loss, stacks, env, reference: str, ceiling: str, comparisons) -> pd.DataFrame:
    """The rows of :data:`TUNING_COLUMNS` (module doc); empty when the run has no tuning arms."""
    wanted = settings(reference, comparisons)
    if not wanted or loss.empty:
        return pd.DataFrame(columns=TUNING_COLUMNS)
    run_plans = plans(env)
    skipped = not_applied(stacks, run_plans)
    rows = _rows(loss, run_plans)
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
