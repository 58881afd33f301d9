"""``luksbench loss RAW_DIR``: the loss table straight from a raw run folder (strict ingest),
built by the same :func:`luksbench.analysis.loss.loss_tables` as the workflow's."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis.ingest import fio_table
from luksbench.analysis.loss import loss_tables
from luksbench.analysis.losssettings import LossSettings, default_settings


def raw_loss_table(raw_dir: Path, settings: LossSettings) -> pd.DataFrame:
    """The loss table (with notes, flags, selection and fixed-design columns, as in loss.parquet)
    of a raw run folder computed with ``settings``; ValueError without fio results."""
    fio = fio_table(Path(raw_dir))
    if fio.empty:
        raise ValueError(
            f"no fio results under {raw_dir} (expected <host>/fio/<stack>/<workload>/rep<k>.json "
            "in one run's folder, data/raw/<run>)"
        )
    return loss_tables({"fio": fio}, settings)["loss"]


def loss_table_from_raw(
    raw_dir: Path, baseline: str | None = None, variant: str | None = None, **changes
) -> pd.DataFrame:
    """:func:`raw_loss_table` of the pair ``baseline``/``variant`` (None: the default config's),
    the other settings the default config's but for ``changes`` (fields of
    :class:`LossSettings`: ``metrics``, ``confidence``, ``exclude_outliers`` ...)."""
    default = default_settings()
    settings = LossSettings.one_pair(
        baseline or default.baseline,
        variant or default.variant,
        confidence=default.confidence,
        equivalence_margin_pct=default.equivalence_margin_pct,
        decision_regions=default.decision_regions,
        source="the default config",
    )
    if changes:
        settings = settings.replaced(**changes)
    return raw_loss_table(raw_dir, settings)
