"""The loss tables of a run, written beside the tidy tables: the only producer of statistics.

:func:`loss_tables` builds every statistic figures and paper show (:data:`LOSS_TABLES`,
described in :mod:`luksbench.analysis.tablefiles`) from the processed tables and one
:class:`~luksbench.analysis.losssettings.LossSettings`: the loss table of every comparison,
headline first, with its notes, the baseline's saturation flags and the fixed-design columns, and
the tables derived from it or from the same pairs. The workflow, the notebooks and ``luksbench
loss`` all call it; :func:`write_loss` writes its tables with the settings recorded beside them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis import (
    ceph_loss,
    cpucost,
    headline,
    saturation,
    sequential,
    stats,
    tablefiles,
    tails,
    tuning,
)
from luksbench.analysis.ingest import PROCESSED_TABLES, raw_run_dir, write_processed
from luksbench.analysis.losssettings import SETTINGS_FILE, LossSettings, run_settings

#: CPU cost net of the idle baseline (:mod:`luksbench.analysis.cpucost`): per GiB, utilisation
#: beside it, per I/O (at equal load in a fixed-rate pattern's cells)
CPU_METRICS = ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib", "cpu_util_pct", "busy_cpu_us_per_io")
#: metrics whose per-arm means and intervals are tabled (the bars and points of the figures)
ARM_METRICS = ("bw_bytes", "iops", *CPU_METRICS, *tails.PERCENTILES)
#: the tables :func:`write_loss` writes (``<processed_dir>/<name>.parquet``)
LOSS_TABLES = ("loss", "cpu_loss", "arms", "reps", "order", "tuning", *ceph_loss.CEPH_LOSS_TABLES)
#: the processed tables :func:`loss_tables` reads (fio required, the others may be missing)
INPUT_TABLES = ("fio", "schedule", "stacks", "env", "plan_stacks", "perf_flags", "patterns", "ceph")


def loss_tables(tables: dict[str, pd.DataFrame], settings: LossSettings) -> dict[str, pd.DataFrame]:
    """Every table of :data:`LOSS_TABLES` from the processed tables (:data:`INPUT_TABLES` by
    name; only ``fio`` is required) computed with ``settings``."""
    fio = tables["fio"]
    empty = pd.DataFrame()
    pairs = settings.pairs(fio["stack"].dropna().unique())
    table = annotated_loss(fio, pairs, settings)
    arm_metrics = stats.measured(fio, ARM_METRICS)
    confidence = settings.confidence
    return {
        "loss": table,
        "cpu_loss": table[table["metric"].isin(stats.measured(fio, CPU_METRICS))],
        "arms": stats.arm_summary(fio, arm_metrics, confidence),
        "reps": stats.rep_values(fio, arm_metrics),
        "order": order_effects(fio, tables.get("schedule", empty), pairs, table, confidence),
        "tuning": tuning.tuning_table(
            table,
            tables,
            settings.variant,
            settings.baseline,
            list(settings.comparisons),
        ),
        **ceph_loss.ceph_loss_tables(fio, tables.get("ceph"), pairs, settings, annotated_loss),
    }


def annotated_loss(fio: pd.DataFrame, pairs, settings: LossSettings) -> pd.DataFrame:
    """The loss table of ``pairs`` with its notes, selection columns, the baseline's saturation
    flags and the fixed-design columns of sequential cells."""
    metrics = list(settings.metrics) if settings.metrics else None
    options = {
        "exclude_outliers": settings.exclude_outliers,
        "decision_regions": settings.decision_regions,
    }
    args = (metrics, settings.confidence, settings.equivalence_margin_pct)
    table = stats.loss_tables(fio, pairs, *args, **options)
    table["note"] = _notes(table, fio)
    table[headline.HEADLINE_COLUMNS] = headline.selection_columns(table)
    table[saturation.LOSS_FLAG_COLUMNS] = saturation.loss_flags(table, fio)
    table[sequential.FIXED_COLUMNS] = sequential.fixed_design(table, fio, *args, **options)
    return table


def _notes(table: pd.DataFrame, fio: pd.DataFrame) -> pd.Series:
    """Each row's note: too few I/Os for its percentile, CPU within noise, no pilot, withheld."""
    notes = tails.too_few_notes(table, fio)
    notes = notes.where(notes != "", cpucost.within_noise_notes(table, fio))
    for kind, text in (("none", stats.NO_PILOT_NOTE), ("withheld", cpucost.SHARED_BASELINE)):
        rows = table["interval"].eq(kind)
        notes[rows] = [f"{n}; {text}" if n else text for n in notes[rows]]
    return notes


def read_tables(processed_dir: Path, names=INPUT_TABLES) -> dict[str, pd.DataFrame]:
    """Processed tables by name (an empty one where the file is missing; fio is required)."""
    processed_dir = Path(processed_dir)
    out = {}
    for name in names:
        path = processed_dir / f"{name}.parquet"
        out[name] = pd.read_parquet(path) if path.exists() or name == "fio" else pd.DataFrame()
    return out


def write_loss(
    processed_dir: Path,
    settings: LossSettings | None = None,
    out_dir: Path | None = None,
    **changes,
) -> tuple[pd.DataFrame, Path]:
    """Write :func:`loss_tables` of ``processed_dir``'s tables (parquet and CSV) and the settings
    (:data:`SETTINGS_FILE`) beside them, or to ``out_dir`` (a notebook exploring other settings);
    returns the loss table and its path. ``settings``: None for the run's (:func:`run_settings`);
    ``changes``: fields of :class:`LossSettings` replaced (e.g. ``metrics=["bw_bytes"]``)."""
    processed_dir = Path(processed_dir)
    out_dir = Path(out_dir) if out_dir is not None else processed_dir
    tables = read_tables(processed_dir)
    if settings is None:
        settings = run_settings(processed_dir, plan_baseline(tables["env"]))
    if changes:
        settings = settings.replaced(**changes)
    out = loss_tables(tables, settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    tablefiles.write_tables(out_dir, out)
    settings.write(out_dir / SETTINGS_FILE)
    return out["loss"], out_dir / "loss.parquet"


def plan_baseline(env: pd.DataFrame) -> str | None:
    """The baseline the run's plan names (the env table's plan), None if it names none."""
    if env.empty or "baseline" not in env:
        return None
    found = set(env["baseline"].dropna())
    return found.pop() if len(found) == 1 else None


def run_tables(run: str, raw_dir: Path, processed_dir: Path, loss: bool = True) -> Path:
    """``processed_dir`` holding run ``run``'s tables: where missing (a notebook opened on its own
    in a fresh clone) ingested from ``raw_dir`` and, with ``loss``, the loss tables computed with
    the run's recorded settings, else the default config's (named on stderr). A run that does
    not exist, or another run's tables, are refused."""
    processed_dir = Path(processed_dir)
    if not all((processed_dir / f"{t}.parquet").exists() for t in PROCESSED_TABLES):
        write_processed(raw_run_dir(run, raw_dir), processed_dir)
    found = set(pd.read_parquet(processed_dir / "fio.parquet", columns=["run"])["run"])
    if found != {run}:
        raise ValueError(f"{processed_dir} holds the tables of run {sorted(found)}, not {run!r}")
    if loss and not all((processed_dir / f"{t}.parquet").exists() for t in LOSS_TABLES):
        write_loss(processed_dir)
    return processed_dir


def order_effects(fio: pd.DataFrame, schedule: pd.DataFrame, pairs, loss, confidence: float):
    """:func:`stats.order_effect` of every comparison for the loss table's metrics (empty
    without a schedule table)."""
    if schedule is None or schedule.empty:
        return pd.DataFrame(columns=stats.ORDER_COLUMNS)
    metrics = list(dict.fromkeys(loss["metric"]))
    parts = [stats.order_effect(fio, schedule, b, v, metrics, confidence) for b, v in pairs]
    return pd.concat(parts, ignore_index=True)
