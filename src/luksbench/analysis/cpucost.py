"""CPU cost of a fio run net of the box's own load, as utilisation, per GiB and per I/O.

The CPU sidecar counts every busy CPU-second of the machine during the run; the session's idle
baseline (``cpu_idle_baseline`` in the manifest) times the run's interval is subtracted. README,
"CPU cost", says how to read the columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from luksbench.analysis.stats import METRIC_FAMILIES

#: the schedule table's idle-baseline columns (per session)
IDLE_COLUMNS = ["idle_busy_cpu_s_per_s", "idle_sys_cpu_s_per_s", "idle_busy_pct"]
#: the loss table's note on a CPU cell with a run at or below the idle baseline
NOT_ABOVE_IDLE = "net CPU <= 0: within idle noise"


def idle_rates(baseline) -> dict:
    """The schedule table's :data:`IDLE_COLUMNS` from a manifest's ``cpu_idle_baseline``."""
    base = baseline if isinstance(baseline, dict) else {}
    delta = base.get("delta_s") if isinstance(base.get("delta_s"), dict) else {}
    seconds = base.get("interval_s")
    if not isinstance(seconds, int | float) or seconds <= 0:
        return dict.fromkeys(IDLE_COLUMNS, np.nan)
    busy, system, pct = (
        _number(x) for x in (base.get("busy_s"), delta.get("system"), base.get("busy_pct"))
    )
    return dict(zip(IDLE_COLUMNS, (busy / seconds, system / seconds, pct), strict=True))


def _number(value) -> float:
    return value if isinstance(value, int | float) else np.nan


def with_cpu_cost(fio: pd.DataFrame, schedule: pd.DataFrame) -> pd.DataFrame:
    """``fio`` with the CPU columns net of each run's session idle baseline and ``cpu_net``: net
    only when every session of the host recorded a baseline (no cell pairs gross with net)."""
    if fio.empty:
        return fio
    keys = ["host", "stack", "workload", "rep"]
    runs = schedule.reindex(columns=[*keys, "status", *IDLE_COLUMNS])
    runs = runs[runs["status"].fillna("ok").eq("ok")].drop_duplicates(keys, keep="last")
    runs = runs.rename(columns={"host": "host_dir"}).drop(columns="status")
    on = ["host_dir", *keys[1:]]
    idle = fio[on].merge(runs, on=on, how="left")
    recorded = idle[IDLE_COLUMNS].notna().all(axis=1).groupby(idle["host_dir"]).transform("all")
    net = recorded.to_numpy(bool)
    interval = fio["cpu_interval_s"].to_numpy(float)
    idle_busy = idle["idle_busy_cpu_s_per_s"].to_numpy(float) * interval
    idle_sys = idle["idle_sys_cpu_s_per_s"].to_numpy(float) * interval
    per_file = fio.assign(_ios=fio["io_bytes"] / fio["io_bs_bytes"]).groupby("file")
    gib = per_file["io_gib"].transform("sum").to_numpy(float)
    ios = per_file["_ios"].transform("sum").to_numpy(float)
    net_busy = fio["busy_cpu_s"].to_numpy(float) - np.where(net, idle_busy, 0.0)
    net_sys = fio["sys_cpu_s"].to_numpy(float) - np.where(net, idle_sys, 0.0)
    idle_pct = np.where(net, idle["idle_busy_pct"].to_numpy(float), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return fio.assign(
            idle_busy_cpu_s=idle_busy,
            busy_cpu_s_per_gib=np.where(gib > 0, net_busy / gib, np.nan),
            sys_cpu_s_per_gib=np.where(gib > 0, net_sys / gib, np.nan),
            cpu_util_pct=fio["busy_cpu_pct"].to_numpy(float) - idle_pct,
            busy_cpu_us_per_io=np.where(ios > 0, 1e6 * net_busy / ios, np.nan),
            cpu_net=net,
        )


def within_noise_notes(loss: pd.DataFrame, fio: pd.DataFrame) -> pd.Series:
    """Per loss row: :data:`NOT_ABOVE_IDLE` where a CPU metric's cell has a run at or below 0 net
    (such a cell has no interval: dropping those pairs would select on the outcome), else ""."""
    notes = pd.Series("", index=loss.index, dtype="string")
    keys = ["host", "workload", "job_slot", "direction", "stack"]
    for metric in set(loss["metric"]) & set(fio.columns):
        if METRIC_FAMILIES.get(metric) != "cpu":
            continue
        least = fio.groupby(keys, observed=True)[metric].min()
        rows = loss[loss["metric"] == metric]
        for i, row in rows.iterrows():
            cell = tuple(row[k] for k in keys[:-1])
            if any(least.get((*cell, row[s]), np.nan) <= 0 for s in ("baseline", "variant")):
                notes[i] = NOT_ABOVE_IDLE
    return notes
