"""The paper's context: everything ``templates/paper.md.j2`` prints, as formatted strings.

No number is typed by hand: every number comes from ``data/processed/<run>/*.parquet`` or the
transcribed published results in ``data/reference/*.csv``; formatting happens here, wording in the
template. One section per comparison of loss.parquet, the headline first.
"""

from __future__ import annotations

import json
import os
import re
from functools import partial
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from luksbench.analysis.cells import with_pattern
from luksbench.analysis.contrasts import Pair, comparison_pairs, label
from luksbench.analysis.saturation import BUSY_LIMIT_PCT, JOB_CPU_LIMIT_PCT
from luksbench.analysis.tails import TOO_FEW
from luksbench.formats.envdoc import parse_env_json
from luksbench.publish.catalog import FIGURE_FAMILIES, INDEX, read_index, read_skipped
from luksbench.publish.ceilings import (
    available_ciphers,
    ceiling_text,
    crypto_ceilings,
    estimate_mark,
)
from luksbench.publish.recommend import paper_recommendation, recommendations
from luksbench.publish.references import compare_ceph, compare_raid5, compare_scs, read_references
from luksbench.publish.run import (
    Run,
    load_run,
    measured_matrix,
    package_version,
    pattern_facts,
    planned_stacks,
    provenance_facts,
    run_date,
    unavailable_stacks,
)
from luksbench.publish.text import (
    LIMITS,
    METRIC_UNITS,
    MIXED_RW,
    bs_human,
    cell_name,
    cell_words,
    cpu_basis,
    cpu_net,
    decision_kind,
    effect_ci,
    fmt_bool,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_text,
    limits,
    md_escape,
    md_escape_frame,
    md_escape_keeping_code,
    metric_heading,
    missing,
    multi_job,
    rw_rank,
    rw_words,
    sorted_metrics,
)

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


_UNKNOWN = "env.json does not say which encryption backend ran; treat the numbers with care."
_HOST_TEXT = ("hostname", "cpu_model", "cpu_count", "kernel", "fio_version", "cryptsetup_version")
_HOST_TEXT += ("qemu_version", "backend_reason")


def _hosts(env: pd.DataFrame, stacks: pd.DataFrame) -> list[dict]:
    hosts = []
    for _, row in env.iterrows():
        backend = fmt_text(row["backend"])
        if backend == "n/a" and not stacks.empty:
            per_stack = stacks[stacks["host"] == row["host"]]["backend"].dropna().unique()
            backend = per_stack[0] if len(per_stack) == 1 else backend
        short, long = BACKEND_TEXT.get(backend, (f"unknown backend ({backend})", _UNKNOWN))
        # a fio server of a fleet run: results, but no environment capture of its own
        coordinator = parse_env_json(row["env_json"]).get("coordinator")
        hosts.append(
            {"host": row["host"], **{k: fmt_text(row.get(k)) for k in _HOST_TEXT}}
            | {"aes": fmt_bool(row["aes"]), "vaes": fmt_bool(row["vaes"]), "backend": backend}
            | {"backend_short": short, "backend_long": long, "coordinator": coordinator}
        )
    return hosts


def job_devices(env: pd.DataFrame, machine_paths: bool = False) -> list[dict]:
    """Per host and device of env.json's ``job_devices``: NUMA node, queues, scheduler, poll
    queues and the CPUs the fio jobs ran on. The device is named by its block device (and
    whether it holds the scratch directory), its path on the measuring machine only with
    ``machine_paths`` (config ``paper.machine_paths``)."""
    return [
        {"host": row["host"], "device": _device_text(d, doc, machine_paths)}
        | {k: fmt_text(d.get(k)) for k in ("numa_node", "queues", "scheduler")}
        | {"poll": "yes" if d.get("io_poll") else "no", "cpus": d.get("job_cpus") or "any"}
        for _, row in env.iterrows()
        for doc in [parse_env_json(row["env_json"])]
        for d in doc.get("job_devices") or []
    ]


def _device_text(device: dict, env_doc: dict, machine_paths: bool) -> str:
    block = fmt_text(device.get("block_device"))
    if machine_paths:
        return f"`{device.get('device')}` ({block})"
    path = str(device.get("device") or "")
    scratch = str((env_doc.get("plan") or {}).get("scratch_dir") or "")
    holds_scratch = bool(path) and (scratch == path or scratch.startswith(path.rstrip("/") + "/"))
    what = "the scratch directory's disk" if holds_scratch else "a planned device"
    return f"{what}, `{block}`" if block != "n/a" else what


# Stack settings a reader needs to judge the comparison (the rest, e.g. paths and the LUKS header
# dump, stays in the processed table).
_STACK_SETTINGS = ("luks_type", "sector_size", "hash", "pbkdf")
_STACK_SETTINGS += ("device_size_bytes", "loop_direct_io")


def _stacks(stacks: pd.DataFrame, pairs: list[tuple[str, str]]) -> list[dict]:
    """The stacks that were built, with their role in the comparisons (unavailable ones are in
    "Not in this run")."""
    gone = {(u["host"], u["stack"]) for u in unavailable_stacks(stacks)}
    rows = []
    for _, row in stacks.iterrows():
        if (str(row["host"]), str(row["stack"])) in gone:
            continue
        desc = parse_env_json(row["description_json"])
        settings = [f"{k} {desc[k]}" for k in _STACK_SETTINGS if desc.get(k) is not None]
        settings += [f"note: {note}" for note in desc.get("notes") or []]
        roles = [
            role
            for role, side in (("baseline", 0), ("variant", 1))
            if any(pair[side] == row["stack"] for pair in pairs)
        ]
        rows.append(
            {"host": row["host"], "stack": f"`{row['stack']}`", "role": ", ".join(roles)}
            | {k: fmt_text(row[k]) for k in ("kind", "backend", "cipher", "key_bits")}
            | {"details": "; ".join(settings) or "n/a"}
        )
    return rows


def _matrix(fio: pd.DataFrame, env: pd.DataFrame) -> dict:
    reps = fio.groupby(["host", "stack", "workload"])["rep"].nunique()
    runtime_s = fio["runtime_ms"].astype(float) / 1000
    ioengines = sorted(fio["ioengine"].dropna().unique()) if "ioengine" in fio else []
    direct = sorted(fio["direct"].dropna().unique()) if "direct" in fio else []
    plan_fio = {}
    for env_json in env["env_json"]:
        plan_fio = parse_env_json(env_json).get("plan", {}).get("fio", {}) or plan_fio
    reps_min, reps_max = (int(reps.min()), int(reps.max())) if len(reps) else (0, 0)
    return {
        **measured_matrix(fio),
        "n_cells": fio["workload"].nunique(),
        "n_stacks": fio["stack"].nunique(),
        "stacks": ", ".join(f"`{s}`" for s in sorted(fio["stack"].unique())),
        "reps_text": str(reps_min) if reps_min == reps_max else f"{reps_min} to {reps_max}",
        "n_results": int(fio[["host", "stack", "workload", "rep"]].drop_duplicates().shape[0]),
        "runtime_s": fmt_num(runtime_s.median(), 1),
        "runtime_planned_s": fmt_text(plan_fio.get("runtime_s")),
        "ioengine": ", ".join(ioengines) or "n/a",
        "direct": ", ".join(str(int(d)) for d in direct) or "n/a",
        "fio_versions": ", ".join(sorted(fio["fio_version"].dropna().unique())) or "n/a",
    }


def _too_few(row) -> bool:
    """A latency percentile withheld for too few I/Os (loss.parquet's ``note``) in every pair."""
    note = row.get("note")
    return row["n"] < 2 and not missing(note) and str(note).startswith(TOO_FEW)


def loss_sections(loss: pd.DataFrame) -> list[dict]:
    """One table per metric: rows rw x bs x iodepth (x pattern) with means, effect [CI], verdict,
    n. Called with one comparison's rows (several: the variant is named in every row)."""
    sections = []
    multi_host = loss["host"].nunique() > 1
    several_jobs = multi_job(loss)
    multi_variant = "variant" in loss and loss["variant"].nunique() > 1
    folded = same_test_as_bandwidth(loss)
    loss = loss[~folded]
    for metric in dict.fromkeys(loss["metric"]):
        sub = loss[loss["metric"] == metric]
        heading, unit, div, dec = METRIC_UNITS.get(metric, (metric, "", 1, 2))
        rows = [
            {
                "cell": (f"{r['host']}: " if multi_host else "")
                + cell_name(r, several_jobs)
                + (f" — `{r['variant']}`" if multi_variant else ""),
                "n": int(r["n"]),
                "n_dropped": int(r["n_dropped"]),
                "baseline_mean": fmt_num(r["baseline_mean"] / div, dec),
                "variant_mean": fmt_num(r["variant_mean"] / div, dec),
                "effect": TOO_FEW if _too_few(r) else fmt_pct(r["effect_pct"]),
                "ci": fmt_ci(r["ci_low"], r["ci_high"]),
                "decision": r["decision"] + _limited_mark(r),
                "verdict": r["verdict"],
                "q": fmt_num(r["q_value"], 3),
            }
            for _, r in sub.iterrows()
        ]
        sections.append(
            {"metric": metric, "heading": heading, "unit": unit, "kind": sub["effect"].iloc[0]}
            | {"rows": rows, "any_dropped": any(r["n_dropped"] for r in rows)}
            | {"iops_folded": metric == "bw_bytes" and bool(folded.any())}
        )
    return sections


def same_test_as_bandwidth(loss: pd.DataFrame) -> pd.Series:
    """IOPS rows that repeat the bandwidth test (loss.parquet's ``derived_from``: same cell, one
    block size, so IOPS is bandwidth / block size) and reach the bandwidth row's decision: the
    paper folds them into the bandwidth tables. fio averages IOPS its own way, so the effect can
    differ slightly; an IOPS row with another decision keeps its own row."""
    derived = loss.get("derived_from", pd.Series("", index=loss.index)).fillna("")
    candidates = loss["metric"].eq("iops") & derived.eq("bw_bytes")
    keys = ["host", "baseline", "variant", "workload", "direction", "job_slot"]
    bw = loss[loss["metric"].eq("bw_bytes")].drop_duplicates(keys).set_index(keys)["decision"]
    at = pd.MultiIndex.from_frame(loss[keys])
    same = pd.Series(bw.reindex(at).to_numpy(), index=loss.index).eq(loss["decision"])
    return candidates & same


def _limited_mark(row) -> str:
    """' (fio-bound)' / ' (CPU saturated)' after a decision whose baseline was limited."""
    return f" ({limits(row)})" if limits(row) else ""


_CELL_KEYS = ["host", "baseline", "variant", "workload", "direction"]


def limited_cells(losses: pd.DataFrame) -> list[dict]:
    """Cells whose baseline was fio-bound or ran on a saturated CPU (loss.parquet's flags)."""
    flags = [f for f in LIMITS if f in losses]
    rows = losses[losses[flags].any(axis=1)] if flags else losses.iloc[:0]
    return [
        {
            "host": r["host"],
            "comparison": f"`{r['variant']}` vs `{r['baseline']}`",
            "cell": f"{r['workload']} {r['direction']}".strip(),
            "limit": limits(r),
            "bias": limit_bias(r),
            "job_cpu": fmt_num(r["baseline_job_cpu_pct"], 0),
            "busy": fmt_num(r["baseline_busy_pct"], 0),
        }
        for _, r in rows.drop_duplicates(_CELL_KEYS).iterrows()
    ]


#: what a limited baseline does to the loss, where the direction is known
BIAS_FIO_BOUND = "understated: the loss is a lower bound"
BIAS_UNKNOWN = "unknown: may be over- or understated"


def limit_bias(row) -> str:
    """The direction of the bias of a limited baseline's loss, said only where known: a fio-bound
    baseline (fio's own thread the limit, the device idle) could have gone faster, so the loss is
    understated; on a saturated CPU the arms compete with other work for the CPU and the
    encrypted arm needs more of it, so the loss may be overstated as well: direction unknown."""
    if bool(row.get("cpu_saturated") or False):
        return BIAS_UNKNOWN
    if bool(row.get("fio_bound") or False):
        return BIAS_FIO_BOUND
    return ""


def unchecked_cells(losses: pd.DataFrame) -> int:
    """Cells whose baseline recorded neither fio's CPU per job nor the machine's busy share."""
    values = losses.reindex(columns=["baseline_job_cpu_pct", "baseline_busy_pct"])
    return len(losses[values.isna().all(axis=1)].drop_duplicates(_CELL_KEYS))


def comparison_sections(losses: pd.DataFrame, pairs: list[tuple[str, str]]) -> list[dict]:
    """One section per comparison, in ``pairs`` order (the headline first): its label, stacks,
    SCS-shaped tables, detailed loss tables and how many of its rows are significant."""
    out = []
    for k, (baseline, variant) in enumerate(pairs):
        rows = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
        out.append(
            {"label": label((baseline, variant)), "baseline": baseline, "variant": variant}
            | {"headline": k == 0, "scs_tables": scs_tables(rows), **_tally(rows)}
            | {"loss_sections": loss_sections(rows)}
        )
    return out


def _tally(rows: pd.DataFrame) -> dict:
    """How many of ``rows`` are significant, their decisions, how many there are."""
    n_significant = int((rows["verdict"] == "significant").sum())
    return {"n_significant": n_significant, "decisions": decision_counts(rows), "n_rows": len(rows)}


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


def _pbkdf_result(row) -> str:
    if row["kind"] == "pbkdf2":
        return f"{fmt_num(row['iterations_per_s'], 0)} iterations/s"
    return (
        f"{fmt_num(row['time_cost'], 0)} iterations, {fmt_num(row['memory_kib'], 0)} KiB, "
        f"{fmt_num(row['threads'], 0)} threads"
    )


def _cryptsetup(cs: pd.DataFrame) -> dict:
    if cs.empty:
        return {"present": False, "ciphers": [], "pbkdf": [], "failures": []}
    failures = cs[~cs["available"].fillna(True).astype(bool)]
    pbkdf = cs[cs["kind"].isin(["pbkdf2", "argon2"])]
    return {
        "present": True,
        "ciphers": [
            {
                "host": r["host"],
                "algorithm": fmt_text(r["algorithm"]) + estimate_mark(r),
                "key_bits": fmt_num(r["key_bits"], 0),
                "enc": fmt_num(r["encryption_mib_s"], 1),
                "dec": fmt_num(r["decryption_mib_s"], 1),
            }
            for _, r in available_ciphers(cs).iterrows()
        ],
        "pbkdf": [
            {"host": r["host"], "algorithm": fmt_text(r["algorithm"]), "value": _pbkdf_result(r)}
            for _, r in pbkdf.iterrows()
        ],
        "failures": sorted(
            {(r.host, fmt_text(r.algorithm), fmt_text(r.note)) for r in failures.itertuples()}
        ),
    }


#: metrics that get SCS-shaped tables (all metrics are in the detailed Results section)
SCS_TABLE_METRICS = ("bw_bytes", "iops", "clat_p99_ns")
#: the decided regions, worst first (the loss table's ``decision``; "undecided: ..." apart)
DECIDED = ("material", "moderate", "negligible", "moderate gain", "material gain")


def _margins(rows: pd.DataFrame) -> str:
    """``5 / 20 %``: the decision margins of a metric's rows, as the loss table records them."""
    lower, upper = rows["decision_lower_pct"].iloc[0], rows["decision_upper_pct"].iloc[0]
    return f"{fmt_num(lower, 0)} / {fmt_num(upper, 0)} %"


def _notes(rows: pd.DataFrame) -> pd.Series:
    """loss.parquet's ``note`` ("" when none): why a row is withheld (too few I/Os beyond a
    percentile, net CPU within idle noise, no usable pilot)."""
    return rows.get("note", pd.Series("", index=rows.index)).fillna("").astype(str)


def decision_counts(rows: pd.DataFrame) -> str:
    """``2 material, 1 moderate, 3 undecided, 2 withheld (too few I/Os)``: the rows' decisions,
    worst first."""
    notes = _notes(rows)
    reasons = "withheld (" + notes.str.split(":").str[0] + ")"
    withheld = notes.ne("")
    kinds = rows["decision"].map(decision_kind).mask(withheld, reasons).value_counts()
    order = [*DECIDED, "undecided", "insufficient", *sorted(set(reasons[withheld]))]
    return ", ".join(f"{kinds[k]} {k}" for k in order if k in kinds)


def _decision_sentence(rows: pd.DataFrame, describe) -> str:
    """How a metric's cells fall into its regions and, where some cost, the largest effect with
    its selection-adjusted interval (loss.parquet's ``largest``, ``selection_ci_*``)."""
    name = metric_heading(str(rows["metric"].iloc[0]))
    kind = str(rows["effect"].iloc[0])
    text = (
        f"{name} {kind} ({_margins(rows)} margins): {decision_counts(rows)} of {len(rows)} cells."
    )
    picked = rows[rows.get("largest", pd.Series(False, index=rows.index)).eq(True)]
    if rows["decision"].isin(["material", "moderate"]).any() and len(picked):
        w = picked.iloc[0]
        ci = fmt_ci(w["selection_ci_low"], w["selection_ci_high"])
        text += (
            f" Largest {kind}: {describe(w)}, {fmt_pct(w['effect_pct'])} {ci} "
            f"({int(w['n'])} pairs), an interval at "
            f"{fmt_num(100 * w['selection_confidence'], 2)} %: adjusted for picking the largest "
            f"of {int(w['family_cells'])} cells, {w['selection_decision']} on it."
        )
    return text


def tldr_sentences(losses: pd.DataFrame, hosts: list[dict], matrix: dict) -> list[str]:
    """The TL;DR, every number read from the loss table the paper prints (loss.parquet): per
    comparison, headline first; per metric the decisions by magnitude (IOPS rows that repeat
    bandwidth at a fixed block size are left out: the same test)."""
    conf = fmt_num(100 * float(losses["confidence"].iloc[0]), 0)
    multi_host, several_jobs = losses["host"].nunique() > 1, multi_job(losses)
    describe = partial(cell_words, multi_host=multi_host, with_job=several_jobs)
    backends = sorted({h["backend_short"] for h in hosts}) or ["an unknown backend"]
    out = []
    for baseline, variant in comparison_pairs(losses):
        lv = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
        lv = lv[(lv["derived_from"].fillna("") == "") & ((lv["n"] > 0) | _notes(lv).ne(""))]
        host_names = ", ".join(f"`{h}`" for h in sorted(lv["host"].dropna().unique()))
        cells = lv.drop_duplicates(["host", "workload", "job_slot", "direction"])
        out.append(
            f"`{variant}` against `{baseline}` on {host_names}, "
            f"measured with {' / '.join(backends)}: {len(cells)} cells, "
            f"{matrix['reps_text']} paired repetitions each, decided on {conf} % confidence "
            "intervals."
        )
        for metric in sorted_metrics(set(lv["metric"])):
            out.append(_decision_sentence(lv[lv["metric"] == metric], describe))
    return out


def recommendation(losses: pd.DataFrame, hosts: list[dict]) -> dict:
    """The recommendation over every metric an operator pays for
    (:func:`luksbench.publish.recommend.paper_recommendation`)."""
    multi_host, several_jobs = losses["host"].nunique() > 1, multi_job(losses)
    describe = partial(cell_words, multi_host=multi_host, with_job=several_jobs)
    return paper_recommendation(losses, hosts, describe)


def scs_tables(losses: pd.DataFrame) -> list[dict]:
    """Loss tables in the SCS post's shape: one per rw pattern (and direction), config pattern and
    metric; rows = host / stack / iodepth, columns = block sizes; cells = effect [CI] and a
    verdict mark. Cells of two config patterns never share a table."""
    losses = with_pattern(losses)
    multi_host = losses["host"].nunique() > 1
    several_jobs = multi_job(losses)
    folded = same_test_as_bandwidth(losses)
    shape_keys = ["pattern", "rw", "direction"]
    folded_shapes = set(losses.loc[folded, shape_keys].itertuples(index=False, name=None))
    losses = losses[~folded]
    tables = []
    shapes = losses.groupby(["pattern", "rw", "direction"], sort=False)
    for (pattern, rw, direction), sub_rw in sorted(
        shapes, key=lambda s: (s[0][0], rw_rank(s[0][1]), s[0][1], s[0][2])
    ):
        mixed = rw in MIXED_RW
        for metric in sorted_metrics(set(sub_rw["metric"]) & set(SCS_TABLE_METRICS)):
            sub = sub_rw[sub_rw["metric"] == metric]
            heading = metric_heading(metric)
            kind = str(sub["effect"].iloc[0])
            cols = sorted(sub["bs_bytes"].unique())
            rows = []
            keys = ["host", "baseline", "variant", "iodepth", "job_slot"]
            for (host, base, variant, qd, _), g in sub.groupby(keys, sort=True):
                versus = f" vs {base}" if sub["baseline"].nunique() > 1 else ""
                label = f"{host}: " if multi_host else ""
                label += f"{variant}{versus}, QD{int(qd)}"
                if several_jobs:
                    label += f", job `{g['job'].iloc[0]}`"
                at = g.drop_duplicates("bs_bytes").set_index("bs_bytes")
                cells = [
                    f"{effect_ci(at.loc[b])} {decision_kind(at.loc[b, 'decision'])}"
                    if b in at.index
                    else "not measured"
                    for b in cols
                ]
                rows.append(((host, variant != sub["variant"].iloc[0]), [label, *cells]))
            rows.sort(key=lambda r: r[0])
            tables.append(
                {
                    "title": f"{rw_words(rw).capitalize()}"
                    + (f" ({direction})" if mixed else "")
                    + (f", pattern `{pattern}`" if pattern else "")
                    + f": {heading.lower() if heading != 'IOPS' else 'IOPS'} {kind}"
                    + (
                        " (and IOPS: the same test at one block size)"
                        if metric == "bw_bytes" and (pattern, rw, direction) in folded_shapes
                        else ""
                    ),
                    "header": ["stack", *(f"{bs_human(b)} % {kind}" for b in cols)],
                    "rows": [row for _, row in rows],
                }
            )
    return tables


def _stack_gaps(run: Run) -> list[str]:
    """Optional stacks that could not be built (with the reason), raw files left out at ingest,
    planned stacks without results."""
    unavailable = unavailable_stacks(run.stacks)
    out = []
    for u in unavailable:
        kind = f" ({u['kind']})" if u.get("kind") else ""
        out.append(
            f"Stack `{u['stack']}`{kind} could not be built on `{u['host']}`: {u['reason']}. It "
            "is optional, so the run went on without it: it is in no table or figure."
        )
    problems = run.table("problems", ["severity", "file", "reason"])
    for row in problems[problems["severity"] == "excluded"].itertuples():
        out.append(f"Raw file `{row.file}` was left out: {row.reason}.")
    gone = {(u["host"], u["stack"]) for u in unavailable}
    measured = {h: set(g["stack"].unique()) for h, g in run.fio.groupby("host")}
    for host, stacks in sorted(planned_stacks(run.env).items()):
        absent = sorted(s for s in set(stacks) - measured.get(host, set()) if (host, s) not in gone)
        if absent:
            out.append(
                f"On `{host}` the plan listed stacks {', '.join(f'`{s}`' for s in absent)} that "
                "have no results: they were skipped and are not in any table or figure."
            )
    return out


def unpaired_cells(losses: pd.DataFrame) -> list[str]:
    """Cells measured on one stack of their comparison only: every loss row of the cell has no
    pair, no withholding note (a withheld metric is no missing stack) and one side's mean
    missing. Each named with the stack that has results."""
    if losses.empty:
        return []
    one_side = losses["baseline_mean"].isna() ^ losses["variant_mean"].isna()
    unpaired = losses["n"].eq(0) & _notes(losses).eq("") & one_side
    keys = ["host", "baseline", "variant", "workload"]
    whole = unpaired.groupby([losses[k] for k in keys]).transform("all")
    rows = losses[unpaired & whole].drop_duplicates(keys)
    multi_host = losses["host"].nunique() > 1
    return sorted(
        f"{(str(r['host']) + ': ') if multi_host else ''}{r['workload']} "
        f"(only `{r['baseline'] if pd.notna(r['baseline_mean']) else r['variant']}`, "
        f"comparison `{r['variant']}` vs `{r['baseline']}`)"
        for _, r in rows.iterrows()
    )


def all_pairs_dropped(losses: pd.DataFrame) -> list[str]:
    """Rows (cell and metric) with pairs measured on both stacks but none usable: no withholding
    note, every pair dropped."""
    if losses.empty:
        return []
    rows = losses[losses["n"].eq(0) & _notes(losses).eq("") & losses["n_dropped"].gt(0)]
    return sorted(
        f"`{r['variant']}` vs `{r['baseline']}` {r['workload']} {metric_heading(r['metric'])}"
        for _, r in rows.iterrows()
    )


def gaps(run: Run, figures_found: set[str]) -> list[str]:
    """Sentences on what this run lacks: stacks (:func:`_stack_gaps`), cells without pairs,
    cipher benchmarks that did not run, figure families without data."""
    out = _stack_gaps(run)
    cells = unpaired_cells(run.loss)
    if cells:
        out.append(
            f"{len(cells)} cells have results on one stack only (no pairs): {', '.join(cells)}."
        )
    dropped = all_pairs_dropped(run.loss)
    if dropped:
        out.append(
            f"{len(dropped)} rows have no usable pair (every pair dropped: a missing side or a "
            f"value at or below 0): {', '.join(dropped)}."
        )
    cs = run.cryptsetup
    for host in sorted(set(run.env["host"]) - set(cs["host"])):
        out.append(f"No `cryptsetup benchmark` output was recorded on `{host}`.")
    if len(cs):
        skipped = cs[
            (cs["kind"] == "cipher")
            & ~cs["available"].fillna(True).astype(bool)
            & cs["algorithm"].fillna("").astype(str).str.strip().ne("")
        ]
        for host, g in skipped.groupby("host"):
            pairs = zip(g["algorithm"], g["key_bits"], strict=True)
            ciphers = ", ".join(sorted({f"{a} {fmt_num(k, 0)}b" for a, k in pairs}))
            out.append(f"On `{host}` the cipher benchmark skipped {ciphers} (N/A).")
    if "latency" not in figures_found:
        out.append(
            "No completion-latency histograms: the raw files carry no json+ `bins`, so there is "
            "no latency table and no percentile figure."
        )
    if "cpu" not in figures_found:
        out.append("No CPU sidecars (`rep<k>.cpu.json`): no CPU-cost figure.")
    return out


def figure_sections(figures_dir: Path, out_md: Path, net: bool = False) -> list[dict]:
    """The run's figures from the figure index, grouped by family (in FIGURE_FAMILIES order),
    linked relative to the Markdown file (none when no figures were drawn); each family also
    lists the figures the catalog did not draw, with why (``skipped``). ``net``: the CPU values
    are net of the idle baseline (:func:`~luksbench.publish.text.cpu_net`)."""
    indexed = (Path(figures_dir) / INDEX).exists()
    entries = read_index(figures_dir) if indexed else []
    not_drawn = read_skipped(figures_dir) if indexed else []
    sections = []
    for kind, (heading, intro) in FIGURE_FAMILIES.items():
        found = sorted(  # the SCS post's order: read, write, randread, randwrite; bandwidth first
            (e for e in entries if e["family"] == kind),
            key=lambda e: (
                min(rw_rank(w) for w in e["name"].split("-")),
                e["name"].endswith("iops"),
                e["name"],
            ),
        )
        skipped = [
            {
                "caption": md_escape_keeping_code(e["caption"]),
                "reason": md_escape_keeping_code(e["reason"]),
            }
            for e in not_drawn
            if e["family"] == kind
        ]
        if not found and not skipped:
            continue
        figures = [
            {
                "caption": md_escape_keeping_code(e["caption"]),
                "png": quote(_relative(Path(figures_dir) / e["files"][0], out_md)),
                "name": e["name"],
            }
            for e in found
        ]
        intro = intro.replace("{cpu_basis}", cpu_basis(net))
        sections.append(
            {"kind": kind, "heading": heading, "intro": intro, "figures": figures}
            | {"skipped": skipped}
        )
    return sections


def summary_figure(sections: list[dict]) -> dict | None:
    """The figure that answers at a glance, for the top of the post: the (first host's)
    bandwidth heatmap, else the headline comparison's cost chart (its data all withheld: none)."""
    drawn = {f["name"]: f for sec in sections for f in sec["figures"]}
    heatmaps = sorted(n for n in drawn if n.startswith("heatmap-") and n.endswith("-bw_bytes"))
    if heatmaps:
        note = (
            "Every cell's bandwidth loss with its interval and the decision it supports; "
            "latency, CPU and every other metric are in the tables and figures below"
        )
        return drawn[heatmaps[0]] | {"note": note}
    if "loss" in drawn:
        return drawn["loss"] | {"note": "Every cell's interval against the decision regions"}
    return None


def _relative(path: Path, out_md: Path) -> str:
    """``path`` as a link from the Markdown file ``out_md``."""
    return Path(os.path.relpath(path, Path(out_md).parent)).as_posix()


def front_matter_yaml(fields: dict) -> str:
    """YAML front matter: scalars as JSON (valid YAML), lists as block sequences as Jekyll sites
    write them, ``date`` bare when it is one (a YAML date)."""
    lines = []
    for key, value in fields.items():
        if isinstance(value, list):
            lines += [f"{key}:", *(f"  - {_yaml_json(v)}" for v in value)]
        else:
            bare = key == "date" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(value))
            lines.append(f"{key}: {value if bare else _yaml_json(value)}")
    return "\n".join(lines) + "\n"


_YAML_ESCAPES = {c: f"\\u{ord(c):04x}" for c in "<>&\x85\u2028\u2029"}


def _yaml_json(value) -> str:
    """``value`` as JSON (valid YAML), with no markup character nor line break of YAML 1.1 in
    its text: ``<``, ``>``, ``&`` as \\u escapes, which every YAML and JSON reader decodes."""
    return json.dumps(value, ensure_ascii=False).translate(str.maketrans(_YAML_ESCAPES))


def _front_matter(run: Run, name: str, variant: str, title: str, author: str, hosts, extra) -> dict:
    """The post's front matter: generated fields, then config ``paper.front_matter`` over them."""
    generated = f"What does {variant} cost? luksbench run {md_escape(name)}"
    fields = {
        "title": title or generated,
        "date": run_date(run.env, run.fio),
        "author": author,
        "run": name,
        "backend": ", ".join(dict.fromkeys(h["backend"] for h in hosts)),
        "generator": f"luksbench {package_version()}",
        **(extra or {}),
    }
    # the heading: a title from the config escaped (a generated one is built from escaped names)
    heading = fields["title"] if fields["title"] == generated else md_escape(fields["title"])
    return {
        "run": md_escape(name),
        "title": heading,
        "front_matter_yaml": front_matter_yaml(fields),
    }


def _story(run: Run, name: str, pairs: list[Pair], hosts: list[dict], matrix: dict) -> dict:
    """TL;DR, recommendation and one section per comparison, from the loss table."""
    losses = run.loss
    return {
        "comparisons": comparison_sections(losses, pairs),
        "confidence_pct": fmt_num(100 * run.confidence, 0),
        "tldr": " ".join(tldr_sentences(losses, hosts, matrix)),
        "recommendation": recommendation(losses, hosts),
        "host_summary": host_summary(losses, hosts, name),
        **_tally(losses),
        "intervals_cover": intervals_cover(losses),
        "interval_adjustments": interval_adjustments(losses),
        "limited_cells": limited_cells(losses),
        "limits": {"job": fmt_num(JOB_CPU_LIMIT_PCT, 0), "busy": fmt_num(BUSY_LIMIT_PCT, 0)}
        | {"unchecked": unchecked_cells(losses)},
        "regions": [
            {
                "metrics": ", ".join(metric_heading(m) for m in sorted_metrics(set(g["metric"]))),
                "margins": _margins(g),
            }
            for _, g in losses.groupby(["decision_lower_pct", "decision_upper_pct"])
        ],
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


def order_effects(
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
    rows = rows[_notes(rows).eq("") & rows["n"].ge(2)]
    return (
        rows.drop_duplicates(["host", "workload", "job_slot", "direction", "metric"])["metric"]
        .value_counts()
        .to_dict()
    )


def order_withheld(
    order: pd.DataFrame, baseline: str, variant: str, losses: pd.DataFrame
) -> list[str]:
    """Metrics whose order effect :func:`order_effects` leaves out, with why (the loss table's
    notes of that metric)."""
    rows = order[(order["baseline"] == baseline) & (order["variant"] == variant)]
    shown = _shown_cells(losses, baseline, variant)
    mine = losses[(losses["baseline"] == baseline) & (losses["variant"] == variant)]
    out = []
    for metric in sorted_metrics(set(rows.loc[rows["n_cells"] >= 2, "metric"])):
        n = int(rows.loc[rows["metric"] == metric, "n_cells"].iloc[0])
        if n <= shown.get(metric, 0):
            continue
        notes = _notes(mine[mine["metric"] == metric])
        reasons = sorted(set(notes[notes.ne("")].str.split(":").str[0]))
        why = f"withheld ({', '.join(reasons)})" if reasons else "without a decision"
        decided = shown.get(metric, 0)
        out.append(
            f"{metric_heading(metric)}: not quoted, "
            + (f"all its cells are {why}" if not decided else f"its cells are partly {why}")
        )
    return out


def _published(run: Run, reference_dir: Path | None) -> dict:
    """This run beside the transcribed published results."""
    fio, refs = run.fio, read_references(reference_dir)
    by_cell = fio.reindex(columns=["host", "workload", "direct"]).dropna()  # none without direct
    direct = sorted(int(d) for d in by_cell["direct"].unique())
    cell_direct = {(str(h), str(w)): int(d) for h, w, d in by_cell.itertuples(index=False)}
    return {
        "scs": compare_scs(run.loss, refs.get("scs")),
        "ceph": compare_ceph(run.loss, refs.get("ceph")),
        "raid5": compare_raid5(run.loss, refs.get("raid5"), direct, cell_direct),
    }


def _machine(run: Run, figure_secs: list[dict]) -> dict:
    """Cipher benchmark, crypto ceilings and what the run lacks."""
    ceilings = crypto_ceilings(run.cryptsetup, run.stacks, run.env)
    return {
        "cryptsetup": _cryptsetup(run.cryptsetup),
        "ceilings": [
            c | {"text": ceiling_text(c), "available": c["reason"] is None} for c in ceilings
        ],
        "gaps": gaps(run, {s["kind"] for s in figure_secs}),
    }


def _provenance(run: Run) -> dict:
    facts = provenance_facts(run.env)  # the raw run's: the hash is over the plan as recorded
    return {
        "git_commit": md_escape(facts["git_commit"]),
        "config_hash": md_escape(facts["config_hash"]),
        "sources": [{"name": n, "sha256": d[:16]} for n, d in run.digests().items()],
        "luksbench_version": package_version(),
    }


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
    front_matter: dict | None = None,
    machine_paths: bool = False,
) -> dict:
    """Everything the template needs, as formatted strings (no raw floats reach the template).

    Figure links are relative to ``out_md``'s folder. The headline is loss.parquet's first
    comparison unless ``baseline``/``variant`` name another; ``title`` "" = generated;
    ``reference_dir`` default: the repository's ``data/reference``; ``front_matter`` (config
    ``paper.front_matter``) replaces generated front matter fields; ``machine_paths`` (config
    ``paper.machine_paths``) prints the measuring machine's device paths."""
    raw = load_run(processed_dir)
    data = markdown_safe(raw)  # every text from the run escaped before a sentence is built
    pairs = data.headline_first(*(md_escape(s) if s else None for s in (baseline, variant)))
    hosts = _hosts(data.env, data.stacks)
    matrix = _matrix(data.fio, data.env)
    figure_secs = figure_sections(figures_dir, Path(out_md), cpu_net(data.fio))
    order = data.table("order", ["baseline", "variant", "metric", "n_cells"])
    return {
        **_front_matter(data, run, pairs[0][1], title, author, hosts, front_matter),
        "baseline": pairs[0][0],
        "variant": pairs[0][1],
        **_story(data, run, pairs, hosts, matrix),
        "patterns": pattern_facts(data.fio, data.env),
        "hosts": hosts,
        "job_devices": job_devices(data.env, machine_paths),
        "stacks": _stacks(data.stacks, pairs),
        "matrix": matrix,
        "figure_sections": figure_secs,
        "summary_figure": summary_figure(figure_secs),
        "n_figures": sum(len(s["figures"]) for s in figure_secs),
        "order_effects": order_effects(order, *pairs[0], data.loss),
        "order_withheld": order_withheld(order, *pairs[0], data.loss),
        "sequential": sequential_design(data, pairs),
        "figures_rel": _relative(Path(figures_dir), out_md),
        **_machine(data, figure_secs),
        "tuning": recommendations(data.table("tuning"), data.env, hosts),
        **_published(data, reference_dir),
        **_provenance(raw),
    }


def markdown_safe(run: Run) -> Run:
    """``run`` with every text of its tables escaped for Markdown (:func:`md_escape_frame`)."""
    return Run(run.processed_dir, {n: md_escape_frame(t) for n, t in run.tables.items()})
