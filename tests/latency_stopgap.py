"""Stopgap until ingest writes latency.parquet: the completion-latency histograms of a raw run
folder (json+ ``bins``, active directions only) written beside the processed tables, with the
columns ingest's latency table has. A no-op when latency.parquet exists."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis.cells import active_rows, with_pattern
from luksbench.formats.fio import clat_histogram

COLUMNS = [
    "host",
    "stack",
    "workload",
    "rw",
    "bs_bytes",
    "iodepth",
    "rep",
    "job_slot",
    "direction",
    "pattern",
    "ns",
    "count",
]


def write_latency(raw_dir: Path, processed_dir: Path) -> Path:
    path = Path(processed_dir) / "latency.parquet"
    if path.exists():
        return path
    fio = active_rows(with_pattern(pd.read_parquet(Path(processed_dir) / "fio.parquet")))
    records = []
    for file, rows in fio.groupby("file", sort=True):
        raw = Path(raw_dir) / str(file)
        if not raw.exists():
            continue
        hist = clat_histogram(raw, warn=lambda _m: None)
        for _, r in rows.iterrows():
            for ns, count in hist.get((int(r["job_index"]), str(r["direction"]))) or []:
                records.append({**{k: r[k] for k in COLUMNS[:10]}, "ns": ns, "count": count})
    pd.DataFrame.from_records(records, columns=COLUMNS).to_parquet(path, index=False)
    return path
