"""The paper's "Recommended settings for this box", from ``tuning.parquet`` (decided on the
analysis side, :mod:`luksbench.analysis.tuning`) and each setting's config in the plan (env.json):
what it changes against the reference, how an operator applies it, the versions measured."""

from __future__ import annotations

import pandas as pd

from luksbench.analysis.contrasts import comparison_pairs, label
from luksbench.analysis.tuning import TUNING_METRICS, planned_settings
from luksbench.publish.text import (
    decision_kind,
    decision_words,
    effect_ci,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_text,
    limits,
    metric_heading,
)

# systemd crypttab(5) names of the perf flags (high_priority has none: --persistent covers it)
CRYPTTAB = {f: f.replace("_", "-") for f in ("same_cpu_crypt", "submit_from_crypt_cpus")}
CRYPTTAB |= {f: f.replace("_", "-") for f in ("no_read_workqueue", "no_write_workqueue")}


def how_to_apply(cfg: dict, reference: dict) -> list[str]:
    """Commands that give an existing or new LUKS2 volume the settings ``cfg`` changes."""
    out = []
    if flags := [
        f for f in cfg.get("perf_flags") or [] if f not in (reference.get("perf_flags") or [])
    ]:
        perf = " ".join(f"--perf-{f}" for f in flags)
        out.append(f"`cryptsetup refresh {perf} --persistent <name>` (kept in the LUKS2 header)")
        if tab := [CRYPTTAB[f] for f in flags if f in CRYPTTAB]:
            out.append(f"or the crypttab options `{','.join(tab)}`")
    # a setting one of the two plans does not state (a top layer that is not luks): not compared
    stated = {k for k in ("sector_size", "cipher", "key_bits") if cfg.get(k) and reference.get(k)}
    if "sector_size" in stated and (sector := cfg["sector_size"]) != reference["sector_size"]:
        out.append(
            f"`cryptsetup luksFormat --sector-size {sector}` (new volume; an existing LUKS2 "
            f"volume: `cryptsetup reencrypt --sector-size {sector}`, which rewrites all data)"
        )
    cipher, key = cfg.get("cipher"), cfg.get("key_bits")
    if {"cipher", "key_bits"} <= stated and (cipher, key) != (
        reference["cipher"],
        reference["key_bits"],
    ):
        out.append(
            f"`cryptsetup luksFormat --cipher {cipher} --key-size {key}` (new volume; existing: "
            f"`cryptsetup reencrypt --cipher {cipher} --key-size {key}`)"
        )
    return out


def _family(tuning: pd.DataFrame) -> dict:
    """How many decisions the recommendation rests on and the levels of their intervals."""
    decided = tuning.dropna(subset=["row_confidence"])
    if decided.empty:
        return {"n_decisions": 0}
    first = decided.iloc[0]
    level = {k: f"{100 * first[k]:.4g}" for k in ("row_confidence", "family_confidence")}
    return {"n_decisions": int(first["n_decisions"]), **level}


def _every_family(rows: pd.DataFrame) -> dict:
    """A setting tuning.parquet recommends (a gain, no decided cost), held to the paper's rule:
    still recommended only when no row is undecided with its interval reaching the material
    margin (then *undecided*, unranked, saying where); the metrics with rows not decided or not
    measured are named, as they are no evidence that it is free."""
    measured = rows[rows["metric"].notna()]
    where = standing(measured)
    label = dict(zip(measured["metric"], measured["metric_label"], strict=True))
    maybe = measured[where.eq("maybe material")]
    open_ = sorted(set(measured.loc[where.eq("withheld"), "metric_label"]))
    absent = [name for metric, name in TUNING_METRICS.items() if metric not in label]
    notes = [f"not decided in every cell: {_words(open_)}"] if open_ else []
    notes += [f"not measured: {_words(absent)}"] if absent else []
    if maybe.empty:
        text = "recommended" + (f" ({'; '.join(notes)})" if notes else "")
        return {"recommendation": text}
    blocked = ", ".join(
        f"{name} in {n} cell{'s' if n > 1 else ''}"
        for name, n in maybe["metric_label"].value_counts(sort=False).items()
    )
    notes.insert(0, f"a gain, but undecided toward a material cost: {blocked}")
    return {"recommendation": f"undecided ({'; '.join(notes)})", "rank": None}


def recommendations(
    tuning: pd.DataFrame, plan_stacks: pd.DataFrame, perf_flags: pd.DataFrame, hosts: list[dict]
) -> dict:
    """The section's context: the measured settings (recommended ones first) with their rows, the
    settings not measured, the family of decisions, the versions measured (``plan_stacks``,
    ``perf_flags``: the processed tables, what each plan asked for); ``present`` False when the
    run has no tuning arms."""
    if tuning.empty:
        return {"present": False}
    plans, measured, not_measured = planned_settings(plan_stacks, perf_flags), [], []
    for (host, setting), rows in tuning.groupby(["host", "setting"], sort=False):
        stacks = plans.get(host, {})
        reference = stacks.get(rows["reference"].iloc[0]) or {}
        entry = {"host": host, "setting": setting}
        entry["apply"] = how_to_apply(stacks.get(setting) or {}, reference)
        if rows["not_applied"].iloc[0]:
            not_measured.append({**entry, "reason": rows["not_applied"].iloc[0]})
            continue
        first = rows.iloc[0]
        entry |= {k: int(first[k]) for k in ("n_gains", "n_costs", "n_undecided")}
        rank = None if pd.isna(first["rank"]) else int(first["rank"])
        entry |= {"recommendation": first["recommendation"], "rank": rank}
        if first["recommendation"] == "recommended":
            entry |= _every_family(rows)
        entry["rows"] = [
            {
                "metric": r.metric_label,
                "cell": f"{r.workload} ({r.direction})",
                "limited": limits(r._asdict()),
                "effect": effect_ci(r._asdict()),
                "decision": r.decision,
                "ceiling": effect_ci(
                    {k: getattr(r, f"ceiling_{k}") for k in ("effect_pct", "ci_low", "ci_high")}
                ),
                "ceiling_decision": fmt_text(r.ceiling_decision),
            }
            for r in rows.itertuples()
        ]
        measured.append(entry)
    first = tuning.iloc[0]
    return {
        "present": True,
        "reference": first["reference"],
        "ceiling": first["ceiling"],
        "multi_host": tuning["host"].nunique() > 1,
        "no_equal_load": not tuning["metric"].eq("busy_cpu_us_per_io").any(),
        "measured": measured,
        "n_recommended": sum(s["recommendation"].startswith("recommended") for s in measured),
        "any_limited": any(r["limited"] for s in measured for r in s["rows"]),
        "family": _family(tuning[tuning["not_applied"].eq("")]),
        "not_measured": not_measured,
        "versions": [
            {k: h[k] for k in ("host", "kernel", "cryptsetup_version", "backend_short")}
            for h in hosts
        ],
    }


# ----------------------------------------------------------------- the paper's "Recommendation"

#: the metrics the recommendation weighs, in its order: what an operator pays for (rows that
#: repeat another metric's test at a fixed block size, ``derived_from``, are left out)
DECISION_METRICS = ("bw_bytes", "iops", "clat_p99_ns", "clat_p999_ns")
DECISION_METRICS += ("busy_cpu_s_per_gib", "busy_cpu_us_per_io")
#: decisions that leave no cost on the worse side
_NO_COST = ("negligible", "moderate gain", "material gain")


def _notes(rows: pd.DataFrame) -> pd.Series:
    """loss.parquet's ``note`` ("" when none): why a row is withheld."""
    return rows.get("note", pd.Series("", index=rows.index)).fillna("").astype(str)


def standing(rows: pd.DataFrame) -> pd.Series:
    """What each loss row says for turning the variant on: ``withheld`` (a note, or no interval),
    ``material`` (listed after the selection adjustment, loss.parquet's ``material_listed``),
    ``material alone`` (material on its own interval only), ``maybe material`` (undecided, its
    interval reaching past the upper margin), ``moderate``, ``maybe moderate`` (undecided, reaching
    past the lower margin) or ``no cost``."""
    kind = rows["decision"].map(decision_kind)
    high = rows["ci_high"].astype(float)
    out = pd.Series("no cost", index=rows.index, dtype=object)
    out[kind.eq("undecided") & high.gt(rows["decision_lower_pct"])] = "maybe moderate"
    out[kind.eq("moderate")] = "moderate"
    out[kind.eq("undecided") & high.gt(rows["decision_upper_pct"])] = "maybe material"
    out[kind.eq("material")] = "material alone"
    listed = rows.get("material_listed", pd.Series(False, index=rows.index))
    out[kind.eq("material") & listed.eq(True)] = "material"
    out[kind.eq("insufficient") | _notes(rows).ne("")] = "withheld"
    return out


#: standings that stand in the way of turning it on; that make it a cost to weigh
IN_THE_WAY = ("material", "material alone", "maybe material")
COSTS = ("moderate", "maybe moderate")


def decided_rows(losses: pd.DataFrame, baseline: str, variant: str) -> pd.DataFrame:
    """The comparison's rows of :data:`DECISION_METRICS` that carry a test of their own and were
    measured (pairs, or a note saying why they were withheld)."""
    rows = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
    rows = rows[rows["metric"].isin(DECISION_METRICS)]
    rows = rows[rows["derived_from"].fillna("").eq("")]
    return rows[(rows["n"] > 0) | _notes(rows).ne("")]


def _span(rows: pd.DataFrame) -> str:
    """``74.1 to 85.3 %`` (one cell: ``85.3 %``): the effects of ``rows``."""
    low, high = rows["effect_pct"].min(), rows["effect_pct"].max()
    return fmt_pct(high) if fmt_num(low) == fmt_num(high) else f"{fmt_num(low)} to {fmt_pct(high)}"


def _largest(rows: pd.DataFrame, describe) -> str:
    """The family's largest cell (loss.parquet's ``largest``) with its selection-adjusted
    interval and the decision on it, or "" when it is not among ``rows``."""
    picked = rows[rows.get("largest", pd.Series(False, index=rows.index)).eq(True)]
    if picked.empty:
        return ""
    r = picked.iloc[0]
    ci = fmt_ci(r["selection_ci_low"], r["selection_ci_high"])
    level = fmt_num(100 * r["selection_confidence"], 2)
    return (
        f"; largest {describe(r)}: {fmt_pct(r['effect_pct'])} {ci} at {level} %, adjusted for "
        f"picking it from {int(r['family_cells'])} cells: "
        f"{decision_words(str(r['selection_decision']))} on it"
    )


def family_line(rows: pd.DataFrame, describe) -> str:
    """One metric of a comparison for the recommendation: its decisions, the cells in the way
    of turning it on or costing, what could not be decided."""
    first = rows.iloc[0]
    name = f"{metric_heading(str(first['metric']))} {first['effect']}"
    where = standing(rows)
    lower, upper = (fmt_num(first[f"decision_{s}_pct"], 0) for s in ("lower", "upper"))
    words = {
        "material": "material (listed after Benjamini-Hochberg over the metric's cells)",
        "material alone": "material on its own interval, not after adjusting for the others",
        "maybe material": f"undecided, the interval reaching past {upper} % (material)",
        "moderate": "moderate",
        "maybe moderate": f"undecided, the interval reaching past {lower} %",
    }
    parts = []
    for what, text in words.items():
        cells = rows[where == what]
        if len(cells):
            largest = _largest(cells, describe) if what == "material" else ""
            parts.append(f"{text} in {len(cells)} of {len(rows)} cells ({_span(cells)}){largest}")
    if no_cost := int((where == "no cost").sum()):
        parts.append(
            f"no cost (negligible, a gain, or undecided short of {lower} %) in {no_cost} of {len(rows)} cells"
        )
    withheld = rows[where == "withheld"]
    if len(withheld):
        reasons = _notes(withheld).str.split(":").str[0].replace("", "no interval")
        why = ", ".join(f"{k}: {v}" for k, v in reasons.value_counts().items())
        parts.append(f"not decided in {len(withheld)} of {len(rows)} cells ({why})")
    return f"{name} ({lower} / {upper} % margins): " + "; ".join(parts) + "."


def verdict(rows: pd.DataFrame, name: str, describe) -> dict:
    """One comparison's verdict over every metric of :data:`DECISION_METRICS` it has: ``text``
    (turn it on, where a moderate cost is acceptable, or not without budgeting, naming what is
    in the way and what could not be decided) and one line per metric."""
    metrics = [m for m in DECISION_METRICS if m in set(rows["metric"])]
    per_metric = {m: rows[rows["metric"] == m] for m in metrics}
    where = {m: standing(r) for m, r in per_metric.items()}
    heading = {m: metric_heading(m) for m in metrics}
    blocked = [heading[m] for m in metrics if where[m].isin(IN_THE_WAY).any()]
    costly = [heading[m] for m in metrics if where[m].isin(COSTS).any()]
    undecided = [heading[m] for m in metrics if where[m].eq("withheld").any()]
    decided = [heading[m] for m in metrics if not where[m].eq("withheld").all()]
    if blocked:
        text = (
            f"{name}: do not turn it on without budgeting for its cost: "
            f"{_words(blocked)} {'stands' if len(blocked) == 1 else 'stand'} in the way "
            "(material, or undecided with the interval reaching the material margin)."
        )
    elif costly:
        text = (
            f"{name}: turn it on only where a moderate cost is acceptable: {_words(costly)} "
            "cost between the margins in some cells, or may."
        )
    elif decided:
        text = (
            f"{name}: turn it on: no cell of {_words(decided)} is worse by its metric's lower "
            f"margin or more at {fmt_num(100 * float(rows['confidence'].iloc[0]), 0)} % "
            "confidence."
        )
    else:
        text = f"{name}: no recommendation: no metric could be decided."
    if undecided:
        text += (
            f" Not decided in every cell (withheld cells are no evidence for turning it on): "
            f"{_words(undecided)}."
        )
    lines = [family_line(per_metric[m], describe) for m in metrics]
    return {"text": text, "metrics": lines, "turn_on": not (blocked or costly) and bool(decided)}


def _not_measured(losses: pd.DataFrame, rows: pd.DataFrame) -> str:
    """The :data:`DECISION_METRICS` the comparison has no measured row of (e.g. CPU without
    sidecars), as words ("" when none); IOPS that repeats bandwidth is measured."""
    measured = set(rows["metric"])
    absent = [m for m in DECISION_METRICS if m not in measured | derived_from(measured, losses)]
    return _words([metric_heading(m) for m in absent]) if absent else ""


def derived_from(measured: set, losses: pd.DataFrame) -> set:
    """The metrics whose rows repeat the test of a ``measured`` one (IOPS at a fixed block size)."""
    repeats = losses.loc[losses["derived_from"].fillna("").isin(measured), "metric"]
    return set(repeats)


def _words(names: list[str]) -> str:
    """``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _thresholds(losses: pd.DataFrame) -> str:
    """What the recommendation decides on, with each family's margins as the loss table records
    them."""
    conf = fmt_num(100 * float(losses["confidence"].iloc[0]), 0)
    rows = losses[losses["metric"].isin(DECISION_METRICS)]
    margins = (
        rows.groupby(["decision_lower_pct", "decision_upper_pct"], sort=True)["metric"]
        .agg(lambda ms: ", ".join(metric_heading(m) for m in dict.fromkeys(ms)))
        .reset_index()
    )
    listed = "; ".join(
        f"{r.metric} ±{fmt_num(r.decision_lower_pct, 0)} / {fmt_num(r.decision_upper_pct, 0)} %"
        for r in margins.itertuples()
    )
    return (
        "Decided by magnitude on everything the loss table reports that an operator pays for: "
        "throughput, p99 and p99.9 completion latency, CPU per GiB and per I/O. A cell is "
        f"*negligible* when its whole {conf} % interval lies within ± the lower margin, "
        "*moderate* between the lower and the upper margin, *material* beyond the upper margin "
        "(*gains* likewise where the variant is better), *undecided* when it straddles a margin "
        f"(margins: {listed}). A cell is named material only where its one-sided test against "
        "the upper margin survives Benjamini-Hochberg over the cells of its metric, and the "
        "largest is quoted with its interval at 1 - alpha/m (m cells): both adjusted for picking "
        "cells out of many. Turn it on only when no metric is material or undecided toward "
        "material; cells withheld (too few I/Os, net CPU within idle noise) count for nothing."
    )


def paper_recommendation(losses: pd.DataFrame, hosts: list[dict], describe) -> dict:
    """The paper's recommendation (loss.parquet, with its selection-adjusted columns): the
    thresholds, one verdict per comparison (headline first), caveats on the backend."""
    pairs = comparison_pairs(losses)
    verdicts = []
    for baseline, variant in pairs:
        rows = decided_rows(losses, baseline, variant)
        if rows.empty:
            continue
        name = f"`{variant}`" if len(pairs) == 1 else label((baseline, variant))
        verdicts.append(
            verdict(rows, name, describe)
            | {"not_measured": _not_measured(losses, rows), "name": name}
        )
    caveats = []
    if any(h["backend"] == "userspace" for h in hosts):
        caveats.append(
            "This run measured qemu's userspace LUKS driver, not the kernel's dm-crypt: it does "
            "not settle the dm-crypt question. Repeat it with the kernel backend on the hardware "
            "you mean to deploy."
        )
    if any(h["backend"] not in ("userspace", "kernel") for h in hosts):
        caveats.append("The backend of some hosts is unknown; treat their numbers with care.")
    return {"thresholds": _thresholds(losses), "verdicts": verdicts, "caveats": caveats}
