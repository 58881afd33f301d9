"""The Ceph arms' CPU cost against their reference, and the Ceph Reef study's published numbers
beside the run's Ceph cells: the loss stage's Ceph tables (:data:`CEPH_LOSS_TABLES`).

The per-run CPU of the client and the OSDs (:mod:`luksbench.analysis.ceph_tables`) goes through
the same paired machinery as every other metric (:func:`luksbench.analysis.stats.loss_table`: log
ratios of pairs, an interval per cell, a decision by magnitude with the CPU margins). These values
are gross (no idle sample nets them), so no interval is withheld for a shared idle sample; each
row's ``covers`` says what its interval covers (the pairs' repetitions, or sessions).

``ceph_reef`` is the transcribed table ``data/reference/ceph_reef_2023_luks.csv`` (its README
cites the seed and section of every number) restricted to the rows whose rw pattern, block size
and queue depth a Ceph cell of the run has, with that cell's ``workload``: the paper reads the
published numbers from this processed table, never from the reference file.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis import stats
from luksbench.analysis.ceph_tables import CEPH_CPU_METRICS
from luksbench.analysis.stats import with_dtypes

#: the tables the loss stage writes for the Ceph arms (empty when the run has none)
CEPH_LOSS_TABLES = ("ceph_loss", "ceph_arms", "ceph_reef")
REEF_FILE = "ceph_reef_2023_luks.csv"
REFERENCE_DIR = Path(__file__).resolve().parents[3] / "data" / "reference"
REEF_COLUMNS = ["host", "workload", "rw", "bs_bytes", "iodepth", "section", "test_set"]
REEF_COLUMNS += ["clients", "io_size", "configuration", "pct_of_unencrypted_as_published"]
REEF_COLUMNS += ["published_loss_pct", "reference_file"]
ARM_COLUMNS = [*stats.ARM_KEYS, "metric", "n", "mean", "ci_half", "confidence"]
ARM_COLUMNS += ["messenger_mode", "osd_encryption", "on_disk", "on_wire"]


def with_ceph_cpu(fio: pd.DataFrame, ceph: pd.DataFrame) -> pd.DataFrame:
    """The fio rows of the Ceph arms' runs with the run's :data:`CEPH_CPU_METRICS` (every row of a
    file carries its file's totals, as the other CPU columns do). The idle-sample columns are left
    out: these values are not netted by one."""
    keep = ceph[["file", *CEPH_CPU_METRICS]].drop_duplicates("file")
    rows = fio[fio["file"].isin(keep["file"])].drop(columns=list(CEPH_CPU_METRICS), errors="ignore")
    rows = rows.drop(columns=["idle_sample", "cpu_net"], errors="ignore")
    return rows.merge(keep, on="file", how="left", validate="many_to_one")


def ceph_pairs(pairs, ceph: pd.DataFrame) -> list[tuple[str, str]]:
    """The comparisons whose both arms are Ceph arms of the run."""
    arms = set(ceph["stack"].dropna().astype(str)) if not ceph.empty else set()
    return [(b, v) for b, v in pairs if b in arms and v in arms]


def arm_kinds(ceph: pd.DataFrame) -> pd.DataFrame:
    """Per host and stack: messenger mode (verified), OSD encryption, ``on_disk`` (OSDs
    encrypted) and ``on_wire`` (the client's mode is secure), from the runs' records."""
    cols = ["host", "stack", "messenger_mode", "osd_encryption", "on_disk", "on_wire"]
    if ceph.empty:
        return pd.DataFrame(columns=cols)
    runs = ceph.assign(
        messenger_mode=ceph["messenger_mode_seen"].astype(str),
        on_disk=ceph["osd_encrypted"].astype(bool),
        on_wire=ceph["messenger_mode_seen"].astype(str).eq("secure"),
    )
    return runs[cols].drop_duplicates(["host", "stack"], keep="last").reset_index(drop=True)


def ceph_loss_tables(fio, ceph, pairs, settings, annotate, reference_dir=None) -> dict:
    """:data:`CEPH_LOSS_TABLES` of a run: ``annotate(fio, pairs, settings)`` is the loss stage's
    own loss table builder (:func:`luksbench.analysis.loss.annotated_loss`), run over the Ceph
    arms' CPU metrics."""
    confidence = settings.confidence
    ceph = ceph if ceph is not None else pd.DataFrame()
    compared = ceph_pairs(pairs, ceph)
    rows = with_ceph_cpu(fio, ceph) if compared else pd.DataFrame()
    metrics = stats.measured(rows, CEPH_CPU_METRICS) if compared else []
    if not metrics:
        loss = with_dtypes(pd.DataFrame(columns=stats.LOSS_COLUMNS), stats.LOSS_DTYPES)
        arms = pd.DataFrame(columns=ARM_COLUMNS)
    else:
        loss = annotate(rows, compared, settings.replaced(metrics=tuple(metrics)))
        arms = stats.arm_summary(rows, metrics, confidence)
        arms = arms.merge(arm_kinds(ceph), on=["host", "stack"], how="left")[ARM_COLUMNS]
    reef = reef_beside(rows, reference_dir)
    return {"ceph_loss": loss, "ceph_arms": arms, "ceph_reef": reef}


def read_reef(reference_dir: Path | None = None) -> pd.DataFrame:
    """The transcribed Ceph Reef table; a clear error naming the file when it cannot be read."""
    path = Path(reference_dir or REFERENCE_DIR) / REEF_FILE
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: the Ceph Reef reference table is not readable: {exc}") from exc
    need = {"rw", "bs_bytes", "iodepth", "pct_of_unencrypted_as_published", "loss_pct"}
    if missing := sorted(need - set(table.columns)):
        raise ValueError(f"{path}: no column {', '.join(missing)}")
    return table


def reef_beside(rows: pd.DataFrame, reference_dir: Path | None = None) -> pd.DataFrame:
    """The published Reef rows (:data:`REEF_COLUMNS`) of the shapes (rw, block size, queue depth)
    the Ceph arms' fio rows ``rows`` have, one row per cell and published row."""
    if rows.empty:
        return pd.DataFrame(columns=REEF_COLUMNS)
    reef = read_reef(reference_dir).rename(columns={"loss_pct": "published_loss_pct"})
    shape = ["rw", "bs_bytes", "iodepth"]
    cells = rows[["host", "workload", *shape]].dropna().drop_duplicates()
    cells = cells.astype({"rw": str, "bs_bytes": "int64", "iodepth": "int64"})
    reef = reef.astype({"bs_bytes": "int64", "iodepth": "int64"}).assign(reference_file=REEF_FILE)
    out = cells.merge(reef, on=shape, how="inner")
    return out[REEF_COLUMNS].reset_index(drop=True)
