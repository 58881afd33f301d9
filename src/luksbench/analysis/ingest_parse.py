"""Parsing the fio results of a run folder: one ``rep<k>.json`` and its CPU sidecar into typed rows
and json+ histogram bins, in chunks, in a process pool when it pays off."""

from __future__ import annotations

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

from luksbench.analysis.ingest_columns import (
    _DESIGN_COLUMNS,
    _NO_CPU,
    GIB,
    _file_stat,
    _isnum,
    _typed_column,
    fio_columns,
    run_name,
)
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
    rep_of_key,
)
from luksbench.formats.sidecar import read_cpu_sidecar

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


#: files per chunk: each chunk is parsed, its latency rows written and its bins dropped before the
#: next ones, so memory stays flat in the number of files (a worker task parses one chunk)
CHUNK_FILES = 2000
#: below this many files to parse, a process pool costs more than it saves
PARALLEL_MIN_FILES = 1000
#: chunks parsed ahead of the one being written, per worker (bounds the results held waiting)
CHUNKS_AHEAD = 2


def default_workers() -> int:
    """Worker processes for parsing: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_SIDECAR_OR_REP = re.compile(r"^rep\d+(\.cpu)?\.json\Z")


def _ingest_rep_file(root: str, key: str, run: str, stats: list) -> tuple[list, list, list, list]:
    """(rows in :data:`_CHUNK_COLUMNS` order, json+ bins (:func:`_histogram_arrays` or None),
    problems, notes: (key, why)) of one ``rep<k>.json`` and its CPU sidecar; ``stats`` receives
    the stat of each as read."""
    path = f"{root}/{key}"
    notes: list[tuple[str, str]] = []
    try:
        rep = rep_of_key(key)
        doc = load_fio_document(path, lambda note: notes.append((key, note)), _FAST_LOADS, stats)
        rows = document_tuples(path, doc)
    except (FioParseError, LayoutError) as exc:
        return [], None, [(key, str(exc))], notes
    except (OSError, ValueError) as exc:  # parser bug or unreadable file: still name the file
        return [], None, [(key, f"{type(exc).__name__}: {exc}")], notes
    reason = _check_rows(rows, rep)
    if not reason and (impossible := implausible_numbers(doc, rows)):
        reason = f"numbers that cannot be true, left out: {impossible}"
    if reason:
        return [], None, [(key, reason)], notes
    cpu_key = f"{key[: -len('.json')]}.cpu.json"
    try:
        cpu = read_cpu_sidecar(f"{root}/{cpu_key}", _FAST_LOADS or json.loads, stats)
    except ValueError as exc:  # a missing sidecar: no CPU values (one open, no stat first)
        if not isinstance(exc.__cause__, FileNotFoundError):
            return [], None, [(cpu_key, f"{exc}; its fio result is left out too")], notes
        cpu = _NO_CPU
    try:
        bins = _histogram_arrays(document_histograms(doc))
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # measurements stay usable
        bins = None
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


#: the rows a worker returns: the table's columns but the design's, with ``_key``/``_row`` to order
_CHUNK_COLUMNS = [c for c in fio_columns() if c not in _DESIGN_COLUMNS] + ["_key", "_row"]
#: json+ bins as a worker returns them (``_key`` names the file)
_BIN_COLUMNS = ["_key", "job_index", "direction", "ns", "count"]


def _chunk_frame(rows: list[tuple], columns: list[str]) -> pd.DataFrame:
    """Typed frame of rows (tuples in ``columns`` order)."""
    values = list(zip(*rows, strict=True)) if rows else [()] * len(columns)
    return pd.DataFrame({c: _typed_column(c, v) for c, v in zip(columns, values, strict=True)})


def _histogram_arrays(histograms: dict) -> tuple[np.ndarray, ...]:
    """A file's json+ histograms ({(job_index, direction): [(ns, count), ...]}) as four arrays
    (job_index, direction, ns, count), one element per bin: no Python object per bin is kept."""
    parts = [
        (i, d, np.asarray(h, dtype="int64").reshape(-1, 2)) for (i, d), h in histograms.items()
    ]
    sizes = [len(a) for *_, a in parts]
    if not parts:
        return tuple(np.empty(0, dtype=t) for t in ("int64", object, "int64", "int64"))
    pairs = np.concatenate([a for *_, a in parts])
    index = np.repeat(np.array([i for i, *_ in parts], dtype="int64"), sizes)
    direction = np.repeat(np.array([d for _, d, _ in parts], dtype=object), sizes)
    return index, direction, pairs[:, 0], pairs[:, 1]


def _bins_frame(keys: list[str], bins: list[tuple[np.ndarray, ...]]) -> pd.DataFrame:
    """Typed frame (:data:`_BIN_COLUMNS`) of the files' bin arrays, built from whole arrays."""
    if not bins:
        return _chunk_frame([], _BIN_COLUMNS)
    sizes = [len(b[0]) for b in bins]
    index, direction, ns, count = (np.concatenate([b[j] for b in bins]) for j in range(4))
    key = np.repeat(np.array(keys, dtype=object), sizes)
    text = {"_key": key, "direction": direction}
    frame = {c: pd.array(v, dtype="string") for c, v in text.items()}
    frame |= {"job_index": index, "ns": ns, "count": count}
    return pd.DataFrame({c: frame[c] for c in _BIN_COLUMNS})


def _ingest_chunk(raw_dir: str, keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Worker task: the typed rows and json+ bins of the files ``raw_dir/<key>``, and per key its
    problems, notes and stat key."""
    run = run_name(Path(raw_dir))
    rows, bins, bin_keys, results = [], [], [], {}
    for key in keys:
        read: list = []
        file_rows, histograms, problems, notes = _ingest_rep_file(raw_dir, key, run, read)
        stat = _file_stat(raw_dir, key, read)
        rows += file_rows
        if histograms is not None and len(histograms[0]):
            bins.append(histograms)
            bin_keys.append(key)
        results[key] = {"problems": problems, "notes": notes, "stat": stat}
    return _chunk_frame(rows, _CHUNK_COLUMNS), _bins_frame(bin_keys, bins), results


def _parsed_chunks(raw_dir: Path, chunks: list[list[str]], workers: int, meanwhile=None):
    """:func:`_ingest_chunk` of every chunk of keys, yielded in the chunks' order, with a process
    pool of ``workers`` when it pays off (at most :data:`CHUNKS_AHEAD` chunks per worker parsed
    ahead); calls ``meanwhile()`` here while the pool parses (else before the first chunk)."""
    pending = [meanwhile] if meanwhile else []  # run once, also when the pool breaks after it
    done = 0
    if workers > 1 and sum(map(len, chunks)) >= PARALLEL_MIN_FILES:
        import multiprocessing
        from collections import deque
        from concurrent.futures.process import BrokenProcessPool

        # fork: workers start with luksbench imported and never re-run the caller's main module
        # (spawn does: a script without a __main__ guard would run again in every worker); no
        # garbage collector in them: parsing makes no reference cycles (it cost a tenth)
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        try:
            with ProcessPoolExecutor(workers, context, initializer=gc.disable) as pool:
                ahead: deque = deque()
                for chunk in chunks:
                    ahead.append(pool.submit(_ingest_chunk, str(raw_dir), chunk))
                    if len(ahead) < CHUNKS_AHEAD * workers:
                        continue
                    while pending:
                        pending.pop()()
                    yield ahead.popleft().result()
                    done += 1
                while pending:
                    pending.pop()()
                while ahead:
                    yield ahead.popleft().result()
                    done += 1
        except BrokenProcessPool as exc:  # e.g. a worker killed for memory: parse here instead
            print(
                f"ingest: parallel parsing failed ({exc}); parsing in one process", file=sys.stderr
            )
    while pending:
        pending.pop()()
    for chunk in chunks[done:]:
        yield _ingest_chunk(str(raw_dir), chunk)


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
