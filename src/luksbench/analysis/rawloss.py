"""The loss table straight from a raw run folder: strict ingest, then the statistics
(``luksbench loss RAW_DIR``, without the workflow or processed tables)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis.ingest import fio_table
from luksbench.analysis.stats import DEFAULT_EQUIVALENCE_MARGIN_PCT, loss_table


def loss_table_from_raw(
    raw_dir: Path,
    baseline: str = "plain",
    variant: str = "luks",
    metrics: list[str] | None = None,
    confidence: float = 0.95,
    equivalence_margin_pct: float = DEFAULT_EQUIVALENCE_MARGIN_PCT,
    exclude_outliers: bool = False,
) -> pd.DataFrame:
    """:func:`~luksbench.analysis.stats.loss_table` of a raw run folder (strict ingest)."""
    return loss_table(
        fio_table(Path(raw_dir)),
        baseline,
        variant,
        metrics,
        confidence,
        equivalence_margin_pct=equivalence_margin_pct,
        exclude_outliers=exclude_outliers,
    )
