"""fio JSON / json+ output (any fio version from 2.1 on) to tidy rows: one per job and direction.

Standard library only: the test box runs this on minimal servers.

Real fio output files are messy, and this module accepts what fio and shells actually write:

* text before the JSON (fio error lines, ``fio: terminating on signal 2``, the client/server
  ``hostname=... fio=...`` handshake, a stray ``>``) and after it (``--output-format=json,normal``);
* several complete JSON documents in one file (SIGUSR1 status dumps, pasted shell sessions):
  the LAST complete one counts, and a one-line note goes to ``warn``;
* duplicate keys (fio's ``"0.00"`` percentile bug): the last value is kept, like ``json`` does;
* ``steadystate`` objects, json+ ``bins`` (ignored in rows, see :func:`clat_histogram`),
  client/server output (``client_stats`` with a ``hostname`` per entry).

Units are normalised whatever the fio version: bytes, bytes/s and nanoseconds. fio 2.x writes
``io_bytes`` in KiB (fio 3 added ``io_kbytes`` and made ``io_bytes`` bytes), ``bw`` in KiB/s
(fio 3 added ``bw_bytes``) and latencies in µs under ``clat``/``lat``/``slat`` (fio 3 writes
``clat_ns``/``lat_ns``/``slat_ns``). The presence of the fio 3 keys decides, not the version
string, so development builds (``fio-2.18-59-g618e``) are handled too.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

from luksbench.formats.layout import LayoutError, bs_to_bytes, read_raw_file

# The fixed contract, then extras: bs is the block size option as written (per-direction lists,
# unparsable values), lat_p99_ns only with lat_percentiles=1, job_runtime_ms (fio >= 3) is summed
# over the job's threads, ss_attained 1/0 (empty without a steadystate criterion), timestamp in
# unix seconds (empty for fio < 2.2).
FIO_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "file host job job_index direction rw bs_bytes iodepth numjobs runtime_ms io_bytes bw_bytes "
    "iops lat_mean_ns clat_mean_ns clat_p50_ns clat_p99_ns clat_p999_ns usr_cpu sys_cpu error "
    "fio_version groupid ioengine direct bs clat_stddev_ns clat_max_ns slat_mean_ns lat_p99_ns ctx "
    "job_runtime_ms ss_attained timestamp"
).split()

DIRECTIONS = ("read", "write", "trim")

# fio's own defaults, used when an option appears neither in the job nor in the global options.
FIO_DEFAULTS = {"rw": "read", "bs": "4k", "iodepth": "1", "numjobs": "1", "direct": "0"}
# The options of a row (name, then fio's aliases); all but ioengine fall back to fio's defaults.
_JOB_OPTIONS = (("rw", "readwrite"), ("bs", "blocksize"), ("iodepth",), ("numjobs",), ("direct",))
_JOB_OPTIONS += (("ioengine",),)

# In client/server output the last client_stats entry sums all hosts; rows are per host.
ALL_CLIENTS_JOBNAME = "All clients"

Warn = Callable[[str], None]


class FioParseError(ValueError):
    """A file that holds no usable fio JSON output; the message names the file and the problem."""


def _warn_on_stderr(message: str) -> None:
    print(message, file=sys.stderr)


# --------------------------------------------------------------------------- finding the document


# A JSON document starts at a line's first '{' (fio indents every nested object), possibly glued
# to non-blank junk such as a stray '>' left by a shell; indented '{' are nested objects.
# {type of the text: (first start, later start)}; '\n' first: a fast search; on ASCII bytes the
# same (a str pattern's \s also matches \x1c to \x1f)
_DOCUMENT_STARTS = {
    str: (re.compile(r"[^\s{]*\{"), re.compile(r"\n[^\s{]*\{")),
    bytes: (re.compile(rb"[^\s\x1c-\x1f{]*\{"), re.compile(rb"\n[^\s\x1c-\x1f{]*\{")),
}


def _document_pieces(text: str | bytes) -> list[tuple[int, int]]:
    """(start, next start) of every place a JSON document may start, in one pass over ``text``."""
    first, later = _DOCUMENT_STARTS[type(text)]
    first, later = first.match(text), later.finditer(text)
    starts = [m.end() - 1 for m in (first, *later) if m]
    return list(zip(starts, [*starts[1:], len(text)], strict=False))  # no start: []


_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGIT_RUN = b"0" * 19  # 18 digits always fit in 64 bits


def _fast_documents(raw: bytes, loads: Callable[[bytes], object]) -> list[object] | None:
    """The documents the scan below would find, each decoded by ``loads`` from the text up to the
    next document start, or None when one of them does not start with a JSON value (then the scan
    decides, with its messages), the file is not ASCII or holds a run of 19 digits or more."""
    if not raw.isascii() or _LONG_DIGIT_RUN in raw.translate(_DIGITS_TO_ZERO):
        return None  # a faster decoder (orjson) may read an integer past 64 bits as a float
    first_start, later_start = _DOCUMENT_STARTS[bytes]
    first = first_start.match(raw) or later_start.search(raw)
    if first and raw[first.end() - 2 : first.end() - 1] in (b"", b"\n"):  # '{' begins its line
        try:  # the common file: one JSON object from a line's start (text lines before it) on
            return [loads(raw[first.end() - 1 :])]
        except ValueError:
            pass
    try:
        return [_loads_value_before_text(loads, raw[a:b]) for a, b in _document_pieces(raw)]
    except ValueError:  # truncated, NaN: the standard path's cases
        return None


def _loads_value_before_text(loads: Callable, text: bytes) -> object:
    """The JSON value ``text`` starts with, text after it allowed (``--output-format=json,normal``)."""
    try:
        return loads(text)
    except json.JSONDecodeError as exc:  # also orjson's: the error is where the value's text ends
        return loads(text[: exc.pos])  # a value, when the error was the text after it


def _byte_offset(text: str, char_pos: int) -> int:
    return len(text[:char_pos].encode("utf-8", errors="replace"))


def _scan_json_documents(text: str) -> tuple[list[object], list[tuple[int, str, int]]]:
    """All complete JSON documents at a document start, and the starts that failed to decode:
    (start, json's message, where). After a document the scan resumes at its end."""
    decoder = json.JSONDecoder()
    documents, failures, resume = [], [], 0
    for start, end in _document_pieces(text):
        if start >= resume:
            try:
                value, resume = _decode_from(decoder, text, start, end)
                documents.append(value)
            except json.JSONDecodeError as exc:
                failures.append((start, exc.msg, start + exc.pos))
    return documents, failures


def _decode_from(decoder: json.JSONDecoder, text: str, start: int, end: int) -> tuple[object, int]:
    """``decoder.raw_decode(text, start)`` in time linear in the text it reads, not in ``start``
    (json's error counts the lines before it): it decodes ``text[start:end]``, and twice as much
    while the value runs past the piece's end. Errors are positioned in the piece."""
    while True:
        piece = text[start:end]
        try:
            value, length = decoder.raw_decode(piece)
            return value, start + length
        except RecursionError:
            raise json.JSONDecodeError("Nesting too deep", piece, 0) from None
        except json.JSONDecodeError as exc:  # past the end: the piece's end, a string, a literal
            if end >= len(text) or not (
                exc.msg.startswith("Unterminated") or exc.pos > end - start - 10
            ):
                raise
        end = start + 2 * (end - start) + 64


def _is_fio_document(value: object) -> bool:
    return isinstance(value, dict) and (
        isinstance(value.get("jobs"), list) or isinstance(value.get("client_stats"), list)
    )


def _describe_failure(path: Path, text: str, raw: bytes, failure: tuple[int, str, int]) -> str:
    start, message, position = failure
    # The decoder gives up at EOF, or (unterminated string / cut-off literal) on the last line:
    # either way nothing but the rest of that last line follows the error position.
    if "\n" not in text[position:].strip() or message.startswith("Unterminated string"):
        return (
            f"{path}: no complete fio JSON document (JSON starting at byte "
            f"{_byte_offset(text, start)} truncated at byte {len(raw.rstrip())})"
        )
    return (
        f"{path}: no complete fio JSON document (invalid JSON at byte "
        f"{_byte_offset(text, position)}, line {text.count(chr(10), 0, position) + 1}: {message})"
    )


def load_fio_document(
    path: Path,
    warn: Warn = _warn_on_stderr,
    loads: Callable[[bytes], object] | None = None,
    stats: list | None = None,
) -> dict:
    """The last complete fio JSON document in ``path`` (see the module docstring for what is accepted).

    Raises :class:`FioParseError` naming the file when there is none: empty file, text only,
    truncated or invalid JSON, or JSON that is not fio output. ``loads``: a faster JSON decoder
    (bytes -> value, raising ValueError) tried first on a file that is one JSON object; it must
    give ``json``'s values for what it accepts. ``stats``: as for :func:`read_raw_file`.
    """
    try:
        raw = read_raw_file(path, stats)
    except OSError as exc:
        raise FioParseError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    return fio_output_document(raw, path, warn, loads)


def fio_output_document(raw: bytes, source, warn: Warn = _warn_on_stderr, loads=None) -> dict:
    """:func:`load_fio_document` on fio's output as bytes (``source`` names it in messages)."""
    documents = _fast_documents(raw, loads) if loads is not None else None
    fio_documents = [doc for doc in documents or () if _is_fio_document(doc)]
    if not fio_documents:
        fio_documents = _scanned_fio_documents(source, raw)
    if len(fio_documents) > 1:
        warn(f"{source}: {len(fio_documents)} complete fio JSON documents, using the last one")
    return fio_documents[-1]


def _scanned_fio_documents(path: Path, raw: bytes) -> list[dict]:
    """The fio documents the scan finds in the file's text; raises :class:`FioParseError` saying
    why when there is none."""
    # fio writes ASCII; replacement characters keep a stray binary byte from aborting the parse.
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        what = "file is empty" if not raw else "file holds only whitespace"
        raise FioParseError(f"{path}: no complete fio JSON document ({what})")

    documents, failures = _scan_json_documents(text)
    fio_documents = [doc for doc in documents if _is_fio_document(doc)]
    if not fio_documents:
        if failures:
            raise FioParseError(_describe_failure(path, text, raw, failures[0]))
        if documents:
            keys = list(documents[-1])[:6] if isinstance(documents[-1], dict) else []
            raise FioParseError(
                f"{path}: JSON document is not fio output (no 'jobs' or 'client_stats' list; "
                f"top-level keys: {', '.join(map(repr, keys)) or 'none'})"
            )
        first_line = next(line.strip() for line in text.splitlines() if line.strip())
        if len(first_line) > 80:
            first_line = first_line[:77] + "..."
        raise FioParseError(
            f"{path}: no complete fio JSON document (text only: first line {first_line!r})"
        )
    return fio_documents


# --------------------------------------------------------------------------- options and units


def job_entries(doc: dict) -> list[tuple[int, dict, str]]:
    """(index in the document's list, job entry, host) for every per-job entry of a fio document."""
    if not isinstance(doc.get("client_stats"), list):
        return [(i, entry, "") for i, entry in enumerate(doc["jobs"]) if isinstance(entry, dict)]
    entries = [
        (i, e, str(e.get("hostname", "")), e.get("port") if type(e.get("port")) is int else None)
        for i, e in enumerate(doc["client_stats"])
        if isinstance(e, dict) and e.get("jobname") != ALL_CLIENTS_JOBNAME
    ]
    # Several servers on one host (distinct ports) would share a hostname: add the port.
    with_port = len({(h, port) for _, _, h, port in entries}) > len({e[2] for e in entries})
    return [
        (i, e, f"{h}:{port}" if with_port and port is not None else h) for i, e, h, port in entries
    ]


def _job_options(entry: dict, doc: dict) -> tuple:
    """rw, bs, iodepth, numjobs, direct, ioengine of a job entry: from its job options, else the
    global options (a name, then fio's aliases), else fio's defaults."""
    # fio 2.1.x writes neither "job options" nor "global options": the options are unknown,
    # and claiming fio's defaults (rw=read for a write job) would be wrong data.
    found = FIO_DEFAULTS.copy() if "job options" in entry or "global options" in doc else {}
    for options in (doc.get("global options"), entry.get("job options")):  # the job's win
        for names in _JOB_OPTIONS if isinstance(options, dict) else ():
            for name in names:
                if name in options:
                    found[names[0]] = str(options[name])
                    break
    rw, bs, *numbers, ioengine = map(found.get, (names[0] for names in _JOB_OPTIONS))
    return rw, bs, *map(_to_int, numbers), ioengine


def _to_int(value: str | None) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _direction_of_rw(rw: str | None) -> str:
    """The single direction an rw pattern moves, '' for mixed or unknown patterns."""
    pattern = (rw or "").split(":")[0].strip().removeprefix("rand")
    return pattern if pattern in DIRECTIONS else ""


@functools.lru_cache(maxsize=1024)  # a run has few distinct bs options
def _bs_bytes_for_direction(bs_option: str | None, direction: str) -> int | None:
    """Bytes per I/O for one direction from fio's ``bs`` option (``4k``, ``4k,8k``, ``,64k``)."""
    if bs_option is None:
        return None
    values = [value.strip() for value in bs_option.split(",")]
    position = DIRECTIONS.index(direction) if direction in DIRECTIONS else 0
    # fio: a direction without a value inherits the last one given; an empty value keeps 4k.
    value = values[position] if position < len(values) else values[-1]
    try:
        return bs_to_bytes(value or FIO_DEFAULTS["bs"])
    except LayoutError:
        return None  # e.g. a bs range; the raw option stays visible in the "bs" column


def _io_bytes(stats: dict) -> int:
    raw = stats.get("io_bytes") or 0
    return raw if "io_kbytes" in stats else raw * 1024  # fio 2.x: "io_bytes" is KiB


def _bw_bytes(stats: dict) -> float | int | None:
    if "bw_bytes" in stats:
        return stats["bw_bytes"]
    bw_kib = stats.get("bw")
    return None if bw_kib is None else bw_kib * 1024


_IN_NS = {name: f"{name}_ns" for name in ("lat", "clat", "slat")}


def _latency_stats(stats: dict, name: str) -> tuple[dict | None, int]:
    """fio 3 ``<name>_ns`` (ns) or fio 2 ``<name>`` (µs), with the factor to nanoseconds."""
    in_ns = stats.get(_IN_NS[name])
    if isinstance(in_ns, dict):
        return in_ns, 1
    if isinstance(stats.get(name), dict):
        return stats[name], 1000
    return None, 1


def _latency_field(lat: dict | None, to_ns: int, field: str) -> float | None:
    if lat is None or lat.get(field) is None or lat.get("N") == 0:
        return None  # no samples (failed job, disable_lat): empty, not a fake 0
    return lat[field] * to_ns


def _percentile(lat: dict | None, to_ns: int, spelled: str) -> float | int | None:
    """A percentile by fio's own spelling (``"99.900000"``): one lookup, a scan if spelled else."""
    table = lat.get("percentile") if lat else None
    if not isinstance(table, dict):
        return None  # failed job, clat_percentiles=0, or lat_percentiles not requested
    if spelled in table:
        return table[spelled] * to_ns
    percent = float(spelled)
    for key, value in table.items():
        try:
            if abs(float(key) - percent) < 1e-6:
                return value * to_ns
        except ValueError:
            continue
    return None


# --------------------------------------------------------------------------- rows


def _row(path, doc, index, entry, host, options, direction, stats) -> tuple:
    """One row: a tuple in :data:`FIO_COLUMNS` order."""
    stats = stats if isinstance(stats, dict) else {}
    io_bytes = _io_bytes(stats)
    moved_data = io_bytes > 0
    lat, lat_ns = _latency_stats(stats, "lat") if moved_data else (None, 1)
    clat, clat_ns = _latency_stats(stats, "clat") if moved_data else (None, 1)
    slat, slat_ns = _latency_stats(stats, "slat") if moved_data else (None, 1)
    steadystate = entry.get("steadystate")
    rw, bs, iodepth, numjobs, direct, ioengine = options
    return (
        str(path),
        host,
        str(entry.get("jobname", "")).strip(),  # fio may keep a trailing space
        index,
        direction,
        rw,
        _bs_bytes_for_direction(bs, direction),
        iodepth,
        numjobs,
        stats.get("runtime"),
        io_bytes,
        _bw_bytes(stats) if moved_data else 0,
        stats.get("iops") if moved_data else 0,
        _latency_field(lat, lat_ns, "mean"),
        _latency_field(clat, clat_ns, "mean"),
        _percentile(clat, clat_ns, "50.000000"),
        _percentile(clat, clat_ns, "99.000000"),
        _percentile(clat, clat_ns, "99.900000"),
        entry.get("usr_cpu"),
        entry.get("sys_cpu"),
        entry.get("error"),
        doc.get("fio version", ""),
        entry.get("groupid"),
        ioengine,
        direct,
        bs,
        _latency_field(clat, clat_ns, "stddev"),
        _latency_field(clat, clat_ns, "max"),
        _latency_field(slat, slat_ns, "mean"),
        _percentile(lat, lat_ns, "99.000000"),
        entry.get("ctx"),
        entry.get("job_runtime"),
        steadystate.get("attained") if isinstance(steadystate, dict) else None,
        doc.get("timestamp"),
    )


def parse_fio_file(path: Path, warn: Warn = _warn_on_stderr) -> list[dict]:
    """Rows (dicts keyed by :data:`FIO_COLUMNS`) for one fio JSON / json+ output file.

    One row per job entry (``jobs``; for client/server output ``client_stats`` without the "All
    clients" sum, ``host`` the server's name) and direction that moved data. A job entry that
    moved none (a failed job, a run killed before any I/O) still gives ONE row, so a failed run is
    visible: direction from ``rw`` ("" for mixed patterns), io_bytes/bw_bytes/iops 0, ``error``
    set. What fio did not measure is ``None``, never 0; rw/bs/iodepth/numjobs are ``None`` when
    fio recorded no options at all (fio 2.1.x).

    Raises :class:`FioParseError` naming the file when it holds no complete fio JSON document
    or the document lists no job entries. ``warn`` receives one-line notes (several documents).
    """
    rows = document_tuples(path, load_fio_document(path, warn))
    return [dict(zip(FIO_COLUMNS, row, strict=True)) for row in rows]


def document_tuples(path: Path | str, doc: dict) -> list[tuple]:
    """:func:`parse_fio_file`'s rows, as tuples in :data:`FIO_COLUMNS` order, of a document
    :func:`load_fio_document` returned for ``path`` (the ``file`` column; messages name it)."""
    entries = job_entries(doc)
    if not entries:
        raise FioParseError(f"{path}: fio JSON document lists no job entries")

    rows = []
    for index, entry, host in entries:
        try:
            job_rows = _job_rows(path, doc, index, entry, host)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            # A value of the wrong type somewhere in the entry (a hand-edited or corrupted file).
            raise FioParseError(
                f"{path}: malformed fio document: job entry {index} "
                f"({str(entry.get('jobname', '?')).strip()}): {type(exc).__name__}: {exc}"
            ) from exc
        for row in job_rows:
            _check_measurements(path, row)
        rows.extend(job_rows)
    return rows


def _job_rows(path, doc, index, entry, host) -> list[tuple]:
    options = _job_options(entry, doc)  # every direction's row shares them
    job_rows = [
        _row(path, doc, index, entry, host, options, direction, entry[direction])
        for direction in DIRECTIONS
        if isinstance(entry.get(direction), dict) and _io_bytes(entry[direction]) > 0
    ]
    if not job_rows:
        direction = _direction_of_rw(options[0])
        stats = entry.get(direction) if direction else None
        job_rows = [_row(path, doc, index, entry, host, options, direction, stats)]
    return job_rows


# Measured values: each must be a finite, non-negative number, or None where fio measured nothing.
_CHECKED_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "runtime_ms io_bytes bw_bytes iops lat_mean_ns clat_mean_ns clat_p50_ns clat_p99_ns "
    "clat_p999_ns usr_cpu sys_cpu clat_stddev_ns clat_max_ns slat_mean_ns lat_p99_ns "
    "job_runtime_ms error"
).split()
_CHECKED_POSITIONS = [(FIO_COLUMNS.index(name), name) for name in _CHECKED_COLUMNS]


def _check_measurements(path: Path, row: tuple) -> None:
    """Refuse NaN, infinities, negative numbers and non-numbers (bools, text, lists): they must
    never reach a table. JSON values are exactly int, float, bool, str, list, dict or None."""
    for position, column in _CHECKED_POSITIONS:
        value = row[position]
        if value is None or (type(value) in (int, float) and value >= 0 and math.isfinite(value)):
            continue
        raise FioParseError(
            f"{path}: job {row[3]} ({row[2]}) {row[4] or 'all'}: "
            f"{column} is {value!r}, expected a finite non-negative number"
        )


# --------------------------------------------------------------------------- json+ histograms


def _fio2_bin_index_to_usec(index: int, plat_bits: int, plat_val: int) -> int:
    """fio 2.x json+ bins are bucket indices: fio's plat_idx_to_val() (stat.c), in µs."""
    if index < (plat_val << 1):
        return index
    error_bits = (index >> plat_bits) - 1
    base = 1 << (error_bits + plat_bits)
    k = index % plat_val
    return int(base + (k + 0.5) * (1 << error_bits))


def _bins_to_ns(bins: dict, to_ns: int) -> list[tuple[int, int]]:
    if "FIO_IO_U_PLAT_BITS" in bins:  # fio 2.x: keys are bucket indices, values in µs
        plat_bits, plat_val = bins["FIO_IO_U_PLAT_BITS"], bins["FIO_IO_U_PLAT_VAL"]
        pairs = [
            (_fio2_bin_index_to_usec(int(key), plat_bits, plat_val) * to_ns, count)
            for key, count in bins.items()
            if key.isdigit()
        ]
    else:  # fio 3: keys are the bucket's latency in ns
        pairs = [(int(key), count) for key, count in bins.items()]
    return sorted((ns, count) for ns, count in pairs if count)


def clat_histogram(
    path: Path, warn: Warn = _warn_on_stderr
) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """Completion-latency histograms of a json+ file: ``{(job_index, direction): [(ns, count)]}``
    for the job/direction pairs with ``bins`` (plain ``json`` output: ``{}``), without 0 counts."""
    return document_histograms(load_fio_document(path, warn))


def document_histograms(doc: dict) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """:func:`clat_histogram` of a document :func:`load_fio_document` returned."""
    histograms = {}
    for index, entry, _host in job_entries(doc):
        for direction in DIRECTIONS:
            stats = entry.get(direction)
            if not isinstance(stats, dict):
                continue
            clat, to_ns = _latency_stats(stats, "clat")
            if clat and isinstance(clat.get("bins"), dict):
                histograms[(index, direction)] = _bins_to_ns(clat["bins"], to_ns)
    return histograms


# --------------------------------------------------------------------------- impossible numbers

#: a fio timestamp is a date between 1970 and 2100 (unix seconds)
LAST_PLAUSIBLE_TIMESTAMP = 4_102_444_800
#: bandwidth may differ from io_bytes / runtime by fio's rounding: bw in whole KiB/s (per job of
#: a group: up to this many jobs' KiB), runtime in whole ms, and jobs of one group ending apart
_BW_ROUNDING_BYTES = 1024
_BW_GROUP_SLACK = 0.05
# json+ bins may count the I/Os still in flight when the counters were read, beyond total_ios
_BINS_IN_FLIGHT = 4096


def implausible_numbers(doc: dict, rows: list[tuple]) -> str | None:
    """Why a fio document's numbers cannot all be true, or None: a timestamp that is no date,
    bandwidth that ``io_bytes / runtime`` contradicts beyond fio's rounding, json+ bins with
    negative, fractional or more counts than the I/Os the job did. ``rows`` are
    :func:`document_tuples` of ``doc``; the file should be left out of every statistic."""
    return _implausible_timestamp(doc) or _implausible_bandwidth(rows) or _implausible_bins(doc)


def _implausible_timestamp(doc: dict) -> str | None:
    for key, scale in (("timestamp", 1), ("timestamp_ms", 1000)):
        value = doc.get(key)
        if value is None:
            continue
        if type(value) is not int or not 0 <= value < LAST_PLAUSIBLE_TIMESTAMP * scale:
            return f"{key} is {value!r}, not a date (unix time between 1970 and 2100)"
    return None


def _implausible_bandwidth(rows: list[tuple]) -> str | None:
    at = {name: FIO_COLUMNS.index(name) for name in ("io_bytes", "bw_bytes", "runtime_ms")}
    for row in rows:
        io_bytes, bw, runtime_ms = (
            row[at[name]] for name in ("io_bytes", "bw_bytes", "runtime_ms")
        )
        if not io_bytes or not runtime_ms or bw is None:
            continue
        expected = io_bytes * 1000 / runtime_ms
        jobs = row[FIO_COLUMNS.index("numjobs")]
        jobs = jobs if type(jobs) is int and 0 < jobs <= 4096 else 1
        allowed = _BW_ROUNDING_BYTES * jobs + expected * (2 / runtime_ms + _BW_GROUP_SLACK)
        if abs(bw - expected) > allowed:
            return (
                f"job {row[3]} ({row[2]}) {row[4]}: bandwidth {bw:.0f} B/s, but io_bytes / "
                f"runtime is {expected:.0f} B/s ({io_bytes} B in {runtime_ms} ms)"
            )
    return None


def _implausible_bins(doc: dict) -> str | None:
    for index, entry, _host in job_entries(doc):
        for direction in DIRECTIONS:
            stats = entry.get(direction)
            clat = _latency_stats(stats, "clat")[0] if isinstance(stats, dict) else None
            bins = clat.get("bins") if clat else None
            if not isinstance(bins, dict):
                continue
            counts = [n for key, n in bins.items() if not key.startswith("FIO_IO_U_")]
            where = f"job {index} ({str(entry.get('jobname', '')).strip()}) {direction}"
            bad = next((n for n in counts if type(n) is not int or n < 0), None)
            if bad is not None:
                return f"{where}: json+ histogram bin count {bad!r}, not a count of I/Os"
            done = stats.get("total_ios")
            io_bytes = _io_bytes(stats)
            most = done if type(done) is int and done > 0 else io_bytes // 512
            if sum(counts) > 2 * most + _BINS_IN_FLIGHT:
                return (
                    f"{where}: json+ histogram counts {sum(counts)} I/Os, more than the "
                    f"{most} {'the job completed' if most == done else 'its bytes allow'}"
                )
    return None
