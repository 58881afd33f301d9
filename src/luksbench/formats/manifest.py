"""``<host>/fio/manifest.json`` and ``<host>/fio/sessions/*.json``: how a run was measured.

The runner rewrites ``manifest.json`` (the run's index) at the end of every ``run-fio`` session
and leaves a write-once copy in ``fio/sessions/<start time>.json`` (an adaptive pilot writes
``pilot-manifest.json``). The document (keys the readers use)::

    {"version": 2, "run", "host", "seed", "repetitions", "cell_repetitions": {cell: n}, "targets", "adaptive",
     "backend", "backend_reason", "baseline", "fleet": {"mode": "clients", "hosts": [...]} | null,
     "stacks": [...], "unavailable_stacks": {stack: reason}, "cells": [...],
     "sessions", "session",                                    # planned k, this stack-up's id
     "stack_up",                # the stack-up's id (a sequential round's session is its place
                                # in the cycle, session-1 .. session-k, each round a stack-up)
     "pairing", "counterbalance", "cell_order",                # the design, in words
     "io_size_bytes", "cpu_idle_baseline", "fio_clocksource", "fio",
     "cpu_idle_samples": [{"round", "started", ...idle sample...}],  # one per round measured
     "fixed_rates": {cell: {"rate_pct", "rate_iops", "rate_iops_per_job",  # all jobs, each
                            "pilot_iops": {stack: iops}}},
     "started", "ended", "complete", "interrupted", "failed": [...],
     "stack_descriptions": {"stacks": {stack: {...}}, ...},    # stack-up's description
     "runs": [{"index", "round", "rep", "stack", "workload", "session", "position_in_cell", "path",
               "cpu_path", "started", "ended", "skipped_existing", "status",
               "cpu_idle_sample": index in cpu_idle_samples}, ...]}

Version 1 (no ``version``) is the same document; readers take the keys they know and leave
the others. Standard library only: the test box imports this.
"""

from __future__ import annotations

from pathlib import Path

from luksbench.formats.layout import read_json_object
from luksbench.formats.record import record_version, write_record

MANIFEST_NAME = "manifest.json"
PILOT_MANIFEST_NAME = "pilot-manifest.json"
SESSIONS_DIR = "sessions"

PAIRING = (
    "rep k of every stack forms pair k (same cell, same session, run back to back); a pair is never "
    "completed in another session (stack-up)"
)
COUNTERBALANCE = (
    "balanced per cell: rounds 1-2, 3-4, ... run each cell once in order and once reversed, which "
    "first alternating over blocks and over a seeded permutation of the cells; position_in_cell "
    "of each run records its place"
)
CELL_ORDER = (
    "round k shuffles the cells with random.Random(seed + k) and runs those with at "
    "least k repetitions (cell_repetitions)"
)

MANIFEST_VERSION = 2
MANIFEST_VERSIONS = (1, 2)


def read_manifest(path: Path) -> dict:
    """The one reader of a manifest or session record: its document as the current version's
    (ValueError when it is no JSON object; RecordVersionError, naming the file, for an unknown
    version)."""
    return migrated_manifest(read_json_object(path), str(path))


def migrated_manifest(doc: dict, source: str = "manifest") -> dict:
    """A manifest of any known version as the current one's: version 1 is version 2 without the
    field, and one session where it names none."""
    if record_version(doc, source, "manifest", MANIFEST_VERSIONS) == 1:
        doc = _migrate_v1(doc)
    return {**doc, "version": MANIFEST_VERSION}


def _migrate_v1(doc: dict) -> dict:
    """Version 1 (no ``version``): a manifest written before sessions were recorded measured one
    session."""
    return {"sessions": 1, **doc}


def write_manifest(path: Path, doc: dict, mode: int = 0o644) -> None:
    """The one writer of a manifest and of a session's record (written once: ``mode`` 0o444)."""
    write_record(path, doc, MANIFEST_VERSION, mode)


def session_records(host_dir: Path) -> list[tuple[Path, str]]:
    """(manifest file, session name) of every session of a host: the copies in ``fio/sessions/``
    when there are any, else ``fio/manifest.json`` (and the adaptive pilot's)."""
    fio = Path(host_dir) / "fio"
    if sessions := sorted((fio / SESSIONS_DIR).glob("*.json")):
        return [(p, p.stem) for p in sessions]
    candidates = (fio / PILOT_MANIFEST_NAME, fio / MANIFEST_NAME)
    return [(p, p.stem) for p in candidates if p.exists()]


def new_session_path(sessions_dir: Path, started: str) -> Path:
    """A not yet existing name for a session's record, from its start time."""
    stamp = "".join(ch for ch in started if ch.isalnum())
    path = Path(sessions_dir) / f"{stamp}.json"
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(sessions_dir) / f"{stamp}-{suffix}.json"
    return path


def run_times(manifest: dict) -> dict[tuple[str, str, int], tuple[str | None, str | None]]:
    """(stack, workload, rep) -> (started, ended) of every run the manifest timed."""
    return {
        (r["stack"], r["workload"], r["rep"]): (r.get("started"), r.get("ended"))
        for r in manifest.get("runs", [])
        if r.get("started")
    }


def result_sessions(manifest: dict) -> dict[str, str]:
    """Path (inside the host folder) -> the session (stack-up) that measured it, for every result
    the manifest records as written ("" for a record from before sessions were recorded)."""
    runs = manifest.get("runs")
    return {
        r["path"]: str(r.get("session") or "")
        for r in (runs if isinstance(runs, list) else [])
        if isinstance(r, dict) and isinstance(r.get("path"), str) and r.get("status") != "failed"
    }


def fleet_servers(manifest: dict) -> list[dict]:
    """The fio servers of a fleet run (``fleet.hosts`` in client mode), or []."""
    fleet = manifest.get("fleet")
    if not isinstance(fleet, dict) or fleet.get("mode") != "clients":
        return []
    return [h for h in fleet.get("hosts") or [] if isinstance(h, dict) and h.get("name")]


def stack_descriptions(manifest: dict) -> tuple[dict[str, dict], dict[str, str]]:
    """({stack: description}, {stack: why unavailable}): stack-up's descriptions, with a stub
    for every optional stack that could not be built."""
    data = manifest.get("stack_descriptions") or {}
    stacks = data.get("stacks", data) if isinstance(data.get("stacks"), dict) else data
    unavailable = manifest.get("unavailable_stacks") or {}
    unavailable = unavailable if isinstance(unavailable, dict) else {}
    stacks = {**{n: {"unavailable": why} for n, why in unavailable.items()}, **stacks}
    return stacks, unavailable
