"""Names and paths that carry through the project: the raw layout and workload ids.

Raw layout (one run's folder is ``RAW_DIR = data/raw/<run>``)::

    <RAW_DIR>/<host>/env.json
    <RAW_DIR>/<host>/cryptsetup-benchmark.txt
    <RAW_DIR>/<host>/fio/<stack>/<workload>/rep<k>.json
    <RAW_DIR>/<host>/fio/<stack>/<workload>/rep<k>.cpu.json
    <RAW_DIR>/<host>/fio/manifest.json                 # the schedule as it was run, the stacks'
                                                       # descriptions (no key material)
    <RAW_DIR>/<host>/fio/sessions/                     # each session's write-once manifest
    <RAW_DIR>/<host>/fio/pilot-manifest.json           # the adaptive design's pilot
    <RAW_DIR>/<host>/fio/targets.json                  # adaptive or sequential designs only

A workload id is ``<rw>-<bs>-qd<iodepth>`` for a cell of the main matrix and
``<rw>-<bs>-qd<iodepth>-<pattern>`` for a cell of a named pattern (config ``patterns:``, e.g. the
raid5-2012 large-block cells ``randwrite-1g-qd1-largeblock``, whose bs is the large block).

Standard library only: the test box imports this.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

_SIZE_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_BS_RE = re.compile(r"^(\d+)([kmgt]?)(i?b)?\Z", re.IGNORECASE)
_WORKLOAD_RE = re.compile(
    r"^(?P<rw>[a-z]+)-(?P<bs>\d+[kmgt]?)-qd(?P<iodepth>\d+)(?:-(?P<pattern>[a-z][a-z0-9]*))?\Z"
)
PATTERN_NAME_RE = re.compile(r"^[a-z][a-z0-9]*\Z")
#: the name of a fio result file in its cell folder
REP_NAME = re.compile(r"^rep(?P<rep>\d+)\.json\Z")


class LayoutError(ValueError):
    """A path or name that does not follow the raw layout."""


def bs_to_bytes(bs: str | int) -> int:
    """Block size as fio writes it (``4k``, ``1m``, ``64KiB``, ``4096``) to bytes (1024-based)."""
    if isinstance(bs, int):
        return bs
    m = _BS_RE.match(str(bs).strip())
    if not m:
        raise LayoutError(f"not a block size: {bs!r} (expected e.g. 4k, 64k, 1m, 4096)")
    return int(m.group(1)) * _SIZE_SUFFIX[m.group(2).lower()]


def bs_label(bs: str | int) -> str:
    """Canonical fio-style label for a block size: 4096 -> '4k', 1048576 -> '1m'."""
    n = bs_to_bytes(bs)
    for suffix in ("t", "g", "m", "k"):
        unit = _SIZE_SUFFIX[suffix]
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


@dataclass(frozen=True, order=True)
class Workload:
    """One cell of the fio matrix: access pattern, block size, queue depth, and the named pattern
    whose fio options it runs with ("" for the main matrix)."""

    rw: str
    bs_bytes: int
    iodepth: int
    pattern: str = ""

    @property
    def bs(self) -> str:
        return bs_label(self.bs_bytes)

    @functools.cached_property  # once per cell: ingest asks for it per file
    def id(self) -> str:
        base = f"{self.rw}-{self.bs}-qd{self.iodepth}"
        return f"{base}-{self.pattern}" if self.pattern else base

    @classmethod
    def from_id(cls, workload_id: str) -> Workload:
        m = _WORKLOAD_RE.match(workload_id)
        if not m:
            raise LayoutError(
                f"not a workload id: {workload_id!r} (expected <rw>-<bs>-qd<iodepth>[-<pattern>], "
                "e.g. randread-4k-qd32 or randwrite-1m-qd1-largeblock)"
            )
        return cls(m["rw"], bs_to_bytes(m["bs"]), int(m["iodepth"]), m["pattern"] or "")


@dataclass(frozen=True)
class RepPath:
    """What a raw fio result's path says about it."""

    host: str
    stack: str
    workload: Workload
    rep: int


def fio_rep_path(raw_dir: Path, host: str, stack: str, workload: Workload, rep: int) -> Path:
    return Path(raw_dir) / host / "fio" / stack / workload.id / f"rep{rep}.json"


def cpu_rep_path(fio_path: Path) -> Path:
    """Sidecar with /proc/stat deltas for a fio result (``rep3.json`` -> ``rep3.cpu.json``)."""
    return fio_path.with_name(fio_path.name.replace(".json", ".cpu.json"))


def rep_of_key(key: str) -> RepPath:
    """What ``<host>/fio/<stack>/<rw>-<bs>-qd<iodepth>/rep<k>.json`` (a path inside the run
    folder) says; LayoutError for anything else."""
    parts = key.split("/")
    m = REP_NAME.match(parts[-1])
    if len(parts) != 5 or parts[1] != "fio" or not m:
        raise LayoutError(f"{key}: expected <host>/fio/<stack>/<workload>/rep<k>.json")
    return RepPath(parts[0], parts[2], _workload(parts[3]), int(m["rep"]))


@functools.lru_cache(maxsize=4096)
def _workload(workload_id: str) -> Workload:
    return Workload.from_id(workload_id)  # one parse per cell folder, not per file


#: the environment variable that sets the largest raw file a reader accepts (a size: 4096, 64m)
MAX_RAW_BYTES_VARIABLE = "LUKSBENCH_MAX_RAW_BYTES"
MAX_RAW_BYTES = 64 * 2**20  # a real run's largest raw file (fio json+ output) is well under 1m


def read_raw_file(path, stats: list | None = None) -> bytes:
    """A raw file's bytes; OSError naming it for anything but a regular file of at most
    ``$LUKSBENCH_MAX_RAW_BYTES`` (default :data:`MAX_RAW_BYTES`): a device, a FIFO or a huge file
    never stalls or exhausts a reader, a symbolic link is not followed. ``stats``: the stat of the file read is appended to it."""
    limit = os.environ.get(MAX_RAW_BYTES_VARIABLE)
    try:
        limit = MAX_RAW_BYTES if limit is None else bs_to_bytes(limit)
    except LayoutError:
        raise LayoutError(f"${MAX_RAW_BYTES_VARIABLE}: not a size: {limit!r} (e.g. 64m)") from None
    try:  # a FIFO: no waiting; a symbolic link: not followed (it may point out of the run)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link: not followed", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if info.st_size > limit:
            why = f"{info.st_size} bytes, over the limit for a raw file (${MAX_RAW_BYTES_VARIABLE}"
            raise OSError(errno.EFBIG, f"{why}={limit})", str(path))
        if stats is not None:
            stats.append(info)
        data = os.read(fd, info.st_size)
        while len(data) < info.st_size and (more := os.read(fd, info.st_size - len(data))):
            data += more  # a read returns at most 2 GiB
        return data
    finally:
        os.close(fd)


def read_json_object(path: Path) -> dict:
    """One of the raw layout's JSON documents (env.json, a manifest): ValueError saying why not."""
    try:
        if link := linked_layout_folder(path):
            raise OSError(errno.ELOOP, f"{link} is a symbolic link: not followed", str(path))
        data = json.loads(read_raw_file(path).decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    return data


def linked_layout_folder(path) -> Path | None:
    """The folder on the way to ``path`` inside a host's ``fio/`` folder (``fio`` itself included)
    that is a symbolic link, None when there is none or ``path`` is not inside one: a reader never
    follows a linked folder out of the run (host folders: :func:`~luksbench.analysis.ingest.host_dirs`)."""
    folders = list(Path(path).parents)
    below = next((k for k, p in enumerate(folders) if p.name == "fio"), None)
    if below is None:
        return None
    return next((p for p in folders[: below + 1] if p.is_symlink()), None)


def replace_file(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` by replacing it: a new file in the same folder, renamed over
    ``path``, so a symbolic link (or anything else) standing at ``path`` is replaced, never written
    through, and no reader sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def replacing(path):
    """A new file's path in ``path``'s folder for a writer that takes a path (pyarrow, pandas,
    matplotlib), renamed over ``path`` when the block ends without an error (:func:`replace_file`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@functools.cache
def _umask() -> int:
    """The process' umask (mkstemp creates 0600; a replaced file gets the usual mode), read
    without setting it where Linux shows it: os.umask would change it for every thread."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
