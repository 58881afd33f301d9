"""Raw run folder -> tidy tables (pandas), and the processed parquet files.

``fio_table``         one row per fio job x direction: the parser's columns, where the file sits in
                      the raw layout, its CPU sidecar (net of the idle baseline: cpucost) and the
                      json+ completion-latency percentiles (tails); fleet rows are per fio server.
``cryptsetup_table``  ``cryptsetup benchmark`` rows per host.
``env_table``         one row per host with the key facts of ``env.json`` flattened.
``stacks_table``      one row per host x stack from ``fio/manifest.json``'s stack descriptions.
``schedule_table``    one row per fio run of every session's manifest: when it ran, in which round.
``latency``           the json+ histograms of the fio table's measured rows (:data:`LATENCY_COLUMNS`).
``write_processed``   all of them as ``<processed_dir>/<table>.parquet`` and ``.csv``, incremental
                      (only new or changed raw files are parsed) and parallel.

Strict by design: every raw file that cannot be read, does not follow the layout, or holds a failed
fio job is collected and reported in one :class:`IngestError` that names each file and why. Raw is
read-only: nothing here writes into ``raw_dir``.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from luksbench.analysis import cpucost, dictionary, saturation, tails
from luksbench.analysis.stats import active_rows, with_dtypes, with_pattern
from luksbench.formats import cryptsetup, opensslspeed
from luksbench.formats.envdoc import env_facts, parse_env_json
from luksbench.formats.fio import (
    FIO_COLUMNS,
    FioParseError,
    document_histograms,
    document_tuples,
    implausible_numbers,
    load_fio_document,
)
from luksbench.formats.layout import (
    REP_NAME,
    LayoutError,
    RepPath,
    Workload,
    read_json_object,
    rep_of_key,
    replace_file,
    replacing,
)
from luksbench.formats.manifest import (
    fleet_servers,
    result_sessions,
    session_records,
    stack_descriptions,
)
from luksbench.formats.sidecar import read_cpu_sidecar
from luksbench.formats.targets import read_targets

GIB = 2**30

#: columns added by :func:`fio_table` in front of the parser's columns
FIO_LAYOUT_COLUMNS = ["run", "host", "stack", "workload", "pattern", "rep", "job_slot"]
#: columns after the parser's: from io_bytes, the CPU sidecar, the adaptive design
#: (<host>/fio/targets.json) and the sessions (meanings: :mod:`dictionary`); host_dir is the raw
#: layout's <host> folder, which differs from ``host`` only for fleet (fio client/server) results
FIO_DERIVED_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "io_bs_bytes io_gib busy_cpu_s busy_cpu_pct sys_cpu_s cpu_interval_s busy_cpu_s_per_gib "
    "sys_cpu_s_per_gib target_pairs hit_cap pilot_pairs look_confidence host_dir session "
    "sessions_planned"
).split()

ENV_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "run host hostname kernel cpu_model cpu_count aes vaes backend backend_reason fio_version "
    "cryptsetup_version qemu_version env_json"
).split()
ENV_DTYPES = {"boolean": ("aes", "vaes"), "Int64": ("cpu_count",)}  # the others: string

#: an optional stack that could not be built has a row too: available false, with the reason
STACKS_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "run host stack kind backend cipher key_bits description_json available reason"
).split()
STACKS_DTYPES = {"Int64": ("key_bits",), "boolean": ("available",)}  # the others: string

#: completion-latency histograms from the json+ ``bins``, one row per bin of an active row
LATENCY_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "host stack workload rw bs_bytes iodepth rep job_slot direction pattern ns count"
).split()

#: the processed tables, in the order they are written (``<processed_dir>/<name>.parquet``)
PROCESSED_TABLES = ("fio", "latency", "cryptsetup", "env", "stacks", "schedule", "problems")
PROCESSED_FILES = tuple(f"{name}.parquet" for name in PROCESSED_TABLES)


class IngestError(ValueError):
    """One or more raw files could not be ingested; ``problems`` lists (path, reason)."""

    def __init__(self, raw_dir: Path, problems: list[tuple[Path, str]]):
        self.raw_dir = Path(raw_dir)
        self.problems = problems
        lines = [f"{len(problems)} bad raw file(s) under {raw_dir}:"]
        lines += [f"  {path}: {reason}" for path, reason in problems]
        super().__init__("\n".join(lines))


def run_name(raw_dir: Path) -> str:
    return Path(raw_dir).resolve().name


def raw_run_dir(run: str, raw_dir: Path) -> Path:
    """``raw_dir`` as the raw folder of run ``run``; refused, naming the run, when it is missing or
    is another run's."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise FileNotFoundError(f"run {run!r} does not exist: no raw data in {raw_dir}")
    if run_name(raw_dir) != run:
        raise ValueError(f"{raw_dir} is the raw data of run {run_name(raw_dir)!r}, not {run!r}")
    return raw_dir


def raw_digest(raw_dir: Path) -> str:
    """Digest of every file in a run folder (path in it, size, mtime): it changes when a raw file
    is added, removed, replaced or edited (the workflow re-runs ingest when it does), not when the
    checkout is copied with its times (``cp -a``: new inodes)."""
    import hashlib

    digest, root = hashlib.sha256(), str(raw_dir)
    for folder, subdirs, files in os.walk(root):
        subdirs.sort()
        for name in sorted(files):
            path = f"{folder}/{name}"
            digest.update(f"{path[len(root) :]} {_stat_key(path)[:2]}\n".encode())
    return digest.hexdigest()


def host_dirs(raw_dir: Path) -> list[Path]:
    """Host folders of a run: every sub-folder holding env.json or a fio/ folder (a symbolic link
    is no host folder: :func:`symbolic_links` names it)."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise FileNotFoundError(f"raw run folder not found: {raw_dir}")
    folders = [p for p in raw_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    return sorted(p for p in folders if (p / "env.json").exists() or (p / "fio").is_dir())


# --------------------------------------------------------------------------------------------- fio


def fio_columns() -> list[str]:
    """Column order of :func:`fio_table` (``host`` of the parser becomes ``fio_hostname``)."""
    parser_cols = ["fio_hostname" if c == "host" else c for c in FIO_COLUMNS]
    return FIO_LAYOUT_COLUMNS + parser_cols + FIO_DERIVED_COLUMNS


_NO_CPU = dict.fromkeys(("busy_cpu_s", "busy_cpu_pct", "sys_cpu_s", "cpu_interval_s"), math.nan)


#: positions in a parser row (:data:`FIO_COLUMNS`) of the values checked and derived here
_JOB, _RW, _BS_BYTES, _IODEPTH, _IO_BYTES, _ERROR = map(
    FIO_COLUMNS.index, ("job", "rw", "bs_bytes", "iodepth", "io_bytes", "error")
)


def _check_rows(rows: list[tuple], rep) -> str | None:
    """Reason why parsed rows (tuples in :data:`FIO_COLUMNS` order) are unusable for this layout
    cell, or None."""
    if not rows:
        return "fio output holds no jobs"
    failed = sorted({r[_JOB] for r in rows if r[_ERROR] not in (0, None)}, key=str)
    if failed:
        errs = sorted({r[_ERROR] for r in rows if r[_ERROR] not in (0, None)}, key=str)
        return f"fio job(s) {failed} failed with error {errs}"
    idle = sorted({r[_JOB] for r in rows if not r[_IO_BYTES]}, key=str)
    if idle:
        return f"fio job(s) {idle} moved no data"
    wl = rep.workload
    jobs = [(r[_RW], r[_BS_BYTES], r[_IODEPTH]) for r in rows]
    known = [(rw, bs, qd) for rw, bs, qd in jobs if rw and _isnum(bs) and _isnum(qd)]
    if known and not any(_matches_cell(*job, wl) for job in known):
        seen = sorted({f"{rw}-{int(bs)}B-qd{int(qd)}" for rw, bs, qd in known})
        return f"no fio job matches the folder's workload {wl.id} (jobs ran {', '.join(seen)})"
    return None


def _matches_cell(rw, bs_bytes, iodepth, wl: Workload) -> bool:
    """Whether a fio job (its rw, bs and iodepth) ran the folder's cell. A pattern cell's job may
    run its block as n I/Os of a smaller bs (rw ``randwrite:<n>``, n = block / bs when given)."""
    rw, _, every = str(rw).partition(":")
    io_bs, iodepth = int(bs_bytes), int(iodepth)
    if rw != wl.rw or iodepth != wl.iodepth:
        return False
    if not wl.pattern:
        return not every and io_bs == wl.bs_bytes
    if io_bs == wl.bs_bytes:
        return every in ("", "1")
    return (
        0 < io_bs < wl.bs_bytes
        and wl.bs_bytes % io_bs == 0
        and every in ("", str(wl.bs_bytes // io_bs))
    )


def _relative(path: Path, raw_dir: Path) -> str:
    """Path inside the run folder (processed tables must not depend on where raw sits)."""
    try:
        return Path(path).resolve().relative_to(Path(raw_dir).resolve()).as_posix()
    except ValueError:
        return str(path)


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _isnum(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


#: fewest files parsed per task of the process pool (enough to amortise pickling)
CHUNK_FILES = 250
#: below this many files to parse, a process pool costs more than it saves
PARALLEL_MIN_FILES = 1000
#: the incremental-ingest cache, inside the processed folder (never inside raw)
CACHE_DIRNAME = ".ingest-cache"
#: bump when the cache's files change shape; code changes are caught by the source digest
CACHE_FORMAT = 3


def default_workers() -> int:
    """Worker processes for parsing: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_SIDECAR_OR_REP = re.compile(r"^rep\d+(\.cpu)?\.json\Z")


def _ingest_rep_file(root: str, key: str, run: str, stats: list) -> tuple[list, list, list, list]:
    """(rows in :data:`_CHUNK_COLUMNS` order, json+ bins (job_index, direction, ns, count),
    problems, notes: (key, why)) of one ``rep<k>.json`` and its CPU sidecar; ``stats`` receives
    the stat of each as read."""
    path = f"{root}/{key}"
    notes: list[tuple[str, str]] = []
    try:
        rep = rep_of_key(key)
        doc = load_fio_document(path, lambda note: notes.append((key, note)), _FAST_LOADS, stats)
        rows = document_tuples(path, doc)
    except (FioParseError, LayoutError) as exc:
        return [], [], [(key, str(exc))], notes
    except (OSError, ValueError) as exc:  # parser bug or unreadable file: still name the file
        return [], [], [(key, f"{type(exc).__name__}: {exc}")], notes
    reason = _check_rows(rows, rep)
    if not reason and (impossible := implausible_numbers(doc, rows)):
        reason = f"numbers that cannot be true, left out: {impossible}"
    if reason:
        return [], [], [(key, reason)], notes
    cpu_key = f"{key[: -len('.json')]}.cpu.json"
    try:
        cpu = read_cpu_sidecar(f"{root}/{cpu_key}", _FAST_LOADS or json.loads, stats)
    except ValueError as exc:  # a missing sidecar: no CPU values (one open, no stat first)
        if not isinstance(exc.__cause__, FileNotFoundError):
            return [], [], [(cpu_key, f"{exc}; its fio result is left out too")], notes
        cpu = _NO_CPU
    try:
        bins = [
            (i, d, ns, n) for (i, d), hist in document_histograms(doc).items() for ns, n in hist
        ]
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # measurements stay usable
        bins = []
        notes.append((key, f"json+ latency histogram left out: {type(exc).__name__}: {exc}"))
    return _file_rows(key, run, rep, rows, cpu), bins, [], notes


try:  # optional: decodes a fio file several times faster than json, with json's values
    from orjson import loads as _FAST_LOADS
except ImportError:  # pragma: no cover - depends on the environment
    _FAST_LOADS = None


def _file_rows(key: str, run: str, rep: RepPath, rows: list[tuple], cpu: dict) -> list[tuple]:
    """The table's rows of one file in :data:`_CHUNK_COLUMNS` order."""
    moved = [float(r[_IO_BYTES] or 0) for r in rows]
    file_gib = sum(moved) / GIB
    per_gib = [cpu[c] / file_gib if file_gib > 0 else math.nan for c in ("busy_cpu_s", "sys_cpu_s")]
    derived = (*(cpu[c] for c in _NO_CPU), *per_gib, key)  # CPU columns, then _key
    wl = rep.workload
    slots: dict[str, int] = {}  # ordinal of each job name in file order: pairs differing names
    for r in rows:
        slots.setdefault(r[_JOB], len(slots))
    place = (run, rep.host, rep.stack, wl.id, wl.pattern, rep.rep)
    out = []
    for i, r in enumerate(rows):
        # a pattern cell: the cell's rw and bs (the block); fio's own stay in bs and io_bs_bytes
        rw_bs = (wl.rw, wl.bs_bytes) if wl.pattern else r[_RW : _BS_BYTES + 1]
        fio_part = (key, *r[1:_RW], *rw_bs, *r[_BS_BYTES + 1 :])
        out.append((*place, slots[r[_JOB]], *fio_part, r[_BS_BYTES], moved[i] / GIB, *derived, i))
    return out


#: columns of the per-file part of the table: all but those added per host when assembling
_DESIGN_COLUMNS = ("target_pairs", "hit_cap", "pilot_pairs", "host_dir", "session")
_DESIGN_COLUMNS += ("sessions_planned", "look_confidence")
#: CPU columns from the sidecar: /proc/stat of the machine running the fio *client*
_CPU_COLUMNS = (*_NO_CPU, "busy_cpu_s_per_gib", "sys_cpu_s_per_gib")
#: the rows a worker returns: the table's columns but the design's, with ``_key``/``_row`` to order
_CHUNK_COLUMNS = [c for c in fio_columns() if c not in _DESIGN_COLUMNS] + ["_key", "_row"]
#: json+ bins as a worker returns them (``_key`` names the file)
_BIN_COLUMNS = ["_key", "job_index", "direction", "ns", "count"]
_TEXT_COLUMNS = (*FIO_LAYOUT_COLUMNS[:5], "fio_hostname", "job", "direction", "rw", "file", "bs")
_TEXT_COLUMNS += ("session",)


def _typed_column(name, values, text_cols=_TEXT_COLUMNS, bool_cols=(), whole_numbers=True):
    """One column of Python values in :func:`_typed`'s types, in one pass (int64 for
    ``whole_numbers`` without gaps: what pandas infers from a worker's rows)."""
    kinds = set(map(type, values)) - {type(None)}
    if float in kinds and len(kinds) > 1:  # NaN counts as missing, like None (a rare mix)
        kinds = {type(v) for v in values if v is not None and v == v}
    if name in ("rep", "job_slot", "_row"):
        return np.array(values, dtype="int64")
    if name in bool_cols or kinds == {bool}:
        return pd.array(values, dtype="boolean")
    if name in text_cols or str in kinds:
        if kinds != {str}:  # missing values and non-text among the text
            values = [None if _missing(v) else v if isinstance(v, str) else str(v) for v in values]
        return pd.array(values, dtype="string")
    if whole_numbers and kinds == {int} and None not in values and len(values):
        try:
            return np.array(values, dtype="int64")
        except OverflowError:
            pass
    if kinds <= {int, float}:
        return np.array(values, dtype="float64")  # None: NaN
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").astype("float64")


def _chunk_frame(rows: list[tuple], columns: list[str]) -> pd.DataFrame:
    """Typed frame of rows (tuples in ``columns`` order)."""
    values = list(zip(*rows, strict=True)) if rows else [()] * len(columns)
    return pd.DataFrame({c: _typed_column(c, v) for c, v in zip(columns, values, strict=True)})


def _ingest_chunk(raw_dir: str, keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Worker task: the typed rows and json+ bins of the files ``raw_dir/<key>``, and per key its
    problems, notes and stat key."""
    run = run_name(Path(raw_dir))
    rows, bins, results = [], [], {}
    for key in keys:
        read: list = []
        file_rows, histograms, problems, notes = _ingest_rep_file(raw_dir, key, run, read)
        stat = _file_stat(raw_dir, key, read)
        rows += file_rows
        bins += [(key, *b) for b in histograms]
        results[key] = {"problems": problems, "notes": notes, "stat": stat}
    return _chunk_frame(rows, _CHUNK_COLUMNS), _chunk_frame(bins, _BIN_COLUMNS), results


def _parse_files(
    raw_dir: Path, keys: list[str], workers: int, meanwhile=None
) -> tuple[list[pd.DataFrame], list[pd.DataFrame], dict[str, dict]]:
    """Parse ``keys`` in chunks, with a process pool of ``workers`` when it pays off; calls
    ``meanwhile()`` here while the pool parses (else after parsing)."""
    size = max(CHUNK_FILES, -(-len(keys) // (8 * workers)))  # fewer frames, still balanced
    pending = [meanwhile] if meanwhile else []  # run once, also when the pool breaks after it
    # every n-th file: chunks of like cost whatever the mix of cells (the table is sorted later)
    n = -(-len(keys) // size)
    chunks = [keys[i::n] for i in range(n)]
    done = None
    if workers > 1 and len(keys) >= PARALLEL_MIN_FILES:
        import multiprocessing
        from concurrent.futures.process import BrokenProcessPool

        # fork: workers start with luksbench imported and never re-run the caller's main module
        # (spawn does: a script without a __main__ guard would run again in every worker); no
        # garbage collector in them: parsing makes no reference cycles (it cost a tenth)
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        try:
            with ProcessPoolExecutor(workers, context, initializer=gc.disable) as pool:
                parsed = pool.map(_ingest_chunk, [str(raw_dir)] * len(chunks), chunks)
                import pyarrow.parquet  # noqa: F401 - the tables' writer, loaded while they parse

                while pending:
                    pending.pop()()
                done = list(parsed)
        except BrokenProcessPool as exc:  # e.g. a worker killed for memory: parse here instead
            print(
                f"ingest: parallel parsing failed ({exc}); parsing in one process", file=sys.stderr
            )
    if done is None:
        done = [_ingest_chunk(str(raw_dir), chunk) for chunk in chunks]
    while pending:
        pending.pop()()
    results = {key: res for *_, chunk in done for key, res in chunk.items()}
    return [d[0] for d in done], [d[1] for d in done], results


def _list_fio_folder(raw_dir: Path) -> tuple[list[str], list[str]]:
    """(``rep<k>.json`` files, stray ``*.json`` files: neither a result nor its sidecar) under
    ``<host>/fio/<stack>/<workload>/``, as paths inside the run folder sorted by their parts (the
    order of the table's rows), in one ``os.scandir`` walk."""
    reps: list[str] = []
    strays: list[str] = []

    def subdirs(path: str) -> list[str]:  # sorted at every level: the keys in order of parts
        if os.path.islink(path):  # a linked fio/ folder; linked ones below are not listed either
            return []
        try:
            with os.scandir(path) as it:
                return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    root = str(raw_dir)
    for host in subdirs(root):
        fio = f"{root}/{host}/fio"
        for stack in subdirs(fio):
            for workload in subdirs(f"{fio}/{stack}"):
                folder = f"{fio}/{stack}/{workload}"
                with os.scandir(folder) as it:
                    entries = sorted((e.name, e.is_file()) for e in it)
                for name, is_file in entries:
                    key = f"{host}/fio/{stack}/{workload}/{name}"
                    if REP_NAME.match(name):
                        reps.append(key)
                    elif is_file and name.endswith(".json") and not _SIDECAR_OR_REP.match(name):
                        strays.append(key)
    return reps, strays


def _stat_key(path: str, st: os.stat_result | None = None) -> tuple[int, int, int]:
    """(size, mtime in ns, inode) of a file (or of ``st``), (-1, -1, -1) when it does not exist."""
    try:
        st = st or os.stat(path)
    except FileNotFoundError:
        return (-1, -1, -1)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _file_stat(root: str, key: str, read: list = ()) -> tuple[int, ...]:
    """:func:`_stat_key` of a result and of its CPU sidecar; ``read``: the stats taken as they
    were read (the others are taken now)."""
    paths = (f"{root}/{key}", f"{root}/{key[: -len('.json')]}.cpu.json")
    stats = [*read, None, None][:2]
    return tuple(x for path, st in zip(paths, stats, strict=True) for x in _stat_key(path, st))


def _recorded_results(raw_dir: Path, keys: list[str]) -> tuple[list[str], list, dict]:
    """The ``keys`` the manifests of their host record as written (all of a host whose manifests
    record none), a problem for every other one and every recorded one missing, and the sessions
    ({"results": {key: session}, "planned": {host: sessions planned}})."""
    recorded: dict[str, set[str]] = {}
    sessions: dict = {"results": {}, "planned": {}}
    for hdir in host_dirs(raw_dir):
        written: dict[str, str] = {}
        for path, _ in session_records(hdir):
            try:
                manifest = _json_document(path)
            except ValueError:  # an unreadable manifest: the schedule table names it
                continue
            written |= {f"{hdir.name}/{p}": s for p, s in result_sessions(manifest).items()}
            planned = manifest.get("sessions", 1)
            planned = planned if isinstance(planned, int) else 1
            sessions["planned"][hdir.name] = max(planned, sessions["planned"].get(hdir.name, 1))
        sessions["results"] |= written
        if written:
            recorded[hdir.name] = set(written)
    problems, kept = [], []
    for key in keys:
        written = recorded.get(key.split("/", 1)[0])
        if written is None or key in written:
            kept.append(key)
        else:
            problems.append((raw_dir / key, "not a run the manifest records: left out"))
    missing = sorted(set().union(*recorded.values()) - set(keys), key=lambda k: k.split("/"))
    problems += [(raw_dir / k, "missing: the manifest records it as written") for k in missing]
    return kept, problems, sessions


def fio_table(
    raw_dir: Path,
    strict: bool = True,
    cache_dir: Path | None = None,
    workers: int | None = None,
) -> pd.DataFrame:
    """All fio results of one run folder as one tidy table (columns :func:`fio_columns`).

    ``rep`` is the pair index (rep k of every stack forms pair k), ``job_slot`` the ordinal of the
    job name within its file. CPU columns come from ``rep<k>.cpu.json`` (NaN without it), which
    covers the whole fio process: every row of a file carries the file's totals and the per-GiB
    columns divide by the file's total I/O. ``strict``: any bad file raises :class:`IngestError`
    naming every bad file (else they are left out, listed in ``df.attrs["problems"]``).
    ``cache_dir``: incremental ingest, the same table: each file's rows (or problems) are kept
    there, keyed by the stat of the file and of its sidecar, and only new or changed files are
    parsed (all when the parser code changed). ``workers``: parsing processes (default: the CPUs
    available; 1 = in this process).
    """
    fio = fio_and_latency_tables(raw_dir, strict, cache_dir, workers)[0]
    return _with_cpu_cost(fio, schedule_table(raw_dir, strict=False))


def _with_cpu_cost(fio: pd.DataFrame, schedule: pd.DataFrame) -> pd.DataFrame:
    """:func:`cpucost.with_cpu_cost`, ``fio``'s attrs (the problem list) kept aside meanwhile:
    pandas deep-copies attrs on every operation, seconds on a large run."""
    attrs, fio.attrs = fio.attrs, {}
    out = cpucost.with_cpu_cost(fio, schedule)
    out = saturation.with_flags(out) if len(out) else out
    out.attrs = attrs
    return out


def fio_and_latency_tables(
    raw_dir: Path,
    strict: bool = True,
    cache_dir: Path | None = None,
    workers: int | None = None,
    meanwhile=None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`fio_table` and the json+ latency histograms of its rows (:data:`LATENCY_COLUMNS`),
    read in the same pass; ``meanwhile()`` runs while the worker processes parse."""
    raw_dir = Path(raw_dir)
    workers = default_workers() if workers is None else max(1, int(workers))
    problems, notes, targets, fleets = [], [], {}, {}  # fleets: {host: fleet_names}
    for hdir in host_dirs(raw_dir):
        tpath = hdir / "fio" / "targets.json"
        if tpath.exists():
            try:
                targets[hdir.name] = read_targets(tpath)
            except ValueError as exc:
                problems.append((tpath, str(exc)))
        fleets[hdir.name] = fleet_names(hdir)

    keys, strays = _list_fio_folder(raw_dir)
    layout = "does not follow <host>/fio/<stack>/<rw>-<bs>-qd<iodepth>/rep<k>.json"
    problems += [(raw_dir / key, layout) for key in strays]
    keys, unrecorded, sessions = _recorded_results(raw_dir, keys)
    problems += unrecorded

    cache = _IngestCache(Path(cache_dir)) if cache_dir is not None else None
    rows, bins, results = (
        cache.load(raw_dir, keys) if cache else (pd.DataFrame(), pd.DataFrame(), {})
    )
    todo = [k for k in keys if k not in results]
    new_frames, new_bins, new_results = _parse_files(raw_dir, todo, workers, meanwhile)
    frames = [f for f in (rows, *new_frames) if len(f)]
    if len(frames) > 1:  # one concat for both the cache and the table
        frames = [pd.concat(frames, ignore_index=True)]
    bins = [bins, *new_bins]
    results.update(new_results)
    for key in keys:
        res = results[key]
        if res["problems"] or res["notes"]:  # most files have neither
            problems += [(raw_dir / k, why) for k, why in res["problems"]]
            notes += [(f"{raw_dir}/{k}", why) for k, why in res["notes"]]  # thousands: no Path
    if cache is not None and (todo or set(cache.keys) != set(keys)):
        cache.save({k: results[k]["stat"] for k in keys}, frames, bins, results)
    if problems and strict:
        raise IngestError(raw_dir, problems)
    df = _assemble(frames, keys, targets, fleets, sessions)
    latency = _latency_table(df, bins)
    # attrs last: pandas deep-copies them on every operation
    df = tails.with_histogram_percentiles(df, latency)
    df.attrs["problems"] = [(str(p), why) for p, why in problems]
    df.attrs["notes"] = [(str(p), why) for p, why in notes]
    # how the table was made: files parsed now vs rows reused from the cache
    df.attrs["ingest"] = {"files": len(keys), "parsed": len(todo), "reused": len(keys) - len(todo)}
    return df, latency


def _latency_table(fio: pd.DataFrame, bins: list[pd.DataFrame]) -> pd.DataFrame:
    """Completion-latency histograms (json+ ``bins``) of the fio table's active rows (columns
    :data:`LATENCY_COLUMNS`): per file in name order, its rows in table order, bins by latency."""
    bins = [b for b in bins if len(b)]
    if fio.empty or not bins:
        return pd.DataFrame.from_records([], columns=LATENCY_COLUMNS)
    hist = pd.concat(bins, ignore_index=True).rename(columns={"_key": "file"})
    active = active_rows(with_pattern(fio))[["file", "job_index", *LATENCY_COLUMNS[:-2]]]
    table = active.merge(hist, on=["file", "job_index", "direction"], how="inner", sort=False)
    return table.sort_values("file", kind="stable")[LATENCY_COLUMNS].reset_index(drop=True)


def _assemble(
    frames: list[pd.DataFrame],
    keys: list[str],
    targets: dict,
    fleets: dict | None = None,
    sessions: dict | None = None,
) -> pd.DataFrame:
    """One table from the per-chunk frames, in raw-layout file order, with the design's and the
    sessions' columns and fleet rows renamed to their server; the same however it was split."""
    columns = fio_columns()
    frames = [f for f in frames if len(f)]
    if not frames:
        return _fio_dtypes(pd.DataFrame.from_records([], columns=columns))
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    # position of each row's file in the listing (-1: no longer there); hash lookups on plain
    # objects, not element-wise over Arrow strings
    pos = pd.Index(keys).get_indexer(df["_key"].to_numpy(dtype=object))
    df = (
        df.assign(_pos=pos)[pos >= 0]
        .sort_values(["_pos", "_row"], kind="stable")
        .reset_index(drop=True)
    )
    cells = {(host, w): design for host, ts in targets.items() for w, design in ts.items()}
    hosts_cells = zip(df["host"].tolist(), df["workload"].tolist(), strict=True)
    design = [cells.get(cell, (None,) * 4) for cell in hosts_cells] if cells else []
    for i, col in enumerate(("target_pairs", "hit_cap", "pilot_pairs", "look_confidence")):
        values = [d[i] for d in design] if design else [None] * len(df)
        # read_targets checked the types: a flag, else numbers (None: not in the design)
        df[col] = pd.array(values, dtype="boolean" if col == "hit_cap" else "float64")
    df["host_dir"] = df["host"]
    # the stack-up that measured each result ("" before sessions were recorded)
    sessions = sessions or {"results": {}, "planned": {}}
    session = [sessions["results"].get(f, "") for f in df["file"].tolist()]
    df["session"] = pd.array(session, dtype="string")
    df["sessions_planned"] = [sessions["planned"].get(h, 1) for h in df["host_dir"].tolist()]
    # fio client/server output: every server's entry is its own host (the parser names it);
    # the CPU sidecar measured the client here, not the servers doing the I/O: no CPU values
    server = df["fio_hostname"].to_numpy(dtype=object)
    remote = df["fio_hostname"].fillna("").ne("").to_numpy(dtype=bool)
    if remote.any():
        names = fleets or {}
        host_dir = df["host_dir"].to_numpy(dtype=object)
        hosts = df["host"].to_numpy(dtype=object).copy()
        hosts[remote] = [
            names.get(d, {}).get(x, x)
            for d, x in zip(host_dir[remote], server[remote], strict=True)
        ]
        df["host"] = pd.array(hosts, dtype="string")
        for col in _CPU_COLUMNS:
            df[col] = df[col].mask(remote)
    return _fio_dtypes(df[columns])


def _fleet_servers(host_dir: Path) -> list[dict]:
    """The fio servers of a host's fleet run (``fleet.hosts`` of its manifest), or []."""
    try:
        return fleet_servers(_json_document(Path(host_dir) / "fio" / "manifest.json"))
    except ValueError:
        return []


def fleet_names(host_dir: Path) -> dict[str, str]:
    """fio server (as the parser names it: ``address`` or ``address:port``) -> the host name the
    plan gave it, from ``<host>/fio/manifest.json``'s ``fleet`` record (fio client/server mode);
    empty for a local run or an unreadable manifest (then the parser's name is used)."""
    servers = _fleet_servers(host_dir)
    out: dict[str, str] = {}
    addresses = [str(h.get("address")) for h in servers]
    for h in servers:
        address = str(h.get("address"))
        out[f"{address}:{h.get('port', 8765)}"] = str(h["name"])
        if addresses.count(address) == 1:
            out[address] = str(h["name"])
    return out


def _json_list(text: str) -> list:
    """A cached problems/notes list (most files have none: skip the JSON parser for those)."""
    return [] if text == "[]" else [tuple(x) for x in json.loads(text)]


class _IngestCache:
    """Per-file results of earlier ingests of one run folder (see :func:`fio_table`):
    ``files.parquet`` (per raw file: key, :data:`STAT_COLUMNS`, problems and notes as JSON),
    ``rows.parquet`` and ``bins.parquet`` (the files' typed rows and json+ bins, by ``_key``),
    ``meta.json`` (format and a digest of the parser code)."""

    STAT_COLUMNS = ("size", "mtime_ns", "ino", "cpu_size", "cpu_mtime_ns", "cpu_ino")

    def __init__(self, path: Path):
        self.path = Path(path)
        self.keys: list[str] = []

    @staticmethod
    def code_digest() -> str:
        import hashlib

        import luksbench

        h = hashlib.sha256(f"format {CACHE_FORMAT}; pandas {pd.__version__}".encode())
        here = Path(luksbench.__file__).parent
        for pattern in ("analysis/ingest.py", "analysis/design.py", "formats/*.py"):  # the parser
            for path in sorted(here.glob(pattern)):
                h.update(path.read_bytes())
        return h.hexdigest()

    def load(self, raw_dir: Path, keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
        """Rows, json+ bins and results of the files of ``keys`` whose stat key is unchanged
        (others: parse again)."""
        meta, files = self.path / "meta.json", self.path / "files.parquet"
        try:
            ok = json.loads(meta.read_text()).get("code") == self.code_digest()
            table = pd.read_parquet(files) if ok else None
        except (OSError, ValueError):
            ok, table = False, None
        if not ok or table is None:
            return pd.DataFrame(), pd.DataFrame(), {}
        self.keys = list(table["key"])
        cols, listed, root = list(self.STAT_COLUMNS), set(keys), str(raw_dir)
        cached = zip(table["key"], table[cols].itertuples(index=False, name=None), strict=True)
        same = {k: st for k, st in cached if k in listed and _file_stat(root, k) == st}
        reused = table.set_index("key").loc[list(same)]
        results = {
            k: {"problems": _json_list(p), "notes": _json_list(n), "stat": same[k]}
            for k, p, n in zip(reused.index, reused["problems"], reused["notes"], strict=True)
        }
        try:
            rows, bins = (self._read(name, list(same), len(table)) for name in self.TABLES)
        except (OSError, ValueError):
            return pd.DataFrame(), pd.DataFrame(), {}
        return rows, bins, results

    #: the per-file tables kept: the fio rows and their json+ bins
    TABLES = ("rows.parquet", "bins.parquet")

    def _read(self, name: str, keys: list[str], files: int) -> pd.DataFrame:
        """A cached table's rows of ``keys`` (all of them when every file is unchanged)."""
        path = self.path / name
        cached = pd.read_parquet(path) if path.exists() else pd.DataFrame()
        if len(cached) and len(keys) < files:
            cached = cached[pd.Index(keys).get_indexer(cached["_key"].to_numpy(dtype=object)) >= 0]
        return cached

    def save(
        self, stats: dict[str, tuple], frames: list[pd.DataFrame], bins: list, results: dict
    ) -> None:
        """Write the cache for the files of ``stats`` (replacing it atomically, file by file)."""
        self.path.mkdir(parents=True, exist_ok=True)
        # no meta.json (written last) until the files agree: a save cut short is never read
        (self.path / "meta.json").unlink(missing_ok=True)
        keys = list(stats)
        numbers = (
            np.array(list(stats.values()), dtype="int64").reshape(-1, len(self.STAT_COLUMNS)).T
        )
        table = pd.DataFrame({"key": keys, **dict(zip(self.STAT_COLUMNS, numbers, strict=True))})
        for column in ("problems", "notes"):
            table[column] = [json.dumps(r) if (r := results[k][column]) else "[]" for k in keys]
        rows, bins = (self._kept(parts, keys) for parts in (frames, bins))
        rows = None if rows is None else _fio_dtypes(rows)
        for name, df in (*zip(self.TABLES, (rows, bins), strict=True), ("files.parquet", table)):
            if df is None:
                (self.path / name).unlink(missing_ok=True)
                continue
            df.attrs = {}
            with replacing(self.path / name) as tmp:  # a new file, never through a link
                df.to_parquet(tmp, index=False)
        meta = json.dumps({"format": CACHE_FORMAT, "code": self.code_digest()})
        replace_file(self.path / "meta.json", meta.encode())
        self.keys = keys

    @staticmethod
    def _kept(parts: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame | None:
        """The parts' rows of files still in ``keys``, as one frame (None: there are none)."""
        parts = [f for f in parts if len(f)]
        if not parts:
            return None
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        keep = pd.Index(keys).get_indexer(df["_key"].to_numpy(dtype=object)) >= 0
        return df.copy(deep=False) if keep.all() else df[keep].reset_index(drop=True)


def _fio_dtypes(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("rep", "job_slot"):
        df[col] = df[col].astype("int64")
    return _typed(df, text_cols=_TEXT_COLUMNS, bool_cols=("hit_cap",))


_STRING = pd.StringDtype()


def _typed(df: pd.DataFrame, text_cols=(), bool_cols=()) -> pd.DataFrame:
    """Stable parquet types: text -> string, bools -> boolean, numbers (None = missing) -> float64,
    whatever the values of this particular run happen to be (an all-missing column stays typed)."""
    for col in df.columns:
        dtype = df[col].dtype
        if dtype.kind in "iuf" or col in ("rep", "job_slot"):
            continue
        # already typed by an earlier pass (chunks of a parallel or incremental ingest): the same
        # outcome as below, without looking at every value again
        typed = (dtype == _STRING and col not in bool_cols) or isinstance(dtype, pd.BooleanDtype)
        if typed and (col in text_cols or col in bool_cols or df[col].notna().any()):
            continue
        values = df[col].tolist()
        df[col] = _typed_column(col, values, text_cols, bool_cols, whole_numbers=False)
    return df


# -------------------------------------------------------------------------------------- cryptsetup


CIPHER_SOURCE_KERNEL = "cryptsetup benchmark"
CRYPTSETUP_TABLE_COLUMNS = ["run", "host", *cryptsetup.CRYPTSETUP_COLUMNS, "source", "block_bytes"]


def _openssl_cipher_rows(path: Path) -> list[dict]:
    """``openssl-speed.txt`` as cipher rows of the cryptsetup table: per cipher and key size, the
    largest block size measured in both directions (``source`` says it is a userspace estimate)."""
    by_cipher: dict[tuple, dict] = {}
    for r in opensslspeed.parse_openssl_speed_file(path):
        key = (r["algorithm"], r["key_bits"])
        row = by_cipher.setdefault(key, {
            **dict.fromkeys(cryptsetup.CRYPTSETUP_COLUMNS),
            "kind": "cipher", "algorithm": r["algorithm"], "key_bits": r["key_bits"],
            "available": True, "note": "", "source": opensslspeed.SOURCE, "block_bytes": None,
            "_blocks": {},
        })  # fmt: skip
        if not r["available"]:
            row.update(available=False, note=r["note"])
        else:
            row["_blocks"].setdefault(r["block_bytes"], {})[r["direction"]] = r["mib_s"]
    rows = []
    for row in by_cipher.values():
        both = {
            b: d for b, d in row.pop("_blocks").items() if len(d) == len(opensslspeed.DIRECTIONS)
        }
        if row["available"] and both:
            block = max(both)
            row.update(block_bytes=block, encryption_mib_s=both[block]["encryption"])
            row["decryption_mib_s"] = both[block]["decryption"]
        elif row["available"]:
            row.update(available=False, note="openssl speed measured one direction only")
        rows.append(row)
    return rows


def _host_cipher_rows(host: Path) -> list[tuple[Path, list[dict] | Exception]]:
    """(file, rows or the error) for the host's kernel cipher benchmark and userspace estimate."""
    out = []
    for name, parse in (
        ("cryptsetup-benchmark.txt", cryptsetup.parse_cryptsetup_file),
        (opensslspeed.OPENSSL_SPEED_FILE, _openssl_cipher_rows),
    ):
        path = host / name
        if not path.exists():
            continue
        try:
            out.append((path, parse(path)))
        except (cryptsetup.CryptsetupParseError, OSError, ValueError) as exc:
            out.append((path, exc))
    return out


def cryptsetup_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """``<host>/cryptsetup-benchmark.txt`` of every host (none: no rows), parsed, with the cipher
    rows of ``<host>/openssl-speed.txt`` (the userspace estimate where the kernel's ciphers could
    not be benchmarked); ``run`` and ``host`` in front, ``source`` says which tool measured."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host in host_dirs(raw_dir):
        for path, rows in _host_cipher_rows(host):
            if isinstance(rows, Exception):
                problems.append((path, str(rows)))
                continue
            rel = _relative(path, raw_dir)
            base = {"run": run, "host": host.name, "source": CIPHER_SOURCE_KERNEL}
            records += [{**base, **r, "file": rel} for r in rows]
    df = pd.DataFrame.from_records(records, columns=CRYPTSETUP_TABLE_COLUMNS)
    typed = _typed(df, text_cols=("source",), bool_cols=("available",))
    return _checked(typed, raw_dir, problems, strict)


# -------------------------------------------------------------------------------------------- env


def _json_document(path: Path) -> dict:
    """:func:`read_json_object`, decoded once per version of the file (path, size, mtime, inode):
    several tables read each manifest, and a large run's are megabytes. Do not change it."""
    return _decoded_json(str(path), _stat_key(str(path)))


@functools.lru_cache(maxsize=4)  # emptied after each ingest_run
def _decoded_json(path: str, version: tuple[int, int, int]) -> dict:
    return read_json_object(Path(path))


def _checked(df: pd.DataFrame, raw_dir: Path, problems: list, strict: bool) -> pd.DataFrame:
    """``df`` with the problems met reading it in its attrs; with ``strict`` an IngestError."""
    if problems and strict:
        raise IngestError(raw_dir, problems)
    df.attrs["problems"] = [(str(p), why) for p, why in problems]
    return df


def _read_json(path: Path, problems: list) -> dict | None:
    try:
        return _json_document(path)
    except ValueError as exc:
        problems.append((path, str(exc)))
        return None


def _host_documents(raw_dir: Path, name: str, problems: list, missing: dict | None = None):
    """(host folder, document) of every host's JSON document ``name``; an unreadable one is left
    out (its problem added), a missing one is ``missing`` (None: left out)."""
    for host in host_dirs(raw_dir):
        path = host / name
        doc = _read_json(path, problems) if path.exists() else missing
        if doc is not None:
            yield host, doc


def env_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host: key facts of ``env.json`` flattened (columns :data:`ENV_COLUMNS`), the
    whole document in ``env_json`` (no env.json: NaNs). Each fio server of a fleet run gets a row
    too, with only the backend known (the coordinator captured the environment and built the
    stacks); its ``env_json`` names the server and its coordinator."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host, env in _host_documents(raw_dir, "env.json", problems, missing={}):
        facts = env_facts(env)
        records.append(
            {"run": run, "host": host.name, **facts, "env_json": json.dumps(env, sort_keys=True)}
        )
        for server in _fleet_servers(host):
            fleet = {"fleet_server": server, "coordinator": host.name}
            records.append(
                {"run": run, "host": server["name"], "env_json": json.dumps(fleet, sort_keys=True)}
                | {"hostname": f"{server.get('address')}:{server.get('port', 8765)}"}
                | {k: facts[k] for k in ("backend", "backend_reason")}
            )
    df = pd.DataFrame.from_records(records, columns=ENV_COLUMNS)
    return _checked(with_dtypes(df, ENV_DTYPES, "string"), raw_dir, problems, strict)


def stacks_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host x stack (columns :data:`STACKS_COLUMNS`) from the stack descriptions the
    runner recorded in ``<host>/fio/manifest.json`` (no key material)."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host, manifest in _host_documents(raw_dir, "fio/manifest.json", problems):
        stacks, unavailable = stack_descriptions(manifest)
        for name, desc in sorted(stacks.items()):
            desc = desc if isinstance(desc, dict) else {"value": desc}
            key_bits = desc.get("key_bits", desc.get("key_size"))
            key_bits = key_bits if isinstance(key_bits, int) else None
            reason = unavailable.get(name) or desc.get("unavailable")
            reason = str(reason) if reason else None
            described = (*map(desc.get, ("kind", "backend", "cipher")), key_bits)
            text = json.dumps(desc, sort_keys=True)
            records.append((run, host.name, name, *described, text, not reason, reason))
    df = pd.DataFrame.from_records(records, columns=STACKS_COLUMNS)
    return _checked(with_dtypes(df, STACKS_DTYPES, "string"), raw_dir, problems, strict)


# --------------------------------------------------------------------------------------- schedule

#: the manifest's values of the session, then of each run, then the run's idle CPU sample
#: (:func:`cpucost.run_idle_rates`: per second of wall time, and which sample)
_SESSION_KEYS = ("started", "ended", "seed")
_RUN_KEYS = (  # noqa: SIM905 - a list of names, one word each
    "index round rep stack workload position_in_cell started ended status"
).split()
SCHEDULE_COLUMNS = ["run", "host", "session", "session_started", "session_ended", "seed"]
SCHEDULE_COLUMNS += [*_RUN_KEYS, *cpucost.IDLE_COLUMNS]


def _utc_times(values: list) -> pd.DatetimeIndex:
    """ISO times of manifests as UTC timestamps, naive ones taken as UTC (NaT when missing or
    malformed); one vectorised parse, as a run's manifests record tens of thousands of runs."""
    text = [v if isinstance(v, str) and v else None for v in values]
    times = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    return times.astype("datetime64[ns, UTC]")


_SCHEDULE_DTYPES = {
    _utc_times: ("session_started", "session_ended", "started", "ended"),
    "Int64": ("seed", "index", "round", "rep", "position_in_cell"),
    "float64": cpucost.IDLE_COLUMNS,
}


def schedule_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """When each fio result was measured: one row per run of every session's manifest (columns
    :data:`SCHEDULE_COLUMNS`; results a session found already there are not repeated): its session
    (record in ``fio/sessions/``), round of the counterbalanced schedule, and UTC times bracketing
    the fio process (``luksbench compare`` pairs results measured side by side)."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for hdir in host_dirs(raw_dir):
        for path, session in session_records(hdir):
            manifest = _read_json(path, problems)
            if manifest is None:
                continue
            runs = manifest.get("runs") or []
            if not isinstance(runs, list):
                problems.append((path, "manifest: 'runs' must be a list"))
                continue
            head = (run, hdir.name, session, *map(manifest.get, _SESSION_KEYS))
            records += [
                (
                    *head,
                    *map(entry.get, _RUN_KEYS),
                    *cpucost.run_idle_rates(manifest, entry).values(),
                )
                for entry in runs
                if isinstance(entry, dict) and not entry.get("skipped_existing")
            ]
    df = pd.DataFrame.from_records(records, columns=SCHEDULE_COLUMNS)
    df = with_dtypes(df, _SCHEDULE_DTYPES, "string", errors="coerce")
    return _checked(df, raw_dir, problems, strict)


# ------------------------------------------------------------------------------------- processed


PROBLEMS_COLUMNS = ["file", "severity", "reason"]


def symbolic_links(raw_dir: Path) -> list[tuple[Path, str]]:
    """(path, why) of every symbolic link in the run folder: none is followed (a link may point
    out of the run), so each is a problem; what it stood for is left out."""
    out = []
    for folder, subdirs, files in os.walk(raw_dir):  # os.walk does not enter a linked folder
        subdirs.sort()
        for name in sorted((*subdirs, *files)):
            path = os.path.join(folder, name)
            if os.path.islink(path):
                why = f"a symbolic link (to {_link_target(path, raw_dir)}): not followed, left out"
                out.append((Path(path), why))
    return out


def _link_target(link: str, raw_dir: Path) -> str:
    """Where ``link`` points, as a reader of the published problems needs it: relative to the run
    folder when it stays inside, else no absolute path of the machine (only the file's name)."""
    target = os.readlink(link)
    inside = os.path.normpath(os.path.join(os.path.dirname(link), target))
    root = os.path.normpath(raw_dir)
    if inside.startswith(root + os.sep):
        return inside[len(root) + 1 :]
    return f"{os.path.basename(target.rstrip('/')) or target}, outside the run folder"


def machine_paths(env: pd.DataFrame, raw_dir: Path) -> dict[str, str]:
    """{absolute path of the measuring machine: what a published table shows instead}: the run's
    raw folder (paths inside it relative), each host's scratch directory (``<scratch_dir>``) and
    each planned device that is no ``/dev`` path (``<device BLOCK>``), also as JSON escapes them."""
    names = {}
    for raw in dict.fromkeys((str(Path(raw_dir)), str(Path(raw_dir).resolve()))):
        names |= {f"{raw}/": "", raw: "."}
    for env_json in env.get("env_json", []):
        doc = parse_env_json(env_json)
        scratch = (doc.get("plan") or {}).get("scratch_dir")
        if isinstance(scratch, str) and len(scratch.rstrip("/")) > 1:
            names[scratch.rstrip("/")] = "<scratch_dir>"
        for device in doc.get("job_devices") or []:
            path = device.get("device") if isinstance(device, dict) else None
            if isinstance(path, str) and path.startswith("/") and not path.startswith("/dev/"):
                names[path.rstrip("/") or path] = f"<device {device.get('block_device') or '?'}>"
    names = {path: name for path, name in names.items() if path.startswith("/") and path != "/"}
    return names | {json.dumps(p)[1:-1]: n for p, n in names.items() if json.dumps(p)[1:-1] != p}


def _without_raw_dir(reason: str, raw_dir: Path) -> str:
    """A problem's reason with the run folder's absolute path cut (parse errors name the file)."""
    for raw in dict.fromkeys((str(Path(raw_dir).resolve()), str(Path(raw_dir)))):
        reason = reason.replace(f"{raw}/", "")
    return reason


def ingest_run(
    raw_dir: Path,
    strict: bool = False,
    cache_dir: Path | None = None,
    workers: int | None = None,
) -> dict[str, pd.DataFrame]:
    """All tables of one run folder (:data:`PROCESSED_TABLES`).

    A bad raw file (truncated, empty, text only, not fio output, NaN or negative values, a failed
    fio job, in the wrong place, a result its host's manifests do not record) is left out and
    listed in the "problems" table with the reason (severity "excluded"), as is a recorded result
    that is missing; files used with a caveat (several JSON documents: the last counts) are listed
    as "note". ``strict``: any excluded file raises one :class:`IngestError` naming every bad file.
    ``cache_dir``/``workers``: as for :func:`fio_table`."""
    raw_dir = Path(raw_dir)
    funcs = {"cryptsetup": cryptsetup_table, "env": env_table, "stacks": stacks_table}
    funcs["schedule"] = schedule_table
    others, links = {}, []  # read while the fio results are parsed

    def read_others():
        others.update((name, func(raw_dir, strict=False)) for name, func in funcs.items())
        links.extend(symbolic_links(raw_dir))

    parsed = fio_and_latency_tables(raw_dir, False, cache_dir, workers, read_others)
    _decoded_json.cache_clear()
    tables = dict(zip(("fio", "latency"), parsed, strict=True)) | others
    tables["fio"] = _with_cpu_cost(tables["fio"], tables["schedule"])
    problems = [p for table in tables.values() for p in table.attrs.get("problems", [])]
    named = {os.path.normpath(p) for p, _ in problems}
    problems += [(str(p), why) for p, why in links if os.path.normpath(p) not in named]
    notes = [n for table in tables.values() for n in table.attrs.get("notes", [])]
    if problems and strict:
        raise IngestError(raw_dir, [(Path(p), why) for p, why in problems])
    records = [(p, "excluded", why) for p, why in problems] + [(p, "note", why) for p, why in notes]
    prefix = f"{raw_dir}/"  # the paths are raw_dir / <path inside the run>: no resolve() needed
    tables["problems"] = pd.DataFrame.from_records(
        [
            (
                p[len(prefix) :] if p.startswith(prefix) else _relative(Path(p), raw_dir),
                sev,
                _without_raw_dir(str(why), raw_dir),
            )
            for p, sev, why in records
        ],
        columns=PROBLEMS_COLUMNS,
    ).astype("string")
    return tables


def write_processed(
    raw_dir: Path,
    processed_dir: Path,
    strict: bool = False,
    incremental: bool = True,
    workers: int | None = None,
) -> dict[str, Path]:
    """Ingest ``raw_dir`` and write ``<processed_dir>/<table>.parquet`` (and ``.csv``, with the
    column dictionary) for every table of :func:`ingest_run`; returns {table name: path}.

    Every excluded file and every note is also printed on stderr, naming the file and why.
    Refuses a ``processed_dir`` inside ``raw_dir`` (raw is read-only). ``incremental``: with the
    cache in ``<processed_dir>/.ingest-cache/`` (:func:`fio_table`)."""
    raw_dir, processed_dir = Path(raw_dir).resolve(), Path(processed_dir).resolve()
    if processed_dir == raw_dir or raw_dir in processed_dir.parents:
        raise ValueError(
            f"processed_dir {processed_dir} is inside raw_dir {raw_dir}: raw is read-only"
        )
    cache_dir = processed_dir / CACHE_DIRNAME if incremental else None
    collecting = gc.isenabled()
    gc.disable()  # ingest keeps many small objects alive: collections find no garbage, cost 5 %
    try:
        tables = ingest_run(raw_dir, strict=strict, cache_dir=cache_dir, workers=workers)
    finally:
        if collecting:
            gc.enable()
    done = tables["fio"].attrs.get("ingest", {})
    if incremental and done:
        print(
            f"ingest: {done['files']} fio results: {done['parsed']} parsed, "
            f"{done['reused']} unchanged (from {cache_dir})",
            file=sys.stderr,
        )
    for row in tables["problems"].itertuples():
        print(f"ingest: {row.severity}: {raw_dir / row.file}: {row.reason}", file=sys.stderr)
    processed_dir.mkdir(parents=True, exist_ok=True)
    for name in PROCESSED_TABLES:
        tables[name].attrs = {}  # the problems and notes, reported above; not table data
    return dictionary.write_tables(
        processed_dir,
        {name: tables[name] for name in PROCESSED_TABLES},
        machine_paths(tables["env"], raw_dir),
    )


def read_processed(processed_dir: Path) -> dict[str, pd.DataFrame]:
    """The parquet files written by :func:`write_processed` (plus loss.parquet when present)."""
    paths = {name: Path(processed_dir) / f"{name}.parquet" for name in (*PROCESSED_TABLES, "loss")}
    return {name: pd.read_parquet(path) for name, path in paths.items() if path.exists()}
