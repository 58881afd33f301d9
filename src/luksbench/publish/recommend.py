"""The paper's "Recommended settings for this box", from ``tuning.parquet`` (decided on the
analysis side, :mod:`luksbench.analysis.tuning`) and each setting's config in the plan (env.json):
what it changes against the reference, how an operator applies it, the versions measured."""

from __future__ import annotations

import pandas as pd

from luksbench.analysis.tuning import plans as run_plans
from luksbench.publish.text import effect_ci, fmt_text, limits

# systemd crypttab(5) names of the perf flags (high_priority has none: --persistent covers it)
CRYPTTAB = {f: f.replace("_", "-") for f in ("same_cpu_crypt", "submit_from_crypt_cpus")}
CRYPTTAB |= {f: f.replace("_", "-") for f in ("no_read_workqueue", "no_write_workqueue")}


def how_to_apply(cfg: dict, reference: dict) -> list[str]:
    """Commands that give an existing or new LUKS2 volume the settings ``cfg`` changes."""
    out = []
    if flags := [
        f for f in cfg.get("perf_flags") or [] if f not in reference.get("perf_flags", [])
    ]:
        perf = " ".join(f"--perf-{f}" for f in flags)
        out.append(f"`cryptsetup refresh {perf} --persistent <name>` (kept in the LUKS2 header)")
        if tab := [CRYPTTAB[f] for f in flags if f in CRYPTTAB]:
            out.append(f"or the crypttab options `{','.join(tab)}`")
    if (sector := cfg.get("sector_size", 512)) != reference.get("sector_size", 512):
        out.append(
            f"`cryptsetup luksFormat --sector-size {sector}` (new volume; an existing LUKS2 "
            f"volume: `cryptsetup reencrypt --sector-size {sector}`, which rewrites all data)"
        )
    key, cipher = cfg.get("key_bits", 512), cfg.get("cipher", "aes-xts-plain64")
    if (cipher, key) != (
        reference.get("cipher", "aes-xts-plain64"),
        reference.get("key_bits", 512),
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


def recommendations(tuning: pd.DataFrame, env: pd.DataFrame, hosts: list[dict]) -> dict:
    """The section's context: the measured settings (recommended ones first) with their rows, the
    settings not measured, the family of decisions, the versions measured; ``present`` False when
    the run has no tuning arms."""
    if tuning.empty:
        return {"present": False}
    plans, measured, not_measured = run_plans(env), [], []
    for (host, setting), rows in tuning.groupby(["host", "setting"], sort=False):
        stacks = plans.get(host, {}).get("stacks") or {}
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
        "n_recommended": sum(s["recommendation"] == "recommended" for s in measured),
        "any_limited": any(r["limited"] for s in measured for r in s["rows"]),
        "family": _family(tuning[tuning["not_applied"].eq("")]),
        "not_measured": not_measured,
        "versions": [
            {k: h[k] for k in ("host", "kernel", "cryptsetup_version", "backend_short")}
            for h in hosts
        ],
    }
