"""The loss tables of a run, written beside the tidy tables: the only producer of statistics.

``write_loss`` reads ``fio.parquet`` and writes every statistic figures and paper show
(:data:`LOSS_TABLES`, described in :mod:`luksbench.analysis.dictionary`): the loss table of every
comparison, headline first, with its notes and the baseline's saturation flags, and the tables
derived from it or from the same pairs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis import (
    cpucost,
    dictionary,
    headline,
    saturation,
    sequential,
    stats,
    tails,
    tuning,
)
from luksbench.analysis.contrasts import resolve
from luksbench.analysis.ingest import PROCESSED_TABLES, raw_run_dir, write_processed

#: CPU cost net of the idle baseline (:mod:`luksbench.analysis.cpucost`): per GiB, utilisation
#: beside it, per I/O (at equal load in a fixed-rate pattern's cells)
CPU_METRICS = ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib", "cpu_util_pct", "busy_cpu_us_per_io")
#: metrics whose per-arm means and intervals are tabled (the bars and points of the figures)
ARM_METRICS = ("bw_bytes", "iops", *CPU_METRICS, *tails.PERCENTILES)
#: the tables :func:`write_loss` writes (``<processed_dir>/<name>.parquet``)
LOSS_TABLES = ("loss", "cpu_loss", "arms", "reps", "order", "tuning")


def write_loss(
    processed_dir: Path,
    baseline: str = "plain",
    variant: str = "luks",
    metrics: list[str] | None = None,
    confidence: float = 0.95,
    equivalence_margin_pct: float = stats.DEFAULT_EQUIVALENCE_MARGIN_PCT,
    comparisons=None,
    decision_regions: dict | None = None,
    out_dir: Path | None = None,
) -> tuple[pd.DataFrame, Path]:
    """Write the :data:`LOSS_TABLES` of ``processed_dir``'s tables (parquet and CSV) beside them,
    or to ``out_dir`` (a notebook exploring other settings); returns the loss table and its path.
    ``comparisons``: config ``analysis.comparisons``."""
    processed_dir = Path(processed_dir)
    out_dir = Path(out_dir) if out_dir is not None else processed_dir
    fio = pd.read_parquet(processed_dir / "fio.parquet")
    pairs = resolve(fio["stack"].dropna().unique(), baseline, variant, comparisons)
    margin, regions = equivalence_margin_pct, decision_regions
    table = stats.loss_tables(fio, pairs, metrics, confidence, margin, decision_regions=regions)
    notes = tails.too_few_notes(table, fio)
    notes = notes.where(notes != "", cpucost.within_noise_notes(table, fio))
    no_pilot = table["interval"].eq("none")
    notes[no_pilot] = [
        f"{n}; {stats.NO_PILOT_NOTE}" if n else stats.NO_PILOT_NOTE for n in notes[no_pilot]
    ]
    withheld = table["interval"].eq("withheld")
    notes[withheld] = [
        f"{n}; {cpucost.SHARED_BASELINE}" if n else cpucost.SHARED_BASELINE for n in notes[withheld]
    ]
    table["note"] = notes
    table[headline.HEADLINE_COLUMNS] = headline.selection_columns(table)
    table[saturation.LOSS_FLAG_COLUMNS] = saturation.loss_flags(table, fio)
    settings = (metrics, confidence, margin)
    fixed = sequential.fixed_design(table, fio, *settings, decision_regions=regions)
    table[sequential.FIXED_COLUMNS] = fixed
    arm_metrics = stats.measured(fio, ARM_METRICS)
    tables = {
        "loss": table,
        "cpu_loss": table[table["metric"].isin(stats.measured(fio, CPU_METRICS))],
        "arms": stats.arm_summary(fio, arm_metrics, confidence),
        "reps": stats.rep_values(fio, arm_metrics),
        "order": order_effects(fio, processed_dir / "schedule.parquet", pairs, table, confidence),
        "tuning": tuning.tuning_table(
            table, *_tables(processed_dir, "stacks", "env"), variant, baseline, comparisons
        ),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    dictionary.write_tables(out_dir, tables)
    return table, out_dir / "loss.parquet"


def _tables(processed_dir: Path, *names: str) -> list[pd.DataFrame]:
    """Processed tables by name; an empty one where the file is missing."""
    paths = [processed_dir / f"{name}.parquet" for name in names]
    return [pd.read_parquet(p) if p.exists() else pd.DataFrame() for p in paths]


def run_tables(run: str, raw_dir: Path, processed_dir: Path, loss: bool = True) -> Path:
    """``processed_dir`` holding run ``run``'s tables: where missing (a notebook opened on its own
    in a fresh clone) ingested from ``raw_dir`` and, with ``loss``, the loss tables computed with
    the default settings. A run that does not exist, or another run's tables, are refused."""
    processed_dir = Path(processed_dir)
    if not all((processed_dir / f"{t}.parquet").exists() for t in PROCESSED_TABLES):
        write_processed(raw_run_dir(run, raw_dir), processed_dir)
    found = set(pd.read_parquet(processed_dir / "fio.parquet", columns=["run"])["run"])
    if found != {run}:
        raise ValueError(f"{processed_dir} holds the tables of run {sorted(found)}, not {run!r}")
    if loss and not all((processed_dir / f"{t}.parquet").exists() for t in LOSS_TABLES):
        write_loss(processed_dir)
    return processed_dir


def order_effects(fio: pd.DataFrame, schedule_path: Path, pairs, loss, confidence: float):
    """:func:`stats.order_effect` of every comparison for the loss table's metrics (empty
    without a schedule table)."""
    schedule = pd.read_parquet(schedule_path) if schedule_path.exists() else None
    if schedule is None or schedule.empty:
        return pd.DataFrame(columns=stats.ORDER_COLUMNS)
    metrics = list(dict.fromkeys(loss["metric"]))
    parts = [stats.order_effect(fio, schedule, b, v, metrics, confidence) for b, v in pairs]
    return pd.concat(parts, ignore_index=True)
