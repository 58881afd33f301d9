"""Cells of a run: the keys one comparison lives in, config patterns, and which rows measure I/O
(no statistics here: the publishing side may use it)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from luksbench.formats.layout import LayoutError, Workload

#: a cell: where one comparison lives (job_slot pairs jobs of multi-job files by their position)
CELL_KEYS = ["host", "workload", "job_slot", "direction"]
#: descriptive columns carried per cell; ``pattern`` names the config pattern whose fio options
#: the cell ran with ("" for the main matrix): two cells that differ only by it are never merged
CELL_ATTRS = ["rw", "bs_bytes", "iodepth", "job", "pattern"]

#: fio rw -> directions that carry its I/O (other directions of a job are not measurements)
ACTIVE_DIRECTIONS = {
    **dict.fromkeys(("read", "randread"), frozenset({"read"})),
    **dict.fromkeys(("write", "randwrite"), frozenset({"write"})),
    **dict.fromkeys(("rw", "readwrite", "randrw"), frozenset({"read", "write"})),
    **dict.fromkeys(("trim", "randtrim"), frozenset({"trim"})),
    **dict.fromkeys(("trimwrite", "randtrimwrite"), frozenset({"trim", "write"})),
}


def pattern_of(workload: str) -> str:
    """The pattern named in a workload id (``randwrite-1g-qd1-largeblock`` -> ``largeblock``; ""
    for a main-matrix cell or an id that is not a workload id)."""
    try:
        return Workload.from_id(str(workload)).pattern
    except LayoutError:
        return ""


def with_pattern(fio: pd.DataFrame) -> pd.DataFrame:
    """``fio`` with a string ``pattern`` column: as ingested, else read from the workload ids."""
    if "pattern" in fio.columns:
        if fio["pattern"].isna().any():
            fio = fio.assign(pattern=fio["pattern"].astype("object").fillna(""))
        return fio
    if fio.empty:
        return fio.assign(pattern=pd.Series(dtype="object"))
    ids = fio["workload"].astype("object")
    names = {w: pattern_of(w) for w in ids.unique()}
    return fio.assign(pattern=ids.map(names))


def active_rows(fio: pd.DataFrame) -> pd.DataFrame:
    """Rows whose direction carries the job's I/O (a randread job's write row is not a
    measurement); unknown rw patterns fall back to ``io_bytes > 0``."""
    if fio.empty:
        return fio
    rw = fio["rw"].astype("object")
    direction = fio["direction"].astype("object")
    mask = np.zeros(len(fio), dtype=bool)
    for name, dirs in ACTIVE_DIRECTIONS.items():
        mask |= ((rw == name) & direction.isin(dirs)).to_numpy(dtype=bool)
    unknown = ~rw.isin(list(ACTIVE_DIRECTIONS)).to_numpy(dtype=bool)
    io = pd.to_numeric(fio["io_bytes"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        mask |= unknown & (np.nan_to_num(io) > 0)
    return fio[mask]


def half_pairs(fio: pd.DataFrame) -> pd.Index:
    """(host, workload, session, rep) of every pair measured on some of the run's stacks only:
    a failed run's partner, or a pair whose session ended between its runs. Never completed in
    another session, so never paired."""
    stacks = fio.groupby(["host", "workload", "session", "rep"])["stack"].nunique()
    return stacks.index[stacks < fio["stack"].nunique()]
