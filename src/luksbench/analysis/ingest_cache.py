"""The incremental-ingest cache (``<processed_dir>/.ingest-cache/``): each raw file's rows, bins,
problems and notes, keyed by the stat of the file and of its sidecar. The bins (most of the data)
are written and read chunk by chunk, in the files' name order, never held whole."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from luksbench.analysis.ingest_columns import _file_stat, _fio_dtypes
from luksbench.analysis.ingest_stream import ParquetSpool
from luksbench.formats.layout import (
    replace_file,
    replacing,
)

#: the incremental-ingest cache, inside the processed folder (never inside raw)
CACHE_DIRNAME = ".ingest-cache"
#: bump when the cache's files change shape; code changes are caught by the source digest
CACHE_FORMAT = 4


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

    def load(self, raw_dir: Path, keys: list[str]) -> tuple[pd.DataFrame, dict]:
        """Rows and results of the files of ``keys`` whose stat key is unchanged (others: parse
        again); their json+ bins come chunk by chunk from :meth:`bins`."""
        meta, files = self.path / "meta.json", self.path / "files.parquet"
        try:
            ok = json.loads(meta.read_text()).get("code") == self.code_digest()
            table = pd.read_parquet(files) if ok else None
        except (OSError, ValueError):
            ok, table = False, None
        if not ok or table is None:
            return pd.DataFrame(), {}
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
            rows = self._read_rows(list(same), len(table))
            bins = SortedBins(self.path / "bins.parquet")
        except (OSError, ValueError, pa.ArrowException):
            return pd.DataFrame(), {}
        self.cached_bins = bins
        return rows, results

    #: a reader of the cached json+ bins (None: no cache read)
    cached_bins: SortedBins | None = None

    def _read_rows(self, keys: list[str], files: int) -> pd.DataFrame:
        """The cached rows of ``keys`` (all of them when every file is unchanged)."""
        path = self.path / "rows.parquet"
        cached = pd.read_parquet(path) if path.exists() else pd.DataFrame()
        if len(cached) and len(keys) < files:
            cached = cached[pd.Index(keys).get_indexer(cached["_key"].to_numpy(dtype=object)) >= 0]
        return cached

    def start_saving(self) -> None:
        """Begin a new cache: :meth:`write_bins` appends to a new bins file, :meth:`save` ends."""
        self.path.mkdir(parents=True, exist_ok=True)
        # no meta.json (written last) until the files agree: a save cut short is never read
        (self.path / "meta.json").unlink(missing_ok=True)
        self._bins_out = ParquetSpool(self.path / "bins.parquet")

    _bins_out: ParquetSpool | None = None

    def write_bins(self, bins: pd.DataFrame) -> None:
        """Append one chunk's bins (in the files' name order) to the new cache."""
        if self._bins_out is not None:
            self._bins_out.write(bins)

    def save(self, stats: dict[str, tuple], frames: list[pd.DataFrame], results: dict) -> None:
        """Write the cache for the files of ``stats`` (replacing it atomically, file by file)."""
        keys = list(stats)
        numbers = (
            np.array(list(stats.values()), dtype="int64").reshape(-1, len(self.STAT_COLUMNS)).T
        )
        table = pd.DataFrame({"key": keys, **dict(zip(self.STAT_COLUMNS, numbers, strict=True))})
        for column in ("problems", "notes"):
            table[column] = [json.dumps(r) if (r := results[k][column]) else "[]" for k in keys]
        rows = self._kept(frames, keys)
        rows = None if rows is None else _fio_dtypes(rows)
        if self.cached_bins is not None:
            self.cached_bins.close()
        self._bins_out.finish()
        for name, df in (("rows.parquet", rows), ("files.parquet", table)):
            if df is None:
                (self.path / name).unlink(missing_ok=True)
                continue
            df.attrs = {}
            with replacing(self.path / name) as tmp:  # a new file, never through a link
                df.to_parquet(tmp, index=False)
        meta = json.dumps({"format": CACHE_FORMAT, "code": self.code_digest()})
        replace_file(self.path / "meta.json", meta.encode())
        self.keys = keys

    def abandon(self) -> None:
        """Drop a new cache begun by :meth:`start_saving` (the old one stays unreadable)."""
        if self._bins_out is not None:
            self._bins_out.discard()

    @staticmethod
    def _kept(parts: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame | None:
        """The parts' rows of files still in ``keys``, as one frame (None: there are none)."""
        parts = [f for f in parts if len(f)]
        if not parts:
            return None
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        keep = pd.Index(keys).get_indexer(df["_key"].to_numpy(dtype=object)) >= 0
        return df.copy(deep=False) if keep.all() else df[keep].reset_index(drop=True)


class SortedBins:
    """The cached json+ bins file, sorted by ``_key``, read forward a batch at a time: each call of
    :meth:`take` returns the bins of some keys up to a last key (later calls: later keys)."""

    BATCH_ROWS = 1 << 16

    def __init__(self, path: Path):
        self._file = pq.ParquetFile(path) if Path(path).exists() else None
        self._batches = self._file.iter_batches(self.BATCH_ROWS) if self._file else iter(())
        self._held = pd.DataFrame()

    def take(self, keys: set[str], last: str) -> pd.DataFrame:
        """The bins of ``keys`` (all at most ``last``); bins of keys before ``last`` not in
        ``keys`` (files changed or gone) are dropped."""
        parts = []
        while True:
            held = self._held
            if len(held):  # sorted by key: the keys up to ``last`` are a prefix
                names = held["_key"].to_numpy(dtype=object)
                upto = np.fromiter((k <= last for k in names), bool, len(names))
                parts.append(held[upto])
                if not upto.all():
                    self._held = held[~upto]
                    break
            batch = next(self._batches, None)
            self._held = pd.DataFrame() if batch is None else batch.to_pandas()
            if batch is None:
                break
        parts = [p for p in parts if len(p)]
        if not parts:
            return pd.DataFrame()
        out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        wanted = np.fromiter((k in keys for k in out["_key"].to_numpy(dtype=object)), bool)
        return out[wanted].reset_index(drop=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._batches = None, iter(())
