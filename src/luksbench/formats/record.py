"""The version every raw/run file format carries, and the one check of it.

Each record (plan, manifest and sessions, targets, env, CPU sidecar) writes ``"version": N`` into
its file. A file without one was written before formats had versions: it is version 1, and the
record's reader migrates it (in one place, its ``_migrate_v1``). A newer or unknown version is
refused, naming the file and the version: a reader never guesses what a later luksbench meant.
Standard library only: the test box imports this.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


class RecordVersionError(ValueError):
    """A file whose format version this luksbench cannot read; the message names file and version."""


def record_version(doc: dict, source, kind: str, known: tuple[int, ...]) -> int:
    """The version of ``doc`` (1 when it has none), refused unless it is one of ``known``."""
    version = doc.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version not in known:
        newest = max(known)
        why = (
            f"newer than version {newest}, the newest this luksbench reads: update luksbench"
            if isinstance(version, int) and not isinstance(version, bool) and version > newest
            else f"not a {kind} version this luksbench knows ({', '.join(map(str, known))})"
        )
        raise RecordVersionError(f"{source}: {kind} version {version!r} is {why}")
    return version


def versioned(doc: dict, version: int) -> dict:
    """``doc`` with ``version`` first, as every writer stores it."""
    return {"version": version, **{k: v for k, v in doc.items() if k != "version"}}


def write_record(path, doc: dict, version: int, mode: int = 0o644) -> None:
    """The writers' one way to store a record: ``doc`` with its version, as indented JSON, through
    a temporary file in the same folder (synced, then renamed: no reader sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(versioned(doc, version), indent=2) + "\n").encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
