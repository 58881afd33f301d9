"""Completion-latency percentiles from fio's json+ histograms, only where the run had enough I/Os.

A run's job entries are a mixture, whose quantile is not the mean of the entries' quantiles: their
histograms are summed and each percentile read off the sum by fio's own rule. A percentile needs
:data:`MIN_BEYOND` completions beyond it in every run of the cell, else it is withheld for the
whole cell ("too few I/Os"): withholding run by run would drop the slow runs, those most likely
to have a high tail. Rows without json+ histograms keep fio's own percentiles.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from luksbench.analysis.cells import CELL_KEYS

#: fio table column -> the percentile it holds
PERCENTILES = {"clat_p50_ns": 50.0, "clat_p99_ns": 99.0, "clat_p999_ns": 99.9}
#: completions that must lie beyond a percentile for it to be reported
MIN_BEYOND = 10
TOO_FEW = "too few I/Os"
#: one run's histogram: the latency table's rows summed over these keys
RUN_KEYS = ["host", "stack", "workload", "rep", "job_slot", "direction"]


def min_ios(percent: float) -> int:
    """The fewest completions with :data:`MIN_BEYOND` of them beyond the ``percent`` percentile."""
    return int(np.ceil(MIN_BEYOND * 100 / (100 - percent) - 1e-9))


def run_percentiles(latency: pd.DataFrame) -> pd.DataFrame:
    """Per run (:data:`RUN_KEYS`): ``clat_ios`` (completions in the summed histogram) and every
    :data:`PERCENTILES` column."""
    columns = [*RUN_KEYS, "clat_ios", *PERCENTILES]
    if latency.empty:
        return pd.DataFrame(columns=columns)
    hist = latency.groupby([*RUN_KEYS, "ns"], sort=True, observed=True)["count"].sum().reset_index()
    runs = hist.groupby(RUN_KEYS, sort=False, observed=True)["count"]
    total, cum = runs.transform("sum").to_numpy(float), runs.cumsum().to_numpy(float)
    out = hist[RUN_KEYS].drop_duplicates().set_index(RUN_KEYS)
    out["clat_ios"] = runs.sum()
    for column, percent in PERCENTILES.items():
        reached = hist[cum >= percent / 100.0 * total]  # fio's rule (stat.c)
        value = reached.groupby(RUN_KEYS, sort=False, observed=True)["ns"].first()
        out[column] = value.astype("float64")
    return out.reset_index()[columns]


def with_histogram_percentiles(fio: pd.DataFrame, latency: pd.DataFrame) -> pd.DataFrame:
    """``fio`` with the :data:`PERCENTILES` of its runs' summed json+ histograms (each entry gets
    its run's), NaN in a cell where a run had fewer than :func:`min_ios` completions, and the
    ``clat_ios`` column (NaN without a histogram)."""
    return with_run_percentiles(fio, run_percentiles(latency))


def with_run_percentiles(fio: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`with_histogram_percentiles` from the runs' percentiles (:func:`run_percentiles`),
    e.g. gathered chunk by chunk of a latency table too large to hold."""
    fio = fio.drop(columns="clat_ios", errors="ignore")
    if runs.empty or fio.empty:
        return fio.assign(clat_ios=np.nan)
    keyed = fio[RUN_KEYS].merge(runs, on=RUN_KEYS, how="left")
    has_hist = keyed["clat_ios"].notna().to_numpy()
    fio = fio.assign(clat_ios=keyed["clat_ios"].to_numpy(float))
    fewest = fio.groupby(CELL_KEYS, observed=True, dropna=False)["clat_ios"].transform("min")
    for column, percent in PERCENTILES.items():
        value = np.where(has_hist, keyed[column].to_numpy(float), fio[column].astype(float))
        fio[column] = np.where(fewest.to_numpy(float) < min_ios(percent), np.nan, value)
    return fio


def too_few_notes(loss: pd.DataFrame, fio: pd.DataFrame) -> pd.Series:
    """Per loss row: "too few I/Os ..." where a run of a percentile row's cell had too few
    completions for it, else ""."""
    notes = pd.Series("", index=loss.index, dtype="string")
    if "clat_ios" not in fio.columns or loss.empty:
        return notes
    fewest = fio.groupby(CELL_KEYS, observed=True)["clat_ios"].min()
    for i, row in loss[loss["metric"].isin(list(PERCENTILES))].iterrows():
        need = min_ios(PERCENTILES[row["metric"]])
        least = fewest.get(tuple(row[k] for k in CELL_KEYS), np.nan)  # NaN: no json+ histogram
        if least < need:
            notes[i] = f"{TOO_FEW}: needs {need:,} completions per run, fewest {int(least):,}"
    return notes
