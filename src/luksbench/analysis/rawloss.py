"""``luksbench loss RAW_DIR``: the loss table straight from a raw run folder (strict ingest)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis import headline, saturation
from luksbench.analysis.ingest import fio_table
from luksbench.analysis.stats import loss_table


def loss_table_from_raw(raw_dir: Path, *args, **kwargs) -> pd.DataFrame:
    """:func:`~luksbench.analysis.stats.loss_table` (same arguments after the fio table) of a raw
    run folder, with the baseline's saturation flags; ValueError without fio results."""
    fio = fio_table(Path(raw_dir))
    if fio.empty:
        raise ValueError(
            f"no fio results under {raw_dir} (expected <host>/fio/<stack>/<workload>/rep<k>.json "
            "in one run's folder, data/raw/<run>)"
        )
    table = loss_table(fio, *args, **kwargs)
    table[saturation.LOSS_FLAG_COLUMNS] = saturation.loss_flags(table, fio)
    table[headline.HEADLINE_COLUMNS] = headline.selection_columns(table)
    return table
