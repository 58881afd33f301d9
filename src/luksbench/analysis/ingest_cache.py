"""The incremental-ingest cache (``<processed_dir>/.ingest-cache/``): each raw file's rows, bins,
problems and notes, keyed by the stat of the file and of its sidecar."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from luksbench.analysis.ingest_columns import _file_stat, _fio_dtypes
from luksbench.formats.layout import (
    replace_file,
    replacing,
)

#: the incremental-ingest cache, inside the processed folder (never inside raw)
CACHE_DIRNAME = ".ingest-cache"
#: bump when the cache's files change shape; code changes are caught by the source digest
CACHE_FORMAT = 3


def _json_list(text: str) -> list:
    """A cached problems/notes list (most files have none: skip the JSON parser for those)."""
    return [] if text == "[]" else [tuple(x) for x in json.loads(text)]


class _IngestCache:
    """Per-file results of earlier ingests of one run folder (see :func:`fio_table`):
    ``files.parquet`` (per raw file: key, :data:`STAT_COLUMNS`, problems and notes as JSON),
    ``rows.parquet`` and ``bins.parquet`` (the files' typed rows and json+ bins, by ``_key``),
    ``meta.json`` (format and a digest of the parser code)."""

    STAT_COLUMNS = ("size", "mtime_ns", "ino", "cpu_size", "cpu_mtime_ns", "cpu_ino")

    def __init__(self, path: Path):
        self.path = Path(path)
        self.keys: list[str] = []

    @staticmethod
    def code_digest() -> str:
        import hashlib

        import luksbench

        h = hashlib.sha256(f"format {CACHE_FORMAT}; pandas {pd.__version__}".encode())
        here = Path(luksbench.__file__).parent
        for pattern in ("analysis/ingest*.py", "analysis/design.py", "formats/*.py"):  # the parser
            for path in sorted(here.glob(pattern)):
                h.update(path.read_bytes())
        return h.hexdigest()

    def load(self, raw_dir: Path, keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
        """Rows, json+ bins and results of the files of ``keys`` whose stat key is unchanged
        (others: parse again)."""
        meta, files = self.path / "meta.json", self.path / "files.parquet"
        try:
            ok = json.loads(meta.read_text()).get("code") == self.code_digest()
            table = pd.read_parquet(files) if ok else None
        except (OSError, ValueError):
            ok, table = False, None
        if not ok or table is None:
            return pd.DataFrame(), pd.DataFrame(), {}
        self.keys = list(table["key"])
        cols, listed, root = list(self.STAT_COLUMNS), set(keys), str(raw_dir)
        cached = zip(table["key"], table[cols].itertuples(index=False, name=None), strict=True)
        same = {k: st for k, st in cached if k in listed and _file_stat(root, k) == st}
        reused = table.set_index("key").loc[list(same)]
        results = {
            k: {"problems": _json_list(p), "notes": _json_list(n), "stat": same[k]}
            for k, p, n in zip(reused.index, reused["problems"], reused["notes"], strict=True)
        }
        try:
            rows, bins = (self._read(name, list(same), len(table)) for name in self.TABLES)
        except (OSError, ValueError):
            return pd.DataFrame(), pd.DataFrame(), {}
        return rows, bins, results

    #: the per-file tables kept: the fio rows and their json+ bins
    TABLES = ("rows.parquet", "bins.parquet")

    def _read(self, name: str, keys: list[str], files: int) -> pd.DataFrame:
        """A cached table's rows of ``keys`` (all of them when every file is unchanged)."""
        path = self.path / name
        cached = pd.read_parquet(path) if path.exists() else pd.DataFrame()
        if len(cached) and len(keys) < files:
            cached = cached[pd.Index(keys).get_indexer(cached["_key"].to_numpy(dtype=object)) >= 0]
        return cached

    def save(
        self, stats: dict[str, tuple], frames: list[pd.DataFrame], bins: list, results: dict
    ) -> None:
        """Write the cache for the files of ``stats`` (replacing it atomically, file by file)."""
        self.path.mkdir(parents=True, exist_ok=True)
        # no meta.json (written last) until the files agree: a save cut short is never read
        (self.path / "meta.json").unlink(missing_ok=True)
        keys = list(stats)
        numbers = (
            np.array(list(stats.values()), dtype="int64").reshape(-1, len(self.STAT_COLUMNS)).T
        )
        table = pd.DataFrame({"key": keys, **dict(zip(self.STAT_COLUMNS, numbers, strict=True))})
        for column in ("problems", "notes"):
            table[column] = [json.dumps(r) if (r := results[k][column]) else "[]" for k in keys]
        rows, bins = (self._kept(parts, keys) for parts in (frames, bins))
        rows = None if rows is None else _fio_dtypes(rows)
        for name, df in (*zip(self.TABLES, (rows, bins), strict=True), ("files.parquet", table)):
            if df is None:
                (self.path / name).unlink(missing_ok=True)
                continue
            df.attrs = {}
            with replacing(self.path / name) as tmp:  # a new file, never through a link
                df.to_parquet(tmp, index=False)
        meta = json.dumps({"format": CACHE_FORMAT, "code": self.code_digest()})
        replace_file(self.path / "meta.json", meta.encode())
        self.keys = keys

    @staticmethod
    def _kept(parts: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame | None:
        """The parts' rows of files still in ``keys``, as one frame (None: there are none)."""
        parts = [f for f in parts if len(f)]
        if not parts:
            return None
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        keep = pd.Index(keys).get_indexer(df["_key"].to_numpy(dtype=object)) >= 0
        return df.copy(deep=False) if keep.all() else df[keep].reset_index(drop=True)
