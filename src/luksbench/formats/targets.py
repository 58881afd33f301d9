"""``<host>/fio/targets.json``: the adaptive design's per-cell repetition targets, written by the
analysis (:mod:`luksbench.analysis.design`, :mod:`luksbench.analysis.sequential`), read by the
runner (``run-fio --targets``) and by ingest (the design columns). The document::

    {"version": 2,
     "pairs": {"<workload id>": <pairs, int >= 1>, ...},   # what the runner reads
     "noisy": ["<workload id>", ...],                       # cells whose target hit the cap
     "pilot_pairs": n0, "confidence": ...,                  # what Stein's interval needs,
     "cells": {"<workload id>": {"pilot_sd_log_ratio": ..., "required_pairs": ...,
                                 "pairs": ..., "capped": ...}, ...},
     "looks": [{"at": <UTC time>, "cells": {...}}, ...], ...}   # a sequential design's history

Version 1 (no ``version``) is the same document; keys the readers do not use are kept.
Standard library only: the test box imports this.
"""

from __future__ import annotations

from pathlib import Path

from luksbench.formats.layout import read_json_object
from luksbench.formats.record import RecordVersionError, record_version, write_record

TARGETS_VERSION = 2
TARGETS_VERSIONS = (1, 2)


class TargetsError(ValueError):
    """A targets file that cannot be used; the message says why (not which file)."""


def read_targets_document(path: Path) -> dict:
    """The one reader of a targets file: its document as the current version's (ValueError when
    it is no JSON object; RecordVersionError, naming the file, for an unknown version)."""
    doc = read_json_object(path)
    record_version(doc, str(path), "targets", TARGETS_VERSIONS)
    return {**doc, "version": TARGETS_VERSION}  # version 1 is version 2 without the field


def read_targets(path: Path) -> dict[str, tuple[int, bool, int | None, float | None]]:
    """workload id -> (target pairs, capped, pilot pairs n0, look confidence) from a targets file.
    n0 is None where the pairs did not come from a pilot SD (the cell's pilot was incomplete: it
    ran the cap whatever its data); the look confidence (a sequential design's: the cell's own, else
    the document's) None otherwise."""
    try:
        doc = read_targets_document(path)
    except RecordVersionError as exc:
        raise TargetsError(str(exc)) from exc
    except ValueError as exc:
        raise TargetsError(f"targets file: {exc}") from exc
    if not isinstance(doc.get("pairs"), dict):
        raise TargetsError("targets file: 'pairs' must be an object (workload id -> pairs)")
    noisy = set(doc.get("noisy") or [])
    n0 = doc.get("pilot_pairs")
    if n0 is not None and (isinstance(n0, bool) or not isinstance(n0, int) or n0 < 2):
        raise TargetsError(f"targets file: pilot_pairs must be an integer >= 2, not {n0!r}")
    cells = doc.get("cells")
    level = doc.get("look_confidence")
    if level is not None and not (isinstance(level, float) and 0 < level < 1):
        raise TargetsError(f"targets file: look_confidence must be in (0, 1), not {level!r}")
    out = {}
    for w, n in doc["pairs"].items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TargetsError(
                f"targets file: pairs of {w!r} must be a positive integer, not {n!r}"
            )
        sd = (cells.get(w) or {}).get("pilot_sd_log_ratio") if isinstance(cells, dict) else 0
        n0_cell = n0 if isinstance(sd, (int, float)) and sd == sd else None
        out[w] = (n, w in noisy, n0_cell, _cell_level(cells, w, level))
    return out


def _cell_level(cells, w: str, level: float | None) -> float | None:
    """A sequential cell's own look level (its boundary's at the look it is read at), else the
    document's."""
    cell = cells.get(w) if isinstance(cells, dict) else None
    own = cell.get("look_confidence") if isinstance(cell, dict) else None
    if own is None:
        return level
    if not (isinstance(own, float) and 0 < own < 1):
        raise TargetsError(f"targets file: look_confidence of {w!r} must be in (0, 1), not {own!r}")
    return own


def read_looks(path: Path) -> list[dict]:
    """A sequential design's looks so far; none without a targets file, or from one that cannot
    be read or whose looks are not a list of {"cells": {...}} (the next look starts the history
    again: the looks are a record, no decision rests on them)."""
    try:
        looks = read_targets_document(path).get("looks") if Path(path).exists() else None
    except RecordVersionError:
        raise
    except ValueError:
        return []
    return looks if isinstance(looks, list) and all(map(_is_look, looks)) else []


def _is_look(look) -> bool:
    """{"at": ..., "cells": {workload id: {"n": pairs, ...}}}: what a look needs to be compared."""
    cells = look.get("cells") if isinstance(look, dict) else None
    return isinstance(cells, dict) and all(isinstance(c, dict) and "n" in c for c in cells.values())


def write_targets(path: Path, doc: dict) -> None:
    """The one writer of a targets file, in one rename: the runner never sees half a file."""
    write_record(path, doc, TARGETS_VERSION)
