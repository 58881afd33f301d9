"""Flagged pairs measured again: the fixed design and the adaptive design's stage 2.

A pair fio flagged in some stack (an error, a steady state not attained:
:data:`luksbench.analysis.stats.REP_FLAGS`) is no measurement of its cell; the loss table
leaves it out. Here each cell gets a new pair for each flagged one, at most
``remeasure_flagged_max`` per cell, so that the cell ends with the pairs its design asked for
(the plan's repetitions, or stage 2's target N) as far as the cap allows. The flagged pair's raw
files stay (the runner never rewrites a result); the decision comes from the ingested fio table
alone. The sequential design needs none of this: its next round replaces a flagged pair.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis.sequential import flagged_reps, host_results
from luksbench.formats.remeasure import REMEASURE_KIND
from luksbench.formats.targets import write_targets


def design_pairs(
    cells: list[str], repetitions: int, targets: dict[str, int] | None = None
) -> dict[str, int]:
    """Per cell the pairs its design asks for: the plan's repetitions, or stage 2's target when
    larger (as the runner reads a targets file)."""
    return {w: max(int(repetitions), int((targets or {}).get(w, repetitions))) for w in cells}


def remeasure_targets(fio: pd.DataFrame, host: str, design: dict[str, int], most: int) -> dict:
    """The re-measure document of ``host`` (:mod:`luksbench.formats.remeasure`): each cell of
    ``design`` (workload id -> design pairs) runs its design pairs plus one pair per pair fio
    flagged, at most ``most`` more. A replacement fio flags again counts as flagged: it is
    replaced too while the cap allows."""
    if isinstance(most, bool) or not isinstance(most, int) or most < 0:
        raise ValueError(f"remeasure_flagged_max must be an integer >= 0, not {most!r}")
    fio = host_results(fio, host)
    flagged = flagged_reps(fio)
    measured = fio.groupby("workload")["rep"].max() if len(fio) else pd.Series(dtype="int64")
    cells, pairs = {}, {}
    for w, wanted in sorted(design.items()):
        bad, on_disk = int(flagged.get(w, 0)), int(measured.get(w, 0))
        extra = min(bad, most)
        pairs[w] = int(wanted) + extra
        cells[w] = {
            "design_pairs": int(wanted),
            "flagged_pairs": bad,
            "measured_pairs": on_disk,
            # replacements on disk so far (all of them once the run is done)
            "remeasured_pairs": min(extra, max(0, on_disk - int(wanted))),
        }
    done = all(c["measured_pairs"] >= pairs[w] for w, c in cells.items())
    return {
        "kind": REMEASURE_KIND,
        "host": host,
        "method": (
            "each cell runs its design pairs plus one new pair per pair fio flagged (an error, "
            "a steady state not attained) in any stack, at most remeasure_flagged_max more; the "
            "loss table leaves the flagged pairs out"
        ),
        "remeasure_flagged_max": most,
        "pairs": pairs,
        "cells": cells,
        "done": done,
    }


def write_remeasure_targets(
    fio: pd.DataFrame, host: str, out: Path, design: dict[str, int], most: int
) -> dict:
    """:func:`remeasure_targets` written to ``out`` (one rename: the runner never sees half)."""
    doc = remeasure_targets(fio, host, design, most)
    write_targets(Path(out), doc)
    return doc
