"""The fio table's columns and types shared by the ingest modules: column names, the typing of
parsed values into stable parquet types, file versions (stat keys) and the ingest error."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from luksbench.formats.fio import (
    FIO_COLUMNS,
)

GIB = 2**30

#: columns added by :func:`fio_table` in front of the parser's columns
FIO_LAYOUT_COLUMNS = ["run", "host", "stack", "workload", "pattern", "rep", "job_slot"]
#: columns after the parser's: from io_bytes, the CPU sidecar, the adaptive design
#: (<host>/fio/targets.json) and the sessions (meanings: :mod:`dictionary`); host_dir is the raw
#: layout's <host> folder, which differs from ``host`` only for fleet (fio client/server) results
FIO_DERIVED_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "io_bs_bytes io_gib busy_cpu_s busy_cpu_pct sys_cpu_s cpu_interval_s busy_cpu_s_per_gib "
    "sys_cpu_s_per_gib target_pairs hit_cap pilot_pairs look_confidence host_dir session "
    "sessions_planned remeasured_pairs"
).split()


class IngestError(ValueError):
    """One or more raw files could not be ingested; ``problems`` lists (path, reason)."""

    def __init__(self, raw_dir: Path, problems: list[tuple[Path, str]]):
        self.raw_dir = Path(raw_dir)
        self.problems = problems
        lines = [f"{len(problems)} bad raw file(s) under {raw_dir}:"]
        lines += [f"  {path}: {reason}" for path, reason in problems]
        super().__init__("\n".join(lines))


def run_name(raw_dir: Path) -> str:
    return Path(raw_dir).resolve().name


def host_dirs(raw_dir: Path) -> list[Path]:
    """Host folders of a run: every sub-folder holding env.json or a fio/ folder (a symbolic link
    is no host folder: :func:`symbolic_links` names it)."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise FileNotFoundError(f"raw run folder not found: {raw_dir}")
    folders = [p for p in raw_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    return sorted(p for p in folders if (p / "env.json").exists() or (p / "fio").is_dir())


# --------------------------------------------------------------------------------------------- fio


def fio_columns() -> list[str]:
    """Column order of :func:`fio_table` (``host`` of the parser becomes ``fio_hostname``)."""
    parser_cols = ["fio_hostname" if c == "host" else c for c in FIO_COLUMNS]
    return FIO_LAYOUT_COLUMNS + parser_cols + FIO_DERIVED_COLUMNS


_NO_CPU = dict.fromkeys(("busy_cpu_s", "busy_cpu_pct", "sys_cpu_s", "cpu_interval_s"), math.nan)


def _relative(path: Path, raw_dir: Path) -> str:
    """Path inside the run folder (processed tables must not depend on where raw sits)."""
    try:
        return Path(path).resolve().relative_to(Path(raw_dir).resolve()).as_posix()
    except ValueError:
        return str(path)


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _isnum(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


#: columns of the per-file part of the table: all but those added per host when assembling
_DESIGN_COLUMNS = ("target_pairs", "hit_cap", "pilot_pairs", "host_dir", "session")
_DESIGN_COLUMNS += ("sessions_planned", "look_confidence", "remeasured_pairs")
#: CPU columns from the sidecar: /proc/stat of the machine running the fio *client*
_CPU_COLUMNS = (*_NO_CPU, "busy_cpu_s_per_gib", "sys_cpu_s_per_gib")
_TEXT_COLUMNS = (*FIO_LAYOUT_COLUMNS[:5], "fio_hostname", "job", "direction", "rw", "file", "bs")
_TEXT_COLUMNS += ("session",)


def _typed_column(name, values, text_cols=_TEXT_COLUMNS, bool_cols=(), whole_numbers=True):
    """One column of Python values in :func:`_typed`'s types, in one pass (int64 for
    ``whole_numbers`` without gaps: what pandas infers from a worker's rows)."""
    kinds = set(map(type, values)) - {type(None)}
    if float in kinds and len(kinds) > 1:  # NaN counts as missing, like None (a rare mix)
        kinds = {type(v) for v in values if v is not None and v == v}
    if name in ("rep", "job_slot", "_row"):
        return np.array(values, dtype="int64")
    if name in bool_cols or kinds == {bool}:
        return pd.array(values, dtype="boolean")
    if name in text_cols or str in kinds:
        if kinds != {str}:  # missing values and non-text among the text
            values = [None if _missing(v) else v if isinstance(v, str) else str(v) for v in values]
        return pd.array(values, dtype="string")
    if whole_numbers and kinds == {int} and None not in values and len(values):
        try:
            return np.array(values, dtype="int64")
        except OverflowError:
            pass
    if kinds <= {int, float}:
        return np.array(values, dtype="float64")  # None: NaN
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").astype("float64")


def _stat_key(path: str, st: os.stat_result | None = None) -> tuple[int, int, int]:
    """(size, mtime in ns, inode) of a file (or of ``st``), (-1, -1, -1) when it does not exist."""
    try:
        st = st or os.stat(path)
    except FileNotFoundError:
        return (-1, -1, -1)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _file_stat(root: str, key: str, read: list = ()) -> tuple[int, ...]:
    """:func:`_stat_key` of a result and of its CPU sidecar; ``read``: the stats taken as they
    were read (the others are taken now)."""
    paths = (f"{root}/{key}", f"{root}/{key[: -len('.json')]}.cpu.json")
    stats = [*read, None, None][:2]
    return tuple(x for path, st in zip(paths, stats, strict=True) for x in _stat_key(path, st))


def _fio_dtypes(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("rep", "job_slot"):
        df[col] = df[col].astype("int64")
    return _typed(df, text_cols=_TEXT_COLUMNS, bool_cols=("hit_cap",))


_STRING = pd.StringDtype()


def _typed(df: pd.DataFrame, text_cols=(), bool_cols=()) -> pd.DataFrame:
    """Stable parquet types: text -> string, bools -> boolean, numbers (None = missing) -> float64,
    whatever the values of this particular run happen to be (an all-missing column stays typed)."""
    for col in df.columns:
        dtype = df[col].dtype
        if dtype.kind in "iuf" or col in ("rep", "job_slot"):
            continue
        # already typed by an earlier pass (chunks of a parallel or incremental ingest): the same
        # outcome as below, without looking at every value again
        typed = (dtype == _STRING and col not in bool_cols) or isinstance(dtype, pd.BooleanDtype)
        if typed and (col in text_cols or col in bool_cols or df[col].notna().any()):
            continue
        values = df[col].tolist()
        df[col] = _typed_column(col, values, text_cols, bool_cols, whole_numbers=False)
    return df


def _checked(df: pd.DataFrame, raw_dir: Path, problems: list, strict: bool) -> pd.DataFrame:
    """``df`` with the problems met reading it in its attrs; with ``strict`` an IngestError."""
    if problems and strict:
        raise IngestError(raw_dir, problems)
    df.attrs["problems"] = [(str(p), why) for p, why in problems]
    return df
