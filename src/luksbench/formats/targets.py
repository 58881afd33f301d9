"""``<host>/fio/targets.json``: the adaptive design's per-cell repetition targets, written by the
analysis (:mod:`luksbench.analysis.design`, :mod:`luksbench.analysis.sequential`), read by the
runner (``run-fio --targets``) and by ingest (the design columns). The document::

    {"pairs": {"<workload id>": <pairs, int >= 1>, ...},   # what the runner reads
     "noisy": ["<workload id>", ...],                       # cells whose target hit the cap
     "pilot_pairs": n0, "confidence": ...,                  # what Stein's interval needs,
     "cells": {"<workload id>": {"pilot_sd_log_ratio": ..., "required_pairs": ...,
                                 "pairs": ..., "capped": ...}, ...},
     "looks": [{"at": <UTC time>, "cells": {...}}, ...], ...}   # a sequential design's history

Standard library only: the test box imports this.
"""

from __future__ import annotations

import json
from pathlib import Path

from luksbench.formats.layout import read_json_object


class TargetsError(ValueError):
    """A targets file that cannot be used; the message says why (not which file)."""


def read_targets(path: Path) -> dict[str, tuple[int, bool, int | None, float | None]]:
    """workload id -> (target pairs, capped, pilot pairs n0, look confidence) from a targets file.
    n0 is None where the pairs did not come from a pilot SD (the cell's pilot was incomplete: it
    ran the cap whatever its data); the look confidence (a sequential design's: the cell's own, else
    the document's) None otherwise."""
    try:
        doc = read_json_object(path)
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
        looks = read_json_object(path).get("looks") if Path(path).exists() else None
    except ValueError:
        return []
    return looks if isinstance(looks, list) and all(map(_is_look, looks)) else []


def _is_look(look) -> bool:
    """{"at": ..., "cells": {workload id: {"n": pairs, ...}}}: what a look needs to be compared."""
    cells = look.get("cells") if isinstance(look, dict) else None
    return isinstance(cells, dict) and all(isinstance(c, dict) and "n" in c for c in cells.values())


def write_targets(path: Path, doc: dict) -> None:
    """Write the targets document in one rename: the runner never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
