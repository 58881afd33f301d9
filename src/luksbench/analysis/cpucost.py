"""CPU cost of a fio run net of the box's own load, as utilisation, per GiB and per I/O.

The CPU sidecar counts every busy CPU-second of the machine during the fio run, including what
the box burns doing nothing (the session's idle baseline, ``cpu_idle_baseline`` in the manifest,
carried per session in the schedule table). Here that baseline's rate times the run's interval
is subtracted:

``busy_cpu_s_per_gib``, ``sys_cpu_s_per_gib``  net CPU-seconds per GiB moved (all CPUs summed);
``cpu_util_pct``       net busy share of all CPUs during the run (100 % = every CPU busy);
``busy_cpu_us_per_io`` net busy CPU microseconds per completed I/O.

At full speed CPU per GiB rises with any throughput loss (the same busy CPU over fewer GiB),
so it is read beside utilisation; CPU per I/O of a fixed-rate cell (both stacks at one rate) is
the cost at equal load. Runs of sessions without a baseline keep the gross values
(``idle_busy_cpu_s`` NaN).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: the schedule table's idle-baseline columns (per session)
IDLE_COLUMNS = ["idle_busy_cpu_s_per_s", "idle_sys_cpu_s_per_s", "idle_busy_pct"]


def idle_rates(baseline) -> dict:
    """The schedule table's :data:`IDLE_COLUMNS` from a manifest's ``cpu_idle_baseline``."""
    base = baseline if isinstance(baseline, dict) else {}
    delta = base.get("delta_s") if isinstance(base.get("delta_s"), dict) else {}
    seconds = base.get("interval_s")
    if not isinstance(seconds, int | float) or seconds <= 0:
        return dict.fromkeys(IDLE_COLUMNS, np.nan)
    busy, system, pct = base.get("busy_s"), delta.get("system"), base.get("busy_pct")
    values = (busy / seconds if isinstance(busy, int | float) else np.nan,)
    values += (system / seconds if isinstance(system, int | float) else np.nan,)
    values += (pct if isinstance(pct, int | float) else np.nan,)
    return dict(zip(IDLE_COLUMNS, values, strict=True))


def with_cpu_cost(fio: pd.DataFrame, schedule: pd.DataFrame) -> pd.DataFrame:
    """``fio`` with the CPU columns net of each run's session idle baseline (module doc)."""
    keys = ["host", "stack", "workload", "rep"]
    runs = schedule.reindex(columns=[*keys, "status", *IDLE_COLUMNS])
    runs = runs[runs["status"].fillna("ok").eq("ok")].drop_duplicates(keys, keep="last")
    runs = runs.rename(columns={"host": "host_dir"}).drop(columns="status")
    on = ["host_dir", *keys[1:]]
    idle = fio[on].merge(runs, on=on, how="left")
    interval = fio["cpu_interval_s"].to_numpy(float)
    idle_busy = idle["idle_busy_cpu_s_per_s"].to_numpy(float) * interval
    idle_sys = idle["idle_sys_cpu_s_per_s"].to_numpy(float) * interval
    per_file = fio.assign(_ios=fio["io_bytes"] / fio["io_bs_bytes"]).groupby("file")
    gib = per_file["io_gib"].transform("sum").to_numpy(float)
    ios = per_file["_ios"].transform("sum").to_numpy(float)
    net_busy = fio["busy_cpu_s"].to_numpy(float) - np.nan_to_num(idle_busy)
    net_sys = fio["sys_cpu_s"].to_numpy(float) - np.nan_to_num(idle_sys)
    with np.errstate(divide="ignore", invalid="ignore"):
        return fio.assign(
            idle_busy_cpu_s=idle_busy,
            busy_cpu_s_per_gib=np.where(gib > 0, net_busy / gib, np.nan),
            sys_cpu_s_per_gib=np.where(gib > 0, net_sys / gib, np.nan),
            cpu_util_pct=fio["busy_cpu_pct"].to_numpy(float)
            - np.nan_to_num(idle["idle_busy_pct"].to_numpy(float)),
            busy_cpu_us_per_io=np.where(ios > 0, 1e6 * net_busy / ios, np.nan),
        )
