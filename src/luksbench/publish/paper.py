"""The paper: one blog-style post per run (``paper/<run>/index.md`` + a self-contained
``index.html``), rendered from the processed tables with a Jinja2 template.

No number is typed by hand: every number in the text comes from ``data/processed/<run>/*.parquet``
or from the transcribed published results in ``data/reference/*.csv``; formatting happens here,
wording in ``templates/paper.md.j2``. Missing values print as "n/a", never as "nan".

The post has one section per comparison of loss.parquet (``"`raid0-luks` against `raid0`"``) in the
loss tables and the results, the headline (the first comparison) first; cells of a config pattern
are labelled with it and never share a row with main-matrix cells; the patterns are described from
the plan in env.json and the results' job options; optional stacks that could not be built are
listed under "Not in this run" with the reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import jinja2
import pandas as pd

from luksbench.formats.layout import bs_label

TEMPLATE = "paper.md.j2"

BACKEND_TEXT = {
    "userspace": (
        "userspace: qemu-storage-daemon's LUKS driver via FUSE, not dm-crypt",
        "This run measured qemu's own LUKS implementation (qemu-storage-daemon, block driver `luks`, "
        "exported to the host through FUSE), **not the kernel's dm-crypt**. Both stacks go through the "
        "same qemu + FUSE path, so the difference isolates qemu's encryption, but absolute numbers "
        "and the size of the loss do not carry over to dm-crypt.",
    ),
    "kernel": (
        "kernel dm-crypt",
        "This run measured the kernel's dm-crypt (device-mapper `crypt` target set up with "
        "cryptsetup) on the test box's block devices.",
    ),
}

METRIC_UNITS = {
    # metric: (heading, unit, divisor, decimals)
    "bw_bytes": ("Bandwidth", "MiB/s", 2**20, 1),
    "iops": ("IOPS", "IO/s", 1, 0),
    "clat_p99_ns": ("p99 completion latency", "ms", 1e6, 3),
    "clat_p50_ns": ("median completion latency", "ms", 1e6, 3),
    "clat_p999_ns": ("p99.9 completion latency", "ms", 1e6, 3),
    "clat_mean_ns": ("mean completion latency", "ms", 1e6, 3),
    "lat_mean_ns": ("mean latency", "ms", 1e6, 3),
    "busy_cpu_s_per_gib": ("Busy CPU time per GiB", "CPU s/GiB", 1, 2),
    "sys_cpu_s_per_gib": ("System CPU time per GiB", "CPU s/GiB", 1, 2),
}


# ------------------------------------------------------------------------------------- formatting


def _missing(x) -> bool:
    if x is None or x is pd.NA:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def fmt_num(x, decimals: int = 1) -> str:
    """Number with thousands separators; "n/a" for missing values."""
    if _missing(x):
        return "n/a"
    x = float(x)
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if round(x, decimals) == 0:
        x = 0.0  # no "-0.0"
    return f"{x:,.{decimals}f}"


def fmt_pct(x, decimals: int = 1) -> str:
    return "n/a" if _missing(x) else f"{fmt_num(x, decimals)} %"


def fmt_ci(low, high, decimals: int = 1) -> str:
    if _missing(low) or _missing(high):
        return "[n/a]"
    return f"[{fmt_num(low, decimals)}, {fmt_num(high, decimals)}]"


def fmt_bool(x) -> str:
    return "n/a" if _missing(x) else ("yes" if bool(x) else "no")


def fmt_text(x) -> str:
    return "n/a" if _missing(x) or str(x).strip() == "" else str(x)


def _pattern(row) -> str:
    value = row.get("pattern") if hasattr(row, "get") else None
    return value if isinstance(value, str) else ""


def cell_name(row, with_job: bool = False) -> str:
    """``randread 4k QD32``; mixed patterns add the direction, multi-job files the job name, the
    cells of a config pattern its name (``randwrite 1g QD1 [largeblock]``)."""
    name = f"{row['rw']} {bs_label(int(row['bs_bytes']))} QD{int(row['iodepth'])}"
    if row["rw"] in ("rw", "readwrite", "randrw"):
        name += f" ({row['direction']})"
    if with_job:
        name += f", job `{row['job']}`"
    if _pattern(row):
        name += f" [{_pattern(row)}]"
    return name


def _multi_job(loss: pd.DataFrame) -> bool:
    """Do some result files hold several jobs (then cells need the job name to be told apart)?"""
    return bool(len(loss)) and bool(
        loss.groupby(["host", "workload"])["job_slot"].nunique().max() > 1
    )


def _env_dict(env_json) -> dict:
    try:
        return json.loads(env_json) if not _missing(env_json) else {}
    except (TypeError, json.JSONDecodeError):
        return {}


# ---------------------------------------------------------------------------------------- context


def _hosts(env: pd.DataFrame, stacks: pd.DataFrame) -> list[dict]:
    hosts = []
    for _, row in env.iterrows():
        backend = fmt_text(row["backend"])
        if backend == "n/a" and not stacks.empty:
            per_stack = stacks[stacks["host"] == row["host"]]["backend"].dropna().unique()
            backend = per_stack[0] if len(per_stack) == 1 else backend
        short, long = BACKEND_TEXT.get(
            backend,
            (
                f"unknown backend ({backend})",
                "env.json does not say which encryption backend ran; treat the numbers with care.",
            ),
        )
        hosts.append(
            {
                "host": row["host"],
                "hostname": fmt_text(row["hostname"]),
                "cpu_model": fmt_text(row["cpu_model"]),
                "cpu_count": fmt_text(row["cpu_count"]),
                "aes": fmt_bool(row["aes"]),
                "vaes": fmt_bool(row["vaes"]),
                "kernel": fmt_text(row["kernel"]),
                "fio_version": fmt_text(row["fio_version"]),
                "cryptsetup_version": fmt_text(row["cryptsetup_version"]),
                "qemu_version": fmt_text(row.get("qemu_version")),
                "backend": backend,
                "backend_short": short,
                "backend_long": long,
                "backend_reason": fmt_text(row["backend_reason"]),
                # a fio server of a fleet run: results, but no environment capture of its own
                "coordinator": _env_dict(row["env_json"]).get("coordinator"),
            }
        )
    return hosts


# Stack settings a reader needs to judge the comparison (the rest, e.g. paths and the LUKS header
# dump, stays in the processed table).
_STACK_SETTINGS = (
    "luks_type",
    "sector_size",
    "hash",
    "pbkdf",
    "device_size_bytes",
    "loop_direct_io",
)


def _stacks(stacks: pd.DataFrame, pairs: list[tuple[str, str]]) -> list[dict]:
    """The stacks that were built, with their role in the comparisons (unavailable ones are in
    "Not in this run")."""
    from luksbench.publish.report import unavailable_stacks

    gone = {(u["host"], u["stack"]) for u in unavailable_stacks(stacks)}
    rows = []
    for _, row in stacks.iterrows():
        if (str(row["host"]), str(row["stack"])) in gone:
            continue
        desc = _env_dict(row["description_json"])
        settings = [f"{k} {desc[k]}" for k in _STACK_SETTINGS if desc.get(k) is not None]
        settings += [f"note: {note}" for note in desc.get("notes") or []]
        details = "; ".join(settings)
        roles = [
            role
            for role, side in (("baseline", 0), ("variant", 1))
            if any(pair[side] == row["stack"] for pair in pairs)
        ]
        role = ", ".join(roles)
        rows.append(
            {
                "host": row["host"],
                "stack": row["stack"],
                "role": role,
                "kind": fmt_text(row["kind"]),
                "backend": fmt_text(row["backend"]),
                "cipher": fmt_text(row["cipher"]),
                "key_bits": fmt_text(row["key_bits"]),
                "details": details or "n/a",
            }
        )
    return rows


def _matrix(fio: pd.DataFrame, env: pd.DataFrame) -> dict:
    reps = fio.groupby(["host", "stack", "workload"])["rep"].nunique()
    runtime_s = fio["runtime_ms"].astype(float) / 1000
    ioengines = sorted(fio["ioengine"].dropna().unique()) if "ioengine" in fio else []
    direct = sorted(fio["direct"].dropna().unique()) if "direct" in fio else []
    plan_fio = {}
    for env_json in env["env_json"]:
        plan_fio = _env_dict(env_json).get("plan", {}).get("fio", {}) or plan_fio
    cells = fio[["workload"]].drop_duplicates()
    return {
        "rw": ", ".join(f"`{x}`" for x in sorted(fio["rw"].dropna().unique())),
        "bs": ", ".join(bs_label(int(b)) for b in sorted(fio["bs_bytes"].dropna().unique())),
        "iodepth": ", ".join(str(int(q)) for q in sorted(fio["iodepth"].dropna().unique())),
        "n_cells": len(cells),
        "n_stacks": fio["stack"].nunique(),
        "stacks": ", ".join(f"`{s}`" for s in sorted(fio["stack"].unique())),
        "reps_min": int(reps.min()) if len(reps) else 0,
        "reps_max": int(reps.max()) if len(reps) else 0,
        "n_results": int(fio[["host", "stack", "workload", "rep"]].drop_duplicates().shape[0]),
        "runtime_s": fmt_num(runtime_s.median(), 1),
        "runtime_planned_s": fmt_text(plan_fio.get("runtime_s")),
        "ioengine": ", ".join(ioengines) or "n/a",
        "direct": ", ".join(str(int(d)) for d in direct) or "n/a",
        "fio_versions": ", ".join(sorted(fio["fio_version"].dropna().unique())) or "n/a",
    }


def loss_sections(loss: pd.DataFrame) -> list[dict]:
    """One table per metric: rows rw x bs x iodepth (x pattern) with means, effect [CI], verdict,
    n. Called with one comparison's rows (several: the variant is named in every row)."""
    sections = []
    multi_host = loss["host"].nunique() > 1
    multi_job = _multi_job(loss)
    multi_variant = "variant" in loss and loss["variant"].nunique() > 1
    for metric in dict.fromkeys(loss["metric"]):
        sub = loss[loss["metric"] == metric]
        heading, unit, div, dec = METRIC_UNITS.get(metric, (metric, "", 1, 2))
        kind = sub["effect"].iloc[0]
        rows = []
        for _, r in sub.iterrows():
            rows.append(
                {
                    "cell": (f"{r['host']}: " if multi_host else "")
                    + cell_name(r, multi_job)
                    + (f" — `{r['variant']}`" if multi_variant else ""),
                    "n": int(r["n"]),
                    "n_dropped": int(r["n_dropped"]),
                    "baseline_mean": fmt_num(r["baseline_mean"] / div, dec),
                    "variant_mean": fmt_num(r["variant_mean"] / div, dec),
                    "effect": fmt_pct(r["effect_pct"]),
                    "ci": fmt_ci(r["ci_low"], r["ci_high"]),
                    "verdict": r["verdict"],
                }
            )
        sections.append(
            {
                "metric": metric,
                "heading": heading,
                "unit": unit,
                "kind": kind,
                "rows": rows,
                "any_dropped": any(r["n_dropped"] for r in rows),
            }
        )
    return sections


def comparison_sections(losses: pd.DataFrame, pairs: list[tuple[str, str]]) -> list[dict]:
    """One section per comparison, in ``pairs`` order (the headline first): its label, stacks,
    SCS-shaped tables, detailed loss tables and how many of its rows are significant."""
    from luksbench.analysis.contrasts import label

    out = []
    for k, (baseline, variant) in enumerate(pairs):
        rows = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
        out.append(
            {
                "label": label((baseline, variant)),
                "baseline": baseline,
                "variant": variant,
                "headline": k == 0,
                "scs_tables": scs_tables(rows),
                "loss_sections": loss_sections(rows),
                "n_significant": int((rows["verdict"] == "significant").sum()),
                "n_rows": len(rows),
            }
        )
    return out


def host_summary(losses: pd.DataFrame, hosts: list[dict], run: str) -> dict:
    """Several hosts: what the paper says about them, and one row per host and variant (bandwidth
    loss: cells, significant, median, worst with its interval). Empty for a single host."""
    names = sorted(losses["host"].dropna().unique())
    if len(names) < 2:
        return {"present": False, "rows": []}
    facts = {h["host"]: h for h in hosts}
    rows = []
    from luksbench.analysis.contrasts import label
    from luksbench.publish.report import comparison_pairs

    order = {pair: k for k, pair in enumerate(comparison_pairs(losses))}
    bw = losses[losses["metric"] == "bw_bytes"]
    groups = sorted(
        bw.groupby(["host", "baseline", "variant"], sort=False),
        key=lambda kg: (kg[0][0], order.get((kg[0][1], kg[0][2]), len(order))),
    )
    for (host, baseline, variant), g in groups:
        sig = g[(g["verdict"] == "significant") & (g["effect_pct"] > 0)]
        worst = sig.loc[sig["effect_pct"].idxmax()] if len(sig) else None
        h = facts.get(host, {})
        rows.append(
            {
                "host": host,
                "variant": variant,
                "compared": label((baseline, variant)),
                "backend": h.get("backend", "n/a"),
                "kernel": h.get("kernel", "n/a"),
                "cpu": h.get("cpu_model", "n/a"),
                "cells": len(g),
                "significant": len(sig),
                "median": fmt_pct(g["effect_pct"].median()),
                "worst": f"{_cell_words(worst, False)}: {_effect_ci(worst)}"
                if worst is not None
                else "none significant",
            }
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
            "over the rows of all hosts together. Whether two hosts differ is a different "
            f"question, with its own intervals: {pair}."
        ),
        "rows": rows,
    }


def _cryptsetup(cs: pd.DataFrame) -> dict:
    if cs.empty:
        return {"present": False, "ciphers": [], "pbkdf": [], "failures": []}
    ciphers = cs[(cs["kind"] == "cipher") & cs["available"].fillna(False).astype(bool)]
    failures = cs[~cs["available"].fillna(True).astype(bool)]
    pbkdf = cs[cs["kind"].isin(["pbkdf2", "argon2"])]
    return {
        "present": True,
        "ciphers": [
            {
                "host": r["host"],
                "algorithm": fmt_text(r["algorithm"]),
                "key_bits": fmt_num(r["key_bits"], 0),
                "enc": fmt_num(r["encryption_mib_s"], 1),
                "dec": fmt_num(r["decryption_mib_s"], 1),
            }
            for _, r in ciphers.iterrows()
        ],
        "pbkdf": [
            {
                "host": r["host"],
                "algorithm": fmt_text(r["algorithm"]),
                "value": (
                    f"{fmt_num(r['iterations_per_s'], 0)} iterations/s"
                    if r["kind"] == "pbkdf2"
                    else f"{fmt_num(r['time_cost'], 0)} iterations, {fmt_num(r['memory_kib'], 0)} KiB, "
                    f"{fmt_num(r['threads'], 0)} threads"
                ),
            }
            for _, r in pbkdf.iterrows()
        ],
        "failures": sorted(
            {
                (r["host"], fmt_text(r["algorithm"]), fmt_text(r["note"]))
                for _, r in failures.iterrows()
            }
        ),
    }


# ------------------------------------------------------------------------------------- the story

#: thresholds of the recommendation (stated in the paper's text)
NEGLIGIBLE_LOSS_PCT = 5.0
MATERIAL_LOSS_PCT = 20.0

#: metrics that get SCS-shaped tables (all metrics are in the detailed Results section)
SCS_TABLE_METRICS = ("bw_bytes", "iops", "clat_p99_ns")
_CPU_METRICS = ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib")
_METRIC_ORDER = ("bw_bytes", "iops", "clat_p99_ns", "clat_p50_ns", "clat_p999_ns", "clat_mean_ns")
_RW_ORDER = ("read", "write", "randread", "randwrite", "rw", "readwrite", "randrw")


def bs_human(bs_bytes) -> str:
    """4096 -> "4 KiB", 1048576 -> "1 MiB" (the SCS post's labels)."""
    n = int(bs_bytes)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def _cell_words(row, multi_host: bool, with_job: bool = False) -> str:
    """``sequential write, 1 MiB, QD32`` (+ direction of mixed patterns, host, job)."""
    from luksbench.publish.report import rw_words

    words = f"{rw_words(row['rw'])}, {bs_human(row['bs_bytes'])}, QD{int(row['iodepth'])}"
    if row["rw"] in ("rw", "readwrite", "randrw"):
        words += f" ({row['direction']})"
    if with_job:
        words += f", job `{row['job']}`"
    if _pattern(row):
        words += f", pattern `{_pattern(row)}`"
    return (f"{row['host']}: " if multi_host else "") + words


def _effect_ci(row) -> str:
    return f"{fmt_pct(row['effect_pct'])} {fmt_ci(row['ci_low'], row['ci_high'])}"


def _sorted_rw(values) -> list[str]:
    order = {rw: i for i, rw in enumerate(_RW_ORDER)}
    return sorted(values, key=lambda r: (order.get(r, len(order)), r))


def _sorted_metrics(values) -> list[str]:
    order = {m: i for i, m in enumerate(_METRIC_ORDER)}
    return sorted(values, key=lambda m: (order.get(m, len(order)), m))


def tldr_sentences(
    losses: pd.DataFrame, cpu: pd.DataFrame, hosts: list[dict], baseline: str, matrix: dict
) -> list[str]:
    """The TL;DR, every number computed from the loss tables: per comparison, headline first
    (``baseline`` is unused: each comparison names its own)."""
    from luksbench.publish.report import rw_words

    conf = fmt_num(100 * float(losses["confidence"].iloc[0]), 0)
    multi_host = losses["host"].nunique() > 1
    multi_job = _multi_job(losses)
    backends = sorted({h["backend_short"] for h in hosts}) or ["an unknown backend"]
    from luksbench.publish.report import comparison_pairs

    out = []
    for baseline, variant in comparison_pairs(losses):
        lv = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
        bw = lv[lv["metric"] == "bw_bytes"] if (lv["metric"] == "bw_bytes").any() else lv
        heading = METRIC_UNITS.get(str(bw["metric"].iloc[0]), ("loss",))[0].lower()
        n_cells = len(bw)
        host_names = ", ".join(f"`{h}`" for h in sorted(lv["host"].dropna().unique()))
        out.append(
            f"`{variant}` against `{baseline}` on {host_names}, "
            f"measured with {' / '.join(backends)}: {n_cells} cells, "
            f"{matrix['reps_text']} paired repetitions each, {conf} % confidence intervals."
        )
        sig = bw[bw["verdict"] == "significant"]
        pos = sig[sig["effect_pct"] > 0]
        if pos.empty:
            out.append(f"No significant {heading} loss in any of the {n_cells} cells.")
        else:
            worst = pos.loc[pos["effect_pct"].idxmax()]
            out.append(
                f"Worst {heading} loss: {_cell_words(worst, multi_host, multi_job)} — "
                f"{_effect_ci(worst)} ({int(worst['n'])} pairs)."
            )
            by_rw = []
            for rw in _sorted_rw(bw["rw"].dropna().unique()):
                rp = pos[pos["rw"] == rw]
                if rp.empty:
                    by_rw.append(f"{rw_words(rw)} none significant")
                else:
                    w = rp.loc[rp["effect_pct"].idxmax()]
                    by_rw.append(
                        f"{rw_words(rw)} up to {_effect_ci(w)} "
                        f"({bs_human(w['bs_bytes'])}, QD{int(w['iodepth'])})"
                    )
            out.append("By access pattern: " + "; ".join(by_rw) + ".")
        gains = sig[sig["effect_pct"] < 0]
        n_inc = int((bw["verdict"] == "inconclusive").sum())
        n_ins = int((bw["verdict"] == "insufficient").sum())
        n_eq = int((bw["verdict"] == "equivalent").sum())
        out.append(
            f"Significant loss in {len(pos)} of {n_cells} cells, significant gain "
            f"(`{variant}` faster) in {len(gains)}, "
            + (f"equivalent (no practical difference) in {n_eq}, " if n_eq else "")
            + f"inconclusive in {n_inc}"
            + (f", too few pairs in {n_ins}" if n_ins else "")
            + "."
        )
        for metric in _sorted_metrics(set(lv["metric"]) - {"bw_bytes", "iops", *_CPU_METRICS}):
            lm = lv[lv["metric"] == metric]
            name = METRIC_UNITS.get(metric, (metric,))[0]
            up = lm[(lm["verdict"] == "significant") & (lm["effect_pct"] > 0)]
            if up.empty:
                out.append(f"{name}: no significant increase in {len(lm)} cells.")
            else:
                w = up.loc[up["effect_pct"].idxmax()]
                out.append(
                    f"{name}: significant increase in {len(up)} of {len(lm)} cells, "
                    f"up to {_effect_ci(w)} ({_cell_words(w, multi_host, multi_job)})."
                )
        cv = cpu[(cpu["baseline"] == baseline) & (cpu["variant"] == variant)] if len(cpu) else cpu
        for metric in ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib"):
            lm = cv[cv["metric"] == metric] if len(cv) else cv
            if lm is None or lm.empty:
                continue
            name = METRIC_UNITS[metric][0]
            up = lm[(lm["verdict"] == "significant") & (lm["effect_pct"] > 0)]
            if up.empty:
                out.append(f"{name}: no significant increase in {len(lm)} cells.")
            else:
                w = up.loc[up["effect_pct"].idxmax()]
                out.append(
                    f"{name} rose significantly in {len(up)} of {len(lm)} cells, by up to "
                    f"{_effect_ci(w)} ({_cell_words(w, multi_host, multi_job)})."
                )
    return out


def recommendation(losses: pd.DataFrame, hosts: list[dict]) -> dict:
    """The recommendation, driven by the two thresholds on the bandwidth loss interval."""
    conf = fmt_num(100 * float(losses["confidence"].iloc[0]), 0)
    neg, mat = fmt_num(NEGLIGIBLE_LOSS_PCT, 0), fmt_num(MATERIAL_LOSS_PCT, 0)
    multi_host = losses["host"].nunique() > 1
    thresholds = (
        f"Thresholds: a cell's loss is *negligible* when its whole {conf} % interval lies below "
        f"{neg} %, *material* when the whole interval lies above {mat} %, and *undecided* "
        f"otherwise (including cells with fewer than two pairs). Applied to bandwidth."
    )
    from luksbench.analysis.contrasts import label
    from luksbench.publish.report import comparison_pairs

    pairs = comparison_pairs(losses)
    parts = []
    for baseline, variant in pairs:
        bw = losses[
            (losses["baseline"] == baseline)
            & (losses["variant"] == variant)
            & (losses["metric"] == "bw_bytes")
        ]
        if bw.empty:
            continue
        material = bw[bw["ci_low"] > MATERIAL_LOSS_PCT]
        negligible = bw[bw["ci_high"] < NEGLIGIBLE_LOSS_PCT]
        undecided = len(bw) - len(material) - len(negligible)
        name = f"`{variant}`" if len(pairs) == 1 else label((baseline, variant))
        text = (
            f"{name}: {len(material)} of {len(bw)} cells material, {len(negligible)} "
            f"negligible, {undecided} undecided."
        )
        if len(material):
            cells = material.sort_values("ci_low", ascending=False)
            listed = ", ".join(
                f"{_cell_words(r, multi_host)} ({_effect_ci(r)})"
                for _, r in cells.head(4).iterrows()
            )
            more = f" and {len(cells) - 4} more" if len(cells) > 4 else ""
            text += (
                f" Encryption costs materially in {listed}{more}: budget for that throughput, "
                "or keep those workloads on unencrypted storage."
            )
        elif len(negligible) == len(bw):
            text += f" Turn it on: no cell lost {neg} % or more at {conf} % confidence."
        if undecided:
            text += (
                f" The {undecided} undecided cells need more repetitions before they support "
                "a decision either way."
            )
        parts.append(text)
    caveats = []
    if any(h["backend"] == "userspace" for h in hosts):
        caveats.append(
            "This run measured qemu's userspace LUKS driver, not the kernel's dm-crypt: it does "
            "not settle the dm-crypt question. Repeat it with the kernel backend on the hardware "
            "you mean to deploy."
        )
    if any(h["backend"] not in ("userspace", "kernel") for h in hosts):
        caveats.append("The backend of some hosts is unknown; treat their numbers with care.")
    return {"thresholds": thresholds, "verdicts": parts, "caveats": caveats}


def scs_tables(losses: pd.DataFrame) -> list[dict]:
    """Loss tables in the SCS post's shape: one per rw pattern (and direction), config pattern and
    metric; rows = host / stack / iodepth, columns = block sizes; cells = effect [CI] and a
    verdict mark. Cells of two config patterns never share a table."""
    from luksbench.analysis.stats import with_pattern

    losses = with_pattern(losses)
    from luksbench.publish.report import rw_words

    marks = {"significant": "●", "equivalent": "≈", "inconclusive": "○", "insufficient": "\u2013"}
    multi_host = losses["host"].nunique() > 1
    multi_job = _multi_job(losses)
    tables = []
    shapes = losses[["pattern", "rw", "direction"]].drop_duplicates()
    rw_rank = {rw: i for i, rw in enumerate(_sorted_rw(losses["rw"].dropna().unique()))}
    for pattern, rw, direction in sorted(
        shapes.itertuples(index=False, name=None), key=lambda s: (s[0], rw_rank[s[1]], s[2])
    ):
        sub_rw = losses[
            (losses["pattern"] == pattern)
            & (losses["rw"] == rw)
            & (losses["direction"] == direction)
        ]
        mixed = rw in ("rw", "readwrite", "randrw")
        for metric in _sorted_metrics(set(sub_rw["metric"]) & set(SCS_TABLE_METRICS)):
            sub = sub_rw[sub_rw["metric"] == metric]
            heading = METRIC_UNITS.get(metric, (metric,))[0]
            kind = str(sub["effect"].iloc[0])
            cols = sorted(sub["bs_bytes"].unique())
            rows = []
            keys = ["host", "baseline", "variant", "iodepth", "job_slot"]
            several = sub[["baseline", "variant"]].drop_duplicates().shape[0] > 1
            for key, g in sub.groupby(keys, sort=True):
                host, base, variant, qd, slot = key
                label = f"{variant}, QD{int(qd)}"
                if several and sub["baseline"].nunique() > 1:
                    label = f"{variant} vs {base}, QD{int(qd)}"
                if multi_host:
                    label = f"{host}: {label}"
                if multi_job:
                    label += f", job `{g['job'].iloc[0]}`"
                cells = []
                for b in cols:
                    c = g[g["bs_bytes"] == b]
                    if c.empty:
                        cells.append("not measured")
                        continue
                    r = c.iloc[0]
                    cells.append(f"{_effect_ci(r)} {marks.get(str(r['verdict']), '?')}")
                rows.append({"label": label, "cells": cells, "_key": (host, variant, qd, slot)})
            rows.sort(key=lambda r: (r["_key"][0], r["_key"][1] != sub["variant"].iloc[0]))
            tables.append(
                {
                    "title": f"{rw_words(rw).capitalize()}"
                    + (f" ({direction})" if mixed else "")
                    + (f", pattern `{pattern}`" if pattern else "")
                    + f": {heading.lower() if heading != 'IOPS' else 'IOPS'} {kind}",
                    "columns": [f"{bs_human(b)} % {kind}" for b in cols],
                    "rows": rows,
                }
            )
    return tables


# ---------------------------------------------------------------------------------- comparisons


def _who(row, losses: pd.DataFrame) -> str:
    """The comparison of a row for the published-results tables: `variant` (and its baseline
    when the comparisons have several baselines)."""
    if losses["baseline"].nunique() > 1:
        return f"`{row['variant']}` vs `{row['baseline']}`"
    return f"`{row['variant']}`"


def compare_scs(losses: pd.DataFrame, scs: pd.DataFrame | None) -> dict:
    """This run beside the SCS 2023 tables where rw, block size and iodepth are the same (main
    matrix cells only: a config pattern's cells ran with other fio options than the study)."""
    from luksbench.analysis.stats import with_pattern
    from luksbench.publish.report import rw_words, scs_long

    if scs is None or scs.empty:
        return {"present": False, "rows": [], "devices": []}
    ref = scs_long(scs)
    devices = ["SAS HDD", "SAS RAID-0", "NVME", "NVME RAID-0"]
    devices = [d for d in devices if (ref["device"] == d).any()]
    multi_host = losses["host"].nunique() > 1
    rows = []
    losses = with_pattern(losses)
    ours = losses[losses["metric"].isin(["bw_bytes", "iops"]) & (losses["pattern"] == "")]
    rw_rank = {rw: i for i, rw in enumerate(_RW_ORDER)}
    ours = ours.assign(_rw=ours["rw"].map(lambda r: rw_rank.get(r, len(rw_rank))))
    ours = ours.assign(_m=ours["metric"].map({"bw_bytes": 0, "iops": 1}))
    for _, r in ours.sort_values(["host", "_rw", "_m", "iodepth", "bs_bytes"]).iterrows():
        m = ref[
            (ref["rw"] == r["rw"])
            & (ref["our_metric"] == r["metric"])
            & (ref["bs_bytes"] == int(r["bs_bytes"]))
            & (ref["iodepth"] == int(r["iodepth"]))
        ]
        if m.empty:
            continue
        published = m.set_index("device")["loss_pct"]
        rows.append(
            {
                "workload": (f"{r['host']}: " if multi_host else "")
                + f"{rw_words(r['rw'])}, {bs_human(r['bs_bytes'])}, QD{int(r['iodepth'])}",
                "metric": METRIC_UNITS.get(str(r["metric"]), (r["metric"],))[0],
                "ours": f"{_effect_ci(r)} ({r['verdict']}, {_who(r, losses)})",
                "scs": [fmt_pct(published.get(d), 2) for d in devices],
            }
        )
    return {"present": True, "rows": rows, "devices": devices}


def compare_ceph(losses: pd.DataFrame, ceph: pd.DataFrame | None) -> dict:
    """Ceph Reef's published % of unencrypted performance beside this run's matching cells."""
    from luksbench.publish.report import rw_words

    if ceph is None or ceph.empty:
        return {"present": False, "rows": [], "n_unmatched": 0, "n_total": 0}
    bw = losses[losses["metric"] == "bw_bytes"]
    multi_host = losses["host"].nunique() > 1
    rows, matched = [], set()
    for i, ref in ceph.iterrows():
        m = bw[
            (bw["rw"] == ref["rw"])
            & (bw["bs_bytes"] == int(ref["bs_bytes"]))
            & (bw["iodepth"] == int(ref["iodepth"]))
        ]
        for _, r in m.iterrows():
            matched.add(i)
            rows.append(
                {
                    "workload": (f"{r['host']}: " if multi_host else "")
                    + f"{rw_words(r['rw'])}, {bs_human(r['bs_bytes'])}, QD{int(r['iodepth'])}"
                    + (f", pattern `{_pattern(r)}`" if _pattern(r) else ""),
                    "ours": f"{_effect_ci(r)} ({r['verdict']}, {_who(r, losses)})",
                    "test_set": str(ref["test_set"]),
                    "configuration": str(ref["configuration"]),
                    "published": str(ref["pct_of_unencrypted_as_published"]),
                    "loss": fmt_pct(ref["loss_pct"], 2),
                }
            )
    other = ceph.drop(index=list(matched))
    shapes = sorted(
        {f"{rw_words(r['rw'])} {r['io_size']} QD{int(r['iodepth'])}" for _, r in other.iterrows()}
    )
    return {
        "present": True,
        "rows": rows,
        "n_unmatched": len(other),
        "n_total": len(ceph),
        "unmatched_shapes": ", ".join(shapes),
    }


def compare_raid5(
    losses: pd.DataFrame,
    raid5: pd.DataFrame | None,
    direct: list[int],
    cell_direct: dict | None = None,
) -> dict:
    """The 2012 RAID-5 conclusions beside this run's cells of the same rw pattern, block-size
    range and I/O mode (direct or buffered). ``direct``: the run's direct values; ``cell_direct``
    ({(host, workload): 0/1}, from the results' job options) decides per cell when a config
    pattern ran some cells buffered."""
    if raid5 is None or raid5.empty:
        return {"present": False, "rows": []}
    bw = losses[losses["metric"] == "bw_bytes"]
    if cell_direct and len(direct) > 1:
        bw = bw.assign(
            _direct=[
                cell_direct.get((h, w)) for h, w in zip(bw["host"], bw["workload"], strict=True)
            ]
        )
    multi_host = losses["host"].nunique() > 1
    rows = []
    for _, ref in raid5.iterrows():
        claim = f"“{ref['claim_as_published']}”"
        if _missing(ref["rw"]) or str(ref["rw"]).strip() == "":
            rows.append({"claim": claim, "ours": "no workload named: context only"})
            continue
        ref_direct = str(ref["direct"]).strip().lower() == "true"
        if direct and (1 if ref_direct else 0) not in direct:
            mode = "direct I/O" if ref_direct else "buffered I/O with fsync"
            rows.append(
                {
                    "claim": claim,
                    "ours": f"no matching cell: that test used {mode}, this run "
                    f"{'direct' if 1 in direct else 'buffered'} I/O",
                }
            )
            continue
        m = bw[
            (bw["rw"] == ref["rw"])
            & (bw["bs_bytes"] >= int(ref["bs_min_bytes"]))
            & (bw["bs_bytes"] <= int(ref["bs_max_bytes"]))
        ].sort_values(["host", "bs_bytes", "iodepth"])
        if "_direct" in m:
            m = m[m["_direct"] == (1 if ref_direct else 0)]
        if m.empty:
            rows.append({"claim": claim, "ours": f"no `{ref['rw']}` cell in that block-size range"})
            continue
        ours = "; ".join(
            (f"{r['host']}: " if multi_host else "")
            + f"{bs_human(r['bs_bytes'])} QD{int(r['iodepth'])}"
            + (f" [{_pattern(r)}]" if _pattern(r) else "")
            + (f" ({_who(r, bw)})" if bw["variant"].nunique() > 1 else "")
            + f" {_effect_ci(r)}"
            for _, r in m.iterrows()
        )
        rows.append({"claim": claim, "ours": f"`{ref['rw']}`: {ours}"})
    return {"present": True, "rows": rows}


# ------------------------------------------------------------------------------- what is missing


def gaps(
    fio, losses, env, cryptsetup, planned, figures_found, problems=None, unavailable=None
) -> list[str]:
    """Sentences on what this run lacks: optional stacks that could not be built (with the
    reason), raw files left out at ingest, planned stacks not measured, cells without pairs,
    cipher benchmarks that did not run, figure families without data."""
    out = []
    for u in unavailable or []:
        kind = f" ({u['kind']})" if u.get("kind") else ""
        out.append(
            f"Stack `{u['stack']}`{kind} could not be built on `{u['host']}`: {u['reason']}. It "
            "is optional, so the run went on without it: it is in no table or figure."
        )
    gone = {(u["host"], u["stack"]) for u in unavailable or []}
    if problems is not None and len(problems):
        excluded = problems[problems["severity"] == "excluded"]
        for row in excluded.itertuples():
            out.append(f"Raw file `{row.file}` was left out: {row.reason}.")
    measured = {
        h: sorted(g["stack"].unique()) for h, g in fio.groupby("host")
    }  # what the raw data holds
    for host, stacks in sorted(planned.items()):
        missing = sorted(
            s for s in set(stacks) - set(measured.get(host, [])) if (host, s) not in gone
        )
        if missing:
            out.append(
                f"On `{host}` the plan listed stacks {', '.join(f'`{s}`' for s in missing)} that "
                "have no results: they were skipped and are not in any table or figure."
            )
    no_pairs = losses[losses["n"] == 0]
    if len(no_pairs):
        cells = sorted(
            {
                f"`{r['variant']}` vs `{r['baseline']}` {r['workload']}"
                for _, r in no_pairs.iterrows()
            }
        )
        out.append(
            f"{len(cells)} cells have results on one stack only (no pairs): {', '.join(cells)}."
        )
    hosts_with_cs = set(cryptsetup["host"]) if len(cryptsetup) else set()
    for host in sorted(set(env["host"]) - hosts_with_cs):
        out.append(f"No `cryptsetup benchmark` output was recorded on `{host}`.")
    if len(cryptsetup):
        na = cryptsetup[
            (cryptsetup["kind"] == "cipher")
            & ~cryptsetup["available"].fillna(True).astype(bool)
            & cryptsetup["algorithm"].fillna("").astype(str).str.strip().ne("")
        ]
        for host, g in na.groupby("host"):
            ciphers = ", ".join(
                sorted(
                    {
                        f"{a} {fmt_num(k, 0)}b"
                        for a, k in zip(g["algorithm"], g["key_bits"], strict=True)
                    }
                )
            )
            out.append(f"On `{host}` the cipher benchmark skipped {ciphers} (N/A).")
    if "latency" not in figures_found:
        out.append(
            "No completion-latency histograms: the raw files carry no json+ `bins` (or the "
            "figures were made without the raw folder), so there is no percentile figure."
        )
    if "cpu" not in figures_found:
        out.append("No CPU sidecars (`rep<k>.cpu.json`): no CPU-cost figure.")
    return out


# --------------------------------------------------------------------------------------- figures

FIGURE_FAMILIES = {
    "throughput": (
        "Throughput, SCS style",
        "Per access pattern and metric: block size on the x axis, stacks side by side, log-scale "
        "y, one panel per queue depth; bar = mean over repetitions, error bar = t-interval.",
    ),
    "heatmap": (
        "Loss heatmaps",
        "Block size \u00d7 access pattern per comparison and queue depth, annotated with the effect, its "
        "interval and the verdict (● significant, ≈ equivalent, ○ inconclusive, \u2013 fewer than two "
        "pairs).",
    ),
    "latency": (
        "Latency percentiles",
        "Completion-latency percentile curves from fio's json+ histograms: thick = all "
        "repetitions pooled, thin = one repetition; both axes stretch the tail.",
    ),
    "cpu": (
        "CPU cost",
        "CPU seconds per GiB moved (whole machine, from /proc/stat around each fio run), by block "
        "size, with t-intervals. With the userspace backend the encryption runs in qemu's user "
        "space, so the *busy* (all non-idle) figure is the one that counts it.",
    ),
    "ciphers": (
        "Cipher benchmark",
        "`cryptsetup benchmark`: in-memory cipher throughput on one core (no storage I/O).",
    ),
    "ceiling": (
        "Crypto ceiling",
        "Measured bandwidth of the encrypted stack against the crypto ceiling: the cipher's "
        "benchmark throughput \u00d7 logical CPUs (decryption for reads, encryption for writes). The "
        "ceiling is the kernel cipher's; without a cipher benchmark no ceiling is drawn and the "
        "figure says why.",
    ),
    "loss": (
        "Cost per cell",
        "Effect per cell and metric with its interval, one chart per comparison; colour = verdict.",
    ),
    "hosts": (
        "Hosts side by side",
        "Each test box's effect per cell with its interval, one colour per host. Every host is "
        "compared with its own baseline from its own pairs; the hosts are set beside each other, "
        "not pooled.",
    ),
}


def _figure_caption(stem: str, headline: tuple[str, str] | None = None) -> str:
    from luksbench.analysis.contrasts import label
    from luksbench.publish.report import rw_words

    kind, _, rest = stem.partition("-")
    if kind == "loss":  # "loss" is the headline comparison, "loss-<variant>-vs-<baseline>" others
        variant, sep, baseline = rest.partition("-vs-")
        pair = (baseline, variant) if sep else headline
        return FIGURE_FAMILIES["loss"][0] + (f": {label(pair)}" if pair else "")
    if kind == "throughput":
        what, metric = rest.rsplit("-", 1)
        return f"{what}: {METRIC_UNITS.get(metric, (metric,))[0]} per stack"
    if kind in ("heatmap", "cpu"):
        return METRIC_UNITS.get(rest.split("-")[-1], (rest,))[0] + (
            ": loss heatmap" if kind == "heatmap" else ": CPU cost by block size"
        )
    if kind == "hosts":
        return METRIC_UNITS.get(rest, (rest,))[0] + ": hosts side by side"
    if kind == "latency":
        return f"{rest}: completion-latency percentiles" + (
            f" ({rw_words(rest)})" if rest in ("read", "write", "randread", "randwrite") else ""
        )
    return FIGURE_FAMILIES.get(kind, (stem,))[0]


def figure_sections(
    figures_dir: Path, out_md: Path, headline: tuple[str, str] | None = None
) -> list[dict]:
    """PNG figures of the run grouped by family (in FIGURE_FAMILIES order), linked relative to the
    Markdown file. ``headline``: the (baseline, variant) the ``loss`` figure shows."""
    figures_dir = Path(figures_dir)
    pngs = sorted(figures_dir.glob("*.png"))
    sections = []
    for kind, (heading, intro) in FIGURE_FAMILIES.items():
        found = [p for p in pngs if p.stem == kind or p.stem.startswith(kind + "-")]
        rank = {rw: i for i, rw in enumerate(_RW_ORDER)}
        found.sort(  # the SCS post's order: read, write, randread, randwrite; bandwidth first
            key=lambda p: (
                min((rank[w] for w in p.stem.split("-") if w in rank), default=len(rank)),
                p.stem.endswith("iops"),
                p.stem,
            )
        )
        if not found:
            continue
        sections.append(
            {
                "kind": kind,
                "heading": heading,
                "intro": intro,
                "figures": [
                    {
                        "caption": _figure_caption(p.stem, headline),
                        "png": Path(os.path.relpath(p, out_md.parent)).as_posix(),
                    }
                    for p in found
                ],
            }
        )
    return sections


# ---------------------------------------------------------------------------------------- context


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _run_date(env: pd.DataFrame, fio: pd.DataFrame) -> str:
    """Date of the measurement: the latest env.json capture, else the latest fio timestamp."""
    dates = []
    for env_json in env.get("env_json", []):
        captured = _env_dict(env_json).get("captured")
        if isinstance(captured, str) and len(captured) >= 10:
            dates.append(captured[:10])
    if dates:
        return max(dates)
    if "timestamp" in fio and pd.to_numeric(fio["timestamp"], errors="coerce").notna().any():
        ts = pd.to_numeric(fio["timestamp"], errors="coerce").max()
        return pd.Timestamp(ts, unit="s").strftime("%Y-%m-%d")
    return "unknown"


def _yaml_str(value) -> str:
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a valid YAML scalar


def paper_context(
    processed_dir: Path,
    figures_dir: Path,
    out_md: Path,
    run: str,
    baseline: str | None = None,
    variant: str | None = None,
    title: str = "",
    author: str = "luksbench",
    reference_dir: Path | None = None,
) -> dict:
    """Everything the template needs, as formatted strings (no raw floats reach the template)."""
    from importlib.metadata import PackageNotFoundError, version

    from luksbench.analysis.ingest import read_processed
    from luksbench.analysis.stats import with_pattern
    from luksbench.publish import report

    processed_dir = Path(processed_dir)
    tables = read_processed(processed_dir)
    for name in ("fio", "env"):
        if name not in tables:
            raise FileNotFoundError(
                f"{processed_dir / (name + '.parquet')} is missing: run the ingest first"
            )
    fio, env = with_pattern(tables["fio"]), tables["env"]
    stacks = tables.get("stacks", pd.DataFrame(columns=["host", "stack", "backend"]))
    cryptsetup = tables.get("cryptsetup", pd.DataFrame(columns=["host", "kind"]))
    loss = tables.get("loss")
    if loss is None:  # every stack against the baseline, as write_loss would
        loss = report.variant_losses(fio, None, baseline or "plain", variant or "luks")
    if loss.empty:
        raise ValueError(f"{processed_dir}: the loss table is empty")
    losses = with_pattern(report.variant_losses(fio, loss, baseline, variant))
    pairs = report.comparison_pairs(losses)
    # the headline: loss.parquet's first comparison, unless the caller names one of the others
    headline = next((p for p in pairs if p == (baseline or p[0], variant or p[1])), pairs[0])
    pairs = [headline, *[p for p in pairs if p != headline]]
    baseline, variant = headline
    confidence = float(loss["confidence"].iloc[0])
    cpu = report.cpu_losses(fio, baseline, pairs, confidence)
    hosts = _hosts(env, stacks)
    matrix = _matrix(fio, env)
    matrix["reps_text"] = (
        str(matrix["reps_min"])
        if matrix["reps_min"] == matrix["reps_max"]
        else f"{matrix['reps_min']} to {matrix['reps_max']}"
    )
    refs = report.read_references(reference_dir)
    direct = sorted(int(d) for d in fio["direct"].dropna().unique()) if "direct" in fio else []
    figure_secs = figure_sections(figures_dir, Path(out_md), headline)
    cell_direct = (
        {
            (str(h), str(w)): int(d)
            for h, w, d in fio[["host", "workload", "direct"]].dropna().itertuples(index=False)
        }
        if "direct" in fio
        else {}
    )
    unavailable = report.unavailable_stacks(stacks)
    ceilings = report.crypto_ceilings(cryptsetup, stacks, env)
    sources = sorted(p for p in processed_dir.glob("*.parquet"))
    try:
        pkg_version = version("luksbench")
    except PackageNotFoundError:  # pragma: no cover
        pkg_version = "unknown"
    title = title or f"What does {variant} cost? luksbench run {run}"
    facts = report.provenance_facts(env)
    return {
        "run": run,
        "title": title,
        "title_yaml": _yaml_str(title),
        "author_yaml": _yaml_str(author),
        "author": author,
        "date": _run_date(env, fio),
        "baseline": baseline,
        "variant": variant,
        "comparisons": comparison_sections(losses, pairs),
        "patterns": report.pattern_facts(fio, env),
        "confidence_pct": fmt_num(100 * confidence, 0),
        "tldr": " ".join(tldr_sentences(losses, cpu, hosts, baseline, matrix)),
        "recommendation": recommendation(losses, hosts),
        "host_summary": host_summary(losses, hosts, run),
        "hosts": hosts,
        "stacks": _stacks(stacks, pairs),
        "matrix": matrix,
        "n_significant": int((losses["verdict"] == "significant").sum()),
        "n_rows": len(losses),
        "figure_sections": figure_secs,
        "n_figures": sum(len(s["figures"]) for s in figure_secs),
        "figures_rel": Path(os.path.relpath(Path(figures_dir), Path(out_md).parent)).as_posix(),
        "cryptsetup": _cryptsetup(cryptsetup),
        "ceilings": [
            {
                "host": c["host"],
                "stack": c["stack"],
                "text": c["reason"].rstrip(".")
                if c["reason"]
                else f"{c['algorithm']} {c['key_bits']}-bit: {fmt_num(c['dec_mib_s'])} MiB/s "
                f"decryption, {fmt_num(c['enc_mib_s'])} MiB/s encryption per core \u00d7 "
                f"{c['cpus']} CPUs = {fmt_num(c['read_ceiling_mib_s'], 0)} MiB/s read ceiling, "
                f"{fmt_num(c['write_ceiling_mib_s'], 0)} MiB/s write ceiling",
                "available": c["reason"] is None,
            }
            for c in ceilings
        ],
        "gaps": gaps(
            fio,
            losses,
            env,
            cryptsetup,
            report.planned_stacks(env),
            {s["kind"] for s in figure_secs},
            tables.get("problems"),
            unavailable,
        ),
        "scs": compare_scs(losses, refs.get("scs")),
        "ceph": compare_ceph(losses, refs.get("ceph")),
        "raid5": compare_raid5(losses, refs.get("raid5"), direct, cell_direct),
        "negligible_pct": fmt_num(NEGLIGIBLE_LOSS_PCT, 0),
        "material_pct": fmt_num(MATERIAL_LOSS_PCT, 0),
        "git_commit": facts["git_commit"],
        "config_hash": facts["config_hash"],
        "sources": [{"name": p.name, "sha256": _digest(p)} for p in sources],
        "luksbench_version": pkg_version,
    }


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("luksbench.publish", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_paper(
    processed_dir: Path,
    figures_dir: Path,
    out_md: Path,
    run: str,
    baseline: str | None = None,
    variant: str | None = None,
    title: str = "",
    author: str = "luksbench",
    reference_dir: Path | None = None,
) -> Path:
    """Render ``templates/paper.md.j2`` with the processed tables of ``run`` into ``out_md``
    (normally ``paper/<run>/index.md``): YAML front matter (title, date, author) and the post.

    Figure links are relative to ``out_md``'s folder. ``baseline``/``variant`` default to those of
    ``loss.parquet``; ``title`` empty = generated from run and variant; ``reference_dir`` holds the
    transcribed published results (default: the repository's ``data/reference``). Returns ``out_md``.
    """
    out_md = Path(out_md)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    context = paper_context(
        processed_dir, figures_dir, out_md, run, baseline, variant, title, author, reference_dir
    )
    text = _environment().get_template(TEMPLATE).render(**context)
    out_md.write_text(text)
    return out_md


def split_front_matter(text: str) -> tuple[dict, str]:
    """(front matter as {key: value}, body) of a Markdown file starting with ``---``."""
    if not text.startswith("---\n"):
        return {}, text
    head, _, body = text[4:].partition("\n---\n")
    meta = {}
    for line in head.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            value = value.strip()
            try:
                meta[key.strip()] = json.loads(value) if value.startswith('"') else value
            except json.JSONDecodeError:
                meta[key.strip()] = value
    return meta, body


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;
margin:2rem auto;padding:0 1rem;line-height:1.5;color:#222}
h1{font-size:1.9rem;margin-bottom:.2rem}.byline{color:#666;margin-top:0}
h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:1rem 0;font-size:.88rem;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.25rem .5rem;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
img{max-width:100%;height:auto;border:1px solid #eee}
code{background:#f5f5f5;padding:0 .2rem;border-radius:3px}
blockquote{border-left:4px solid #c0392b;margin:1rem 0;padding:.2rem 1rem;background:#fdf2e9}
"""


def render_html(md_path: Path, html_path: Path | None = None) -> Path:
    """Markdown -> one self-contained HTML file (markdown-it-py, CommonMark + tables).

    Images are embedded as data URIs, so the file works when opened alone; the front matter
    becomes the title and byline.
    """
    import base64
    import html as html_lib
    import mimetypes
    import re

    from markdown_it import MarkdownIt

    md_path = Path(md_path)
    html_path = Path(html_path) if html_path else md_path.with_suffix(".html")
    meta, body_md = split_front_matter(md_path.read_text())
    title = meta.get("title") or next(
        (line[2:].strip() for line in body_md.splitlines() if line.startswith("# ")), md_path.stem
    )
    body = MarkdownIt("commonmark").enable("table").render(body_md)

    def embed(match: re.Match) -> str:
        src = html_lib.unescape(match.group(2))
        if src.startswith(("data:", "http://", "https://")):
            return match.group(0)
        path = (md_path.parent / src).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{md_path}: image {src} not found ({path})")
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'{match.group(1)}"data:{mime};base64,{data}"'

    body = re.sub(r'(<img src=)"([^"]+)"', embed, body)
    byline = " · ".join(html_lib.escape(str(meta[k])) for k in ("author", "date") if meta.get(k))
    body = (
        re.sub(r"(</h1>)", rf'\1\n<p class="byline">{byline}</p>', body, count=1)
        if byline
        else body
    )
    html_path.write_text(
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>\n"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>\n"
        f"<title>{html_lib.escape(str(title))}</title>\n"
        + "".join(
            f"<meta name='{k}' content='{html_lib.escape(str(v))}'>\n"
            for k, v in meta.items()
            if k in ("author", "date", "generator", "run")
        )
        + f"<style>{_CSS}</style></head>\n<body>\n{body}</body></html>\n"
    )
    return html_path
