"""Raw run folder -> tidy tables (pandas), and the processed parquet files.

``fio_table``         one row per fio job x direction: the parser's columns, where the file sits in
                      the raw layout, its CPU sidecar (net of the idle baseline: cpucost) and the
                      json+ completion-latency percentiles (tails); fleet rows are per fio server.
``cryptsetup_table``  ``cryptsetup benchmark`` rows per host.
``env_table``         one row per host with the key facts of ``env.json`` flattened.
``stacks_table``      one row per host x stack from ``fio/manifest.json``'s stack descriptions.
``schedule_table``    one row per fio run of every session's manifest: when it ran, in which round.
``latency``           the json+ histograms of the fio table's measured rows (:data:`LATENCY_COLUMNS`).
``PLAN_TABLES``       env.json's plan and devices and the stacks' perf flags and notes, as long
                      tables (job_devices, patterns, plan_fio, plan_stacks, perf_flags, stack_notes).
``write_processed``   all of them as ``<processed_dir>/<table>.parquet`` and ``.csv``, incremental
                      (only new or changed raw files are parsed) and parallel.

Strict by design: every raw file that cannot be read, does not follow the layout, or holds a failed
fio job is collected and reported in one :class:`IngestError` that names each file and why. Raw is
read-only: nothing here writes into ``raw_dir``.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pandas as pd

from luksbench.analysis import ceph_tables, cpucost, ingest_parse, saturation, tablefiles, tails
from luksbench.analysis.ingest_cache import CACHE_DIRNAME, _IngestCache
from luksbench.analysis.ingest_columns import (  # noqa: F401 - the entry points' names, kept here
    _CPU_COLUMNS,
    FIO_DERIVED_COLUMNS,
    FIO_LAYOUT_COLUMNS,
    IngestError,
    _fio_dtypes,
    _relative,
    _stat_key,
    fio_columns,
    host_dirs,
    run_name,
)
from luksbench.analysis.ingest_parse import (
    _list_fio_folder,
    _parsed_chunks,
    default_workers,
)
from luksbench.analysis.ingest_stream import LatencyParquet, merged_bins, rows_by_chunk
from luksbench.analysis.ingest_tables import (  # noqa: F401 - the entry points' names, kept here
    CRYPTSETUP_TABLE_COLUMNS,
    ENV_COLUMNS,
    PLAN_TABLES,
    SCHEDULE_COLUMNS,
    STACKS_COLUMNS,
    _decoded_json,
    _json_document,
    _utc_times,
    cryptsetup_table,
    env_table,
    fleet_names,
    machine_paths,
    schedule_table,
    stacks_table,
)
from luksbench.analysis.stats import active_rows, with_pattern
from luksbench.formats.manifest import (
    migrated_manifest,
    result_sessions,
    session_records,
)
from luksbench.formats.remeasure import read_remeasured, remeasure_path
from luksbench.formats.targets import read_targets

#: completion-latency histograms from the json+ ``bins``, one row per bin of an active row
LATENCY_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "host stack workload rw bs_bytes iodepth rep job_slot direction pattern ns count"
).split()

#: the processed tables, in the order they are written (``<processed_dir>/<name>.parquet``)
PROCESSED_TABLES = (
    "fio",
    "latency",
    "cryptsetup",
    "env",
    "stacks",
    *PLAN_TABLES,
    "schedule",
    "ceph",
)
PROCESSED_TABLES += ("problems",)
PROCESSED_FILES = tuple(f"{name}.parquet" for name in PROCESSED_TABLES)


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
            try:
                planned = migrated_manifest(manifest, str(path))["sessions"]
            except (ValueError, KeyError):  # an unknown version: the schedule table names it
                continue
            planned = planned if isinstance(planned, int) and not isinstance(planned, bool) else 1
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
    chunk_files: int | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`fio_table` and the json+ latency histograms of its rows (:data:`LATENCY_COLUMNS`),
    read in the same pass; ``meanwhile()`` runs while the worker processes parse. ``chunk_files``:
    files per chunk (:func:`streamed_fio_table`)."""
    chunks: list[pd.DataFrame] = []
    fio = streamed_fio_table(
        raw_dir, chunks.append, strict, cache_dir, workers, meanwhile, chunk_files
    )
    return fio, _concat_latency(chunks)


def _empty_latency() -> pd.DataFrame:
    return pd.DataFrame.from_records([], columns=LATENCY_COLUMNS)


def _concat_latency(chunks: list[pd.DataFrame]) -> pd.DataFrame:
    """One latency table from the chunks :func:`streamed_fio_table` gave, in their order."""
    kept = [c for c in chunks if len(c)]
    if not kept:
        return chunks[0] if chunks else _empty_latency()
    return pd.concat(kept, ignore_index=True) if len(kept) > 1 else kept[0]


def streamed_fio_table(
    raw_dir: Path,
    latency_sink,
    strict: bool = True,
    cache_dir: Path | None = None,
    workers: int | None = None,
    meanwhile=None,
    chunk_files: int | None = None,
) -> pd.DataFrame:
    """:func:`fio_table` without the CPU cost columns; the latency table goes to
    ``latency_sink(frame)`` chunk by chunk, in its order (the chunks concatenated are the table).

    The files are parsed ``chunk_files`` at a time (default :data:`ingest_parse.CHUNK_FILES`) in
    the order of their names; a chunk's json+ bins become its latency rows and are dropped before later chunks
    are taken, so memory grows with the number of files only by what the fio table and the cache
    need of every file: its fio rows, its stat, problems and notes, and each run's summed-histogram
    percentiles."""
    raw_dir = Path(raw_dir)
    workers = default_workers() if workers is None else max(1, int(workers))
    keys, problems, targets, fleets, sessions, remeasured = _run_layout(raw_dir)
    notes: list = []
    cache = _IngestCache(Path(cache_dir)) if cache_dir is not None else None
    rows, results = cache.load(raw_dir, keys) if cache else (pd.DataFrame(), {})
    todo = [k for k in keys if k not in results]
    saving = cache is not None and bool(todo or set(cache.keys) != set(keys))
    if saving:
        cache.start_saving()
    context = (keys, targets, fleets, sessions, remeasured)
    try:
        frames, runs = _stream_chunks(
            raw_dir,
            keys,
            results,
            rows,
            cache,
            workers,
            meanwhile,
            chunk_files,
            context,
            latency_sink,
        )
    except BaseException:
        if saving:
            cache.abandon()
        raise
    for key in keys:
        res = results[key]
        if res["problems"] or res["notes"]:  # most files have neither
            problems += [(raw_dir / k, why) for k, why in res["problems"]]
            notes += [(f"{raw_dir}/{k}", why) for k, why in res["notes"]]  # thousands: no Path
    frames = [f for f in frames if len(f)]
    if len(frames) > 1:  # one concat for both the cache and the table
        frames = [pd.concat(frames, ignore_index=True)]
    if saving:
        cache.save({k: results[k]["stat"] for k in keys}, frames, results)
    if problems and strict:
        raise IngestError(raw_dir, problems)
    df = _assemble(frames, *context)
    # attrs last: pandas deep-copies them on every operation
    df = tails.with_run_percentiles(df, _concat_runs(runs))
    df.attrs["problems"] = [(str(p), why) for p, why in problems]
    df.attrs["notes"] = [(str(p), why) for p, why in notes]
    # how the table was made: files parsed now vs rows reused from the cache
    df.attrs["ingest"] = {"files": len(keys), "parsed": len(todo), "reused": len(keys) - len(todo)}
    return df


def _run_layout(raw_dir: Path) -> tuple[list[str], list, dict, dict, dict, dict]:
    """(the fio results to read, problems so far, each host's design targets, its fleet names,
    the sessions: :func:`_recorded_results`, each host's re-measured pairs per workload) of a run
    folder."""
    problems, targets, fleets = [], {}, {}  # fleets: {host: fleet_names}
    remeasured: dict[str, dict[str, int]] = {}  # host dir -> workload -> pairs measured again
    for hdir in host_dirs(raw_dir):
        tpath = hdir / "fio" / "targets.json"
        if tpath.exists():
            try:
                targets[hdir.name] = read_targets(tpath)
            except ValueError as exc:
                problems.append((tpath, str(exc)))
        if (rpath := remeasure_path(hdir)).exists():
            try:
                remeasured[hdir.name] = read_remeasured(rpath)
            except ValueError as exc:
                problems.append((rpath, str(exc)))
        fleets[hdir.name] = fleet_names(hdir)
    keys, strays = _list_fio_folder(raw_dir)
    layout = "does not follow <host>/fio/<stack>/<rw>-<bs>-qd<iodepth>/rep<k>.json"
    problems += [(raw_dir / key, layout) for key in strays]
    keys, unrecorded, sessions = _recorded_results(raw_dir, keys)
    return keys, problems + unrecorded, targets, fleets, sessions, remeasured


def _concat_runs(runs: list[pd.DataFrame]) -> pd.DataFrame:
    kept = [r for r in runs if len(r)]
    return pd.concat(kept, ignore_index=True) if kept else tails.run_percentiles(pd.DataFrame())


def _stream_chunks(
    raw_dir, keys, results, rows, cache, workers, meanwhile, chunk_files, context, latency_sink
) -> tuple[list[pd.DataFrame], list[pd.DataFrame]]:
    """Parse the files not in ``results`` chunk by chunk (name order), each chunk's latency rows to
    ``latency_sink``, its bins to the cache; returns the fio row frames (cached ``rows`` first)
    and each chunk's run percentiles (:func:`tails.run_percentiles`). ``results`` gains the parsed
    files' results."""
    size = max(1, int(chunk_files or ingest_parse.CHUNK_FILES))
    names = sorted(keys)  # the latency table's order: by file name
    chunks = [names[i : i + size] for i in range(0, len(names), size)]
    cached_rows = rows_by_chunk(rows, names, size, len(chunks))
    to_parse = [[k for k in chunk if k not in results] for chunk in chunks]
    cached_bins = cache.cached_bins if cache is not None else None
    frames, runs = [rows], []
    parsed = _parsed_chunks(raw_dir, to_parse, workers, meanwhile)
    for i, (new_rows, new_bins, new_results) in enumerate(parsed):
        reused = {k for k in chunks[i] if k in results}
        old_bins = cached_bins.take(reused, chunks[i][-1]) if cached_bins else pd.DataFrame()
        results.update(new_results)
        frames.append(new_rows)
        bins = merged_bins(old_bins, new_bins)
        if cache is not None:
            cache.write_bins(bins)
        fio = _assemble([cached_rows[i], new_rows], *context)
        latency = _latency_table(fio, [bins])
        runs.append(tails.run_percentiles(latency))
        latency_sink(latency)
    if cached_bins is not None:
        cached_bins.close()
    return frames, runs


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
    remeasured: dict | None = None,
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
    again = zip(df["host"].tolist(), df["workload"].tolist(), strict=True)
    df["remeasured_pairs"] = [float((remeasured or {}).get(h, {}).get(w, 0)) for h, w in again]
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
    chunk_files: int | None = None,
) -> dict[str, pd.DataFrame]:
    """All tables of one run folder (:data:`PROCESSED_TABLES`).

    A bad raw file (truncated, empty, text only, not fio output, NaN or negative values, a failed
    fio job, in the wrong place, a result its host's manifests do not record) is left out and
    listed in the "problems" table with the reason (severity "excluded"), as is a recorded result
    that is missing; files used with a caveat (several JSON documents: the last counts) are listed
    as "note". ``strict``: any excluded file raises one :class:`IngestError` naming every bad file.
    ``cache_dir``/``workers``/``chunk_files``: as for :func:`fio_table` and
    :func:`streamed_fio_table`."""
    chunks: list[pd.DataFrame] = []
    tables = _ingest_streamed(raw_dir, chunks.append, strict, cache_dir, workers, chunk_files)
    order = dict.fromkeys(PROCESSED_TABLES)
    return {name: tables[name] if name != "latency" else _concat_latency(chunks) for name in order}


def _ingest_streamed(
    raw_dir: Path,
    latency_sink,
    strict: bool = False,
    cache_dir: Path | None = None,
    workers: int | None = None,
    chunk_files: int | None = None,
) -> dict[str, pd.DataFrame]:
    """:func:`ingest_run` but the latency table, which goes to ``latency_sink`` chunk by chunk
    (:func:`streamed_fio_table`)."""
    raw_dir = Path(raw_dir)
    funcs = {"cryptsetup": cryptsetup_table, "env": env_table, "stacks": stacks_table}
    funcs |= PLAN_TABLES
    funcs["schedule"] = schedule_table
    others, links = {}, []  # read while the fio results are parsed

    def read_others():
        others.update((name, func(raw_dir, strict=False)) for name, func in funcs.items())
        links.extend(symbolic_links(raw_dir))

    fio = streamed_fio_table(
        raw_dir, latency_sink, False, cache_dir, workers, read_others, chunk_files
    )
    _decoded_json.cache_clear()
    tables = {"fio": fio} | others
    tables["fio"] = _with_cpu_cost(tables["fio"], tables["schedule"])
    tables["ceph"] = ceph_tables.ceph_table(raw_dir, tables["fio"], tables["stacks"])
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
    chunk_files: int | None = None,
) -> dict[str, Path]:
    """Ingest ``raw_dir`` and write ``<processed_dir>/<table>.parquet`` (and ``.csv``, with the
    column dictionary) for every table of :func:`ingest_run`; returns {table name: path}.

    Every excluded file and every note is also printed on stderr, naming the file and why.
    Refuses a ``processed_dir`` inside ``raw_dir`` (raw is read-only). ``incremental``: with the
    cache in ``<processed_dir>/.ingest-cache/`` (:func:`fio_table`). The latency table is written
    chunk by chunk as the files are parsed (``chunk_files`` at a time: :func:`streamed_fio_table`),
    never held whole; nothing replaces a processed file when ingest fails."""
    raw_dir, processed_dir = Path(raw_dir).resolve(), Path(processed_dir).resolve()
    if processed_dir == raw_dir or raw_dir in processed_dir.parents:
        raise ValueError(
            f"processed_dir {processed_dir} is inside raw_dir {raw_dir}: raw is read-only"
        )
    cache_dir = processed_dir / CACHE_DIRNAME if incremental else None
    created = not processed_dir.exists()
    processed_dir.mkdir(parents=True, exist_ok=True)
    latency = LatencyParquet(processed_dir / "latency.parquet", _empty_latency())
    collecting = gc.isenabled()
    gc.disable()  # ingest keeps many small objects alive: collections find no garbage, cost 5 %
    try:
        tables = _ingest_streamed(raw_dir, latency, strict, cache_dir, workers, chunk_files)
    except BaseException:
        latency.discard()
        if created and not any(processed_dir.iterdir()):
            processed_dir.rmdir()
        raise
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
    for name in tables:
        tables[name].attrs = {}  # the problems and notes, reported above; not table data
    paths = machine_paths(tables["env"], raw_dir, tables["job_devices"])
    if latency.written:
        latency.finish(paths)
    else:
        latency.discard()
        tables["latency"] = latency.empty
    written = tablefiles.write_tables(processed_dir, tables, paths)
    return {name: written.get(name, latency.path) for name in PROCESSED_TABLES}


def read_processed(processed_dir: Path) -> dict[str, pd.DataFrame]:
    """The parquet files written by :func:`write_processed` (plus loss.parquet when present)."""
    paths = {name: Path(processed_dir) / f"{name}.parquet" for name in (*PROCESSED_TABLES, "loss")}
    return {name: pd.read_parquet(path) for name, path in paths.items() if path.exists()}
