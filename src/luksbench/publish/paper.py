"""The paper's context: everything ``templates/paper.md.j2`` prints, as formatted strings.

No number is typed by hand: every number comes from ``data/processed/<run>/*.parquet`` or the
transcribed published results in ``data/reference/*.csv``; formatting happens here, wording in the
template. One section per comparison of loss.parquet, the headline first. The sections are built
in :mod:`~luksbench.publish.paper_sentences` (the TL;DR from ``paper_numbers.parquet``, the
numbers the loss stage writes for it), :mod:`~luksbench.publish.paper_tables`,
:mod:`~luksbench.publish.paper_gaps` and :mod:`~luksbench.publish.paper_figures`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from luksbench.analysis.contrasts import Pair
from luksbench.analysis.paper_numbers import NUMBERS_TABLE
from luksbench.analysis.saturation import BUSY_LIMIT_PCT, JOB_CPU_LIMIT_PCT
from luksbench.publish.ceilings import ceiling_text, crypto_ceilings
from luksbench.publish.paper_ceph import ceph_section
from luksbench.publish.paper_figures import figure_sections, relative_link, summary_figure
from luksbench.publish.paper_gaps import gaps
from luksbench.publish.paper_sentences import (
    host_summary,
    interval_adjustments,
    intervals_cover,
    margins,
    order_effect_phrases,
    order_withheld,
    recommendation,
    sequential_design,
    tldr_sentences,
)
from luksbench.publish.paper_tables import (
    comparison_sections,
    cryptsetup_section,
    limited_cells,
    tally,
    unchecked_cells,
)
from luksbench.publish.recommend import recommendations
from luksbench.publish.references import compare_ceph, compare_raid5, compare_scs, read_references
from luksbench.publish.run import (
    Run,
    load_run,
    measured_matrix,
    package_version,
    pattern_facts,
    provenance_facts,
    run_date,
    unavailable_stacks,
)
from luksbench.publish.text import (
    cpu_net,
    fmt_bool,
    fmt_num,
    fmt_text,
    md_escape,
    md_escape_frame,
    metric_heading,
    missing,
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
        coordinator = None if missing(c := row.get("coordinator")) else c
        hosts.append(
            {"host": row["host"], **{k: fmt_text(row.get(k)) for k in _HOST_TEXT}}
            | {"aes": fmt_bool(row["aes"]), "vaes": fmt_bool(row["vaes"]), "backend": backend}
            | {"backend_short": short, "backend_long": long, "coordinator": coordinator}
        )
    return hosts


def job_devices(devices: pd.DataFrame, machine_paths: bool = False) -> list[dict]:
    """Per host and device of the job_devices table (env.json's ``job_devices``): NUMA node,
    queues, scheduler, poll queues and the CPUs the fio jobs ran on. The device is named by its
    block device (and whether it holds the scratch directory), its path on the measuring machine
    only with ``machine_paths`` (config ``paper.machine_paths``)."""
    return [
        {"host": d["host"], "device": _device_text(d, machine_paths)}
        | {k: fmt_text(d.get(k)) for k in ("numa_node", "queues", "scheduler")}
        | {"poll": "yes" if _true(d.get("io_poll")) else "no"}
        | {"cpus": "any" if missing(d.get("job_cpus")) else d["job_cpus"] or "any"}
        for d in devices.to_dict("records")
    ]


def _true(value) -> bool:
    return not missing(value) and bool(value)


def _device_text(device: dict, machine_paths: bool) -> str:
    block = fmt_text(device.get("block_device"))
    if machine_paths:
        return f"`{device.get('device')}` ({block})"
    holds = _true(device.get("holds_scratch"))
    what = "the scratch directory's disk" if holds else "a planned device"
    return f"{what}, `{block}`" if block != "n/a" else what


# Stack settings a reader needs to judge the comparison (the rest, e.g. paths, stays in the
# processed table).
_STACK_SETTINGS = ("luks_type", "sector_size", "hash", "pbkdf")
_STACK_SETTINGS += ("device_size_bytes", "loop_direct_io")


def _stacks(stacks: pd.DataFrame, notes: pd.DataFrame, pairs: list[tuple[str, str]]) -> list[dict]:
    """The stacks that were built, with their role in the comparisons and their notes (the
    stack_notes table; unavailable ones are in "Not in this run")."""
    gone = {(u["host"], u["stack"]) for u in unavailable_stacks(stacks)}
    noted = {k: list(g["note"]) for k, g in notes.groupby(["host", "stack"], sort=False)}
    rows = []
    for _, row in stacks.iterrows():
        if (str(row["host"]), str(row["stack"])) in gone:
            continue
        settings = [f"{k} {row.get(k)}" for k in _STACK_SETTINGS if not missing(row.get(k))]
        settings += [f"note: {note}" for note in noted.get((row["host"], row["stack"]), [])]
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


def _matrix(fio: pd.DataFrame, plan_fio: pd.DataFrame) -> dict:
    reps = fio.groupby(["host", "stack", "workload"])["rep"].nunique()
    runtime_s = fio["runtime_ms"].astype(float) / 1000
    ioengines = sorted(fio["ioengine"].dropna().unique()) if "ioengine" in fio else []
    direct = sorted(fio["direct"].dropna().unique()) if "direct" in fio else []
    runtime = plan_fio.loc[plan_fio["option"] == "runtime_s", "option_value"].dropna()
    reps_min, reps_max = (int(reps.min()), int(reps.max())) if len(reps) else (0, 0)
    return {
        **measured_matrix(fio),
        "n_cells": fio["workload"].nunique(),
        "n_stacks": fio["stack"].nunique(),
        "stacks": ", ".join(f"`{s}`" for s in sorted(fio["stack"].unique())),
        "reps_text": str(reps_min) if reps_min == reps_max else f"{reps_min} to {reps_max}",
        "n_results": int(fio[["host", "stack", "workload", "rep"]].drop_duplicates().shape[0]),
        "runtime_s": fmt_num(runtime_s.median(), 1),
        "runtime_planned_s": fmt_text(runtime.iloc[-1] if len(runtime) else None),
        "ioengine": ", ".join(ioengines) or "n/a",
        "direct": ", ".join(str(int(d)) for d in direct) or "n/a",
        "fio_versions": ", ".join(sorted(fio["fio_version"].dropna().unique())) or "n/a",
    }


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
        "tldr": " ".join(
            tldr_sentences(
                losses, hosts, matrix, run.tables.get(NUMBERS_TABLE), cpu_net=cpu_net(run.fio)
            )
        ),
        "recommendation": recommendation(losses, hosts),
        "host_summary": host_summary(losses, hosts, name),
        **tally(losses),
        "intervals_cover": intervals_cover(losses),
        "interval_adjustments": interval_adjustments(losses),
        "limited_cells": limited_cells(losses),
        "limits": {"job": fmt_num(JOB_CPU_LIMIT_PCT, 0), "busy": fmt_num(BUSY_LIMIT_PCT, 0)}
        | {"unchecked": unchecked_cells(losses)},
        "regions": [
            {
                "metrics": ", ".join(metric_heading(m) for m in sorted_metrics(set(g["metric"]))),
                "margins": margins(g),
            }
            for _, g in losses.groupby(["decision_lower_pct", "decision_upper_pct"])
        ],
    }


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
        "cryptsetup": cryptsetup_section(run.cryptsetup),
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
    matrix = _matrix(data.fio, data.table("plan_fio", ["host", "option", "option_value"]))
    figure_secs = figure_sections(figures_dir, Path(out_md), cpu_net(data.fio))
    order = data.table("order", ["baseline", "variant", "metric", "n_cells"])
    return {
        **_front_matter(data, run, pairs[0][1], title, author, hosts, front_matter),
        "baseline": pairs[0][0],
        "variant": pairs[0][1],
        **_story(data, run, pairs, hosts, matrix),
        "patterns": pattern_facts(data.fio, data.patterns),
        "hosts": hosts,
        "job_devices": job_devices(data.table("job_devices", ["host"]), machine_paths),
        "stacks": _stacks(data.stacks, data.table("stack_notes", ["host", "stack", "note"]), pairs),
        "matrix": matrix,
        "figure_sections": figure_secs,
        "summary_figure": summary_figure(figure_secs),
        "n_figures": sum(len(s["figures"]) for s in figure_secs),
        "order_effects": order_effect_phrases(order, *pairs[0], data.loss),
        "order_withheld": order_withheld(order, *pairs[0], data.loss),
        "sequential": sequential_design(data, pairs),
        "figures_rel": relative_link(Path(figures_dir), out_md),
        **_machine(data, figure_secs),
        "tuning": recommendations(
            data.table("tuning"),
            data.plan_stacks,
            data.table("perf_flags", ["host", "stack", "flag", "planned"]),
            hosts,
        ),
        "ceph_section": ceph_section(data),
        **_published(data, reference_dir),
        **_provenance(raw),
    }


def markdown_safe(run: Run) -> Run:
    """``run`` with every text of its tables escaped for Markdown (:func:`md_escape_frame`)."""
    return Run(run.processed_dir, {n: md_escape_frame(t) for n, t in run.tables.items()})
