"""``<host>/fio/remeasure.json``: the pairs each cell runs so that pairs fio flagged (an error, a
steady state not attained) are measured again, written after ingest by
:mod:`luksbench.analysis.remeasure`, read by the runner (``run-fio --targets``: it is a targets
document, :mod:`luksbench.formats.targets`) and by ingest (the ``remeasured_pairs`` column)::

    {"version": 2, "kind": "luksbench flagged pairs re-measured v1",
     "pairs": {"<workload id>": <design pairs + replacements>, ...},   # what the runner reads
     "remeasure_flagged_max": <most replacements per cell>, "done": <every pair measured>,
     "cells": {"<workload id>": {"design_pairs": ..., "flagged_pairs": ..., "measured_pairs": ...,
                                 "remeasured_pairs": ...}, ...}}

Standard library only: the test box imports this.
"""

from __future__ import annotations

from pathlib import Path

from luksbench.formats.targets import TargetsError, read_targets_document

REMEASURE_FILE = "remeasure.json"
REMEASURE_KIND = "luksbench flagged pairs re-measured v1"


def remeasure_path(host_dir: Path) -> Path:
    """Where a host's re-measure document lives (beside its manifest and targets)."""
    return Path(host_dir) / "fio" / REMEASURE_FILE


def read_remeasured(path: Path) -> dict[str, int]:
    """workload id -> pairs measured to replace flagged ones; TargetsError naming what is wrong."""
    try:
        doc = read_targets_document(path)
    except ValueError as exc:
        raise TargetsError(f"re-measure file: {exc}") from exc
    cells = doc.get("cells")
    if not isinstance(cells, dict):
        raise TargetsError("re-measure file: 'cells' must be an object (workload id -> counts)")
    out = {}
    for w, cell in cells.items():
        n = cell.get("remeasured_pairs") if isinstance(cell, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TargetsError(
                f"re-measure file: remeasured_pairs of {w!r} must be an integer >= 0, not {n!r}"
            )
        out[w] = n
    return out


def remeasure_pending(host_dir: Path) -> bool:
    """Whether a re-measure of flagged pairs was started and not finished (its file says so)."""
    path = remeasure_path(host_dir)
    if not path.exists():
        return False
    try:
        return read_targets_document(path).get("done") is not True
    except ValueError:
        return True
