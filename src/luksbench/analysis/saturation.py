"""Was the baseline limited by fio or by the CPU rather than by the device?

``fio_bound``: a fio job used more than :data:`JOB_CPU_LIMIT_PCT` of a core (its usr + sys): one
submitting thread was the limit. ``cpu_saturated``: the machine was busy for at least
:data:`BUSY_LIMIT_PCT` of the run (the CPU sidecar). A loss against such a baseline is a lower
bound: the baseline could not go faster.
"""

from __future__ import annotations

import pandas as pd

from luksbench.analysis.cells import CELL_KEYS

JOB_CPU_LIMIT_PCT = 90.0
BUSY_LIMIT_PCT = 90.0
#: the loss table's columns: the flags and the largest value behind each over the baseline's runs
LOSS_FLAG_COLUMNS = ["fio_bound", "cpu_saturated", "baseline_job_cpu_pct", "baseline_busy_pct"]


def with_flags(fio: pd.DataFrame) -> pd.DataFrame:
    """``fio`` with ``job_cpu_pct`` and the run's ``fio_bound`` (any job over the limit) and
    ``cpu_saturated``."""
    job = fio["usr_cpu"].astype(float) + fio["sys_cpu"].astype(float)
    run = fio.assign(_job=job).groupby("file", sort=False)["_job"].transform("max")
    busy = fio["busy_cpu_pct"].astype(float)
    return fio.assign(
        job_cpu_pct=job, fio_bound=run > JOB_CPU_LIMIT_PCT, cpu_saturated=busy >= BUSY_LIMIT_PCT
    )


def loss_flags(loss: pd.DataFrame, fio: pd.DataFrame) -> pd.DataFrame:
    """:data:`LOSS_FLAG_COLUMNS` per loss row, from the runs of its baseline arm in its cell."""
    if loss.empty or "job_cpu_pct" not in fio:
        return pd.DataFrame(
            {c: pd.Series(dtype=float) for c in LOSS_FLAG_COLUMNS}, index=loss.index
        )
    keys = [*CELL_KEYS, "stack"]
    arms = fio.groupby(keys, observed=True, dropna=False).agg(
        fio_bound=("fio_bound", "any"),
        cpu_saturated=("cpu_saturated", "any"),
        baseline_job_cpu_pct=("job_cpu_pct", "max"),
        baseline_busy_pct=("busy_cpu_pct", "max"),
    )
    arms.index = arms.index.set_names([*CELL_KEYS, "baseline"])
    rows = loss[[*CELL_KEYS, "baseline"]].merge(arms.reset_index(), how="left")
    rows.index = loss.index
    for flag in LOSS_FLAG_COLUMNS[:2]:
        rows[flag] = rows[flag].fillna(False).astype(bool)
    return rows[LOSS_FLAG_COLUMNS]
