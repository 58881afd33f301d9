"""Tables written chunk by chunk as ingest parses the files: never held whole in memory."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import csv

from luksbench.analysis import tablefiles
from luksbench.formats.layout import replacing


class ParquetSpool:
    """Frames appended to a new parquet file renamed over ``path`` by :meth:`finish` (none
    written: ``path`` removed)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.spool")
        self.tmp.unlink(missing_ok=True)
        self.writer: pq.ParquetWriter | None = None

    def write(self, frame: pd.DataFrame) -> None:
        if not len(frame):
            return
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.tmp, table.schema)
        self.writer.write_table(table.cast(self.writer.schema))

    def finish(self) -> None:
        if self.writer is None:
            self.path.unlink(missing_ok=True)
            return
        self.writer.close()
        self.writer = None
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.tmp.unlink(missing_ok=True)


class LatencyParquet:
    """A latency sink (:func:`ingest.streamed_fio_table`): the chunks appended to ``latency.parquet`` in
    the processed folder (a new file, renamed over it by :meth:`finish`, which then writes the
    CSV from it batch by batch as :func:`tablefiles.write_tables` would have)."""

    def __init__(self, path: Path, empty: pd.DataFrame):
        self.path = Path(path)
        self._spool = ParquetSpool(self.path)
        self.written = False
        self.empty = empty
        self._first = True

    def __call__(self, frame: pd.DataFrame) -> None:
        if self._first and not len(frame):
            self.empty = frame  # the table when no chunk has rows (as ingest_run returns it)
        self._first = False
        if len(frame):
            self._spool.write(frame)
            self.written = True

    def discard(self) -> None:
        self._spool.discard()

    def finish(self, machine_paths: dict[str, str]) -> None:
        self._spool.finish()
        with pq.ParquetFile(self.path) as source, replacing(self.path.with_suffix(".csv")) as tmp:
            writer = None
            for batch in source.iter_batches(1 << 16):
                table = tablefiles.without_machine_paths(
                    pa.Table.from_batches([batch]), machine_paths
                )
                table = tablefiles.csv_safe(table)
                writer = writer or csv.CSVWriter(tmp, table.schema)
                writer.write_table(table)
            writer.close()


def rows_by_chunk(rows: pd.DataFrame, names: list[str], size: int, n: int) -> list[pd.DataFrame]:
    """The cached ``rows`` split by the chunk of their file (chunks of ``size`` of ``names``)."""
    if not len(rows):
        return [rows] * n
    chunk = pd.Index(names).get_indexer(rows["_key"].to_numpy(dtype=object)) // size
    groups = pd.Series(np.arange(len(rows))).groupby(chunk).indices
    empty = rows.iloc[:0]
    return [rows.iloc[groups[i]] if i in groups else empty for i in range(n)]


def merged_bins(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """A chunk's bins from the cache and from parsing, in file-name order (as the cache keeps
    them)."""
    if not len(old):
        return new
    if not len(new):
        return old
    both = pd.concat([old, new], ignore_index=True)
    return both.sort_values("_key", kind="stable").reset_index(drop=True)
