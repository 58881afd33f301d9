"""The loss tables of a run, written beside the tidy tables: the only producer of statistics.

``write_loss`` reads ``fio.parquet`` and writes every statistic figures and paper show:

``loss.parquet``      the loss table of every comparison, headline first (:func:`stats.loss_tables`);
``cpu_loss.parquet``  its rows of CPU seconds per GiB (busy and system) that were measured;
``arms.parquet``      mean over repetitions with its t-interval per arm, cell and metric
                      (throughput and CPU: the bars of the figures).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis import stats
from luksbench.analysis.contrasts import resolve

#: metrics whose per-arm means and intervals are tabled (the bars of the figures)
ARM_METRICS = ("bw_bytes", "iops", "busy_cpu_s_per_gib", "sys_cpu_s_per_gib")
CPU_METRICS = ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib")


def _measured(fio: pd.DataFrame, metrics) -> list[str]:
    """The metrics with at least one value in ``fio``."""
    return [m for m in metrics if m in fio and pd.to_numeric(fio[m], errors="coerce").notna().any()]


def write_loss(
    processed_dir: Path,
    baseline: str = "plain",
    variant: str = "luks",
    metrics: list[str] | None = None,
    confidence: float = 0.95,
    equivalence_margin_pct: float = stats.DEFAULT_EQUIVALENCE_MARGIN_PCT,
    comparisons=None,
    decision_regions: dict | None = None,
) -> tuple[pd.DataFrame, Path]:
    """Read ``fio.parquet`` from ``processed_dir``, write ``loss.parquet``, ``cpu_loss.parquet``
    and ``arms.parquet`` beside it; returns the loss table and its path.

    ``loss.parquet`` holds the rows of every comparison (outliers flagged and kept; see
    :func:`stats.loss_table`), the headline first. ``comparisons``: config
    ``analysis.comparisons``, resolved against the stacks with results by
    :func:`luksbench.analysis.contrasts.resolve` (empty: every stack against ``baseline``)."""
    processed_dir = Path(processed_dir)
    fio = pd.read_parquet(processed_dir / "fio.parquet")
    pairs = resolve(fio["stack"].dropna().unique(), baseline, variant, comparisons)
    table = stats.loss_tables(
        fio,
        pairs,
        metrics,
        confidence,
        equivalence_margin_pct=equivalence_margin_pct,
        decision_regions=decision_regions,
    )
    path = processed_dir / "loss.parquet"
    table.to_parquet(path, index=False)
    cpu = table[table["metric"].isin(_measured(fio, CPU_METRICS))]
    cpu.to_parquet(processed_dir / "cpu_loss.parquet", index=False)
    arms = stats.arm_summary(fio, _measured(fio, ARM_METRICS), confidence)
    arms.to_parquet(processed_dir / "arms.parquet", index=False)
    return table, path
