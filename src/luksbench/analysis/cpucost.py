"""CPU cost of a fio run net of the box's own load, as utilisation, per GiB and per I/O.

The CPU sidecar counts every busy CPU-second of the machine during the run; the idle rate of the
run's own idle sample (``cpu_idle_samples[cpu_idle_sample]`` in the manifest: the sample of its
round), or in runs measured before those, of the session's one baseline (``cpu_idle_baseline``),
times the run's interval is subtracted. A sample's error shifts every run it nets: one per round
makes it differ from pair to pair, so the pairs' interval carries it; one per session shifts all
pairs of the session alike, which no interval over those pairs sees (:data:`SHARED_BASELINE`).
README, "CPU cost", says how to read the columns.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from luksbench.analysis.stats import METRIC_FAMILIES

#: the idle rates subtracted from a run (per second of wall time; busy %)
IDLE_RATES = ["idle_busy_cpu_s_per_s", "idle_sys_cpu_s_per_s", "idle_busy_pct"]
#: the schedule table's idle-baseline columns (per run): the rates and which sample they come
#: from (``idle_sample``: its start, POSIX seconds; runs netted by one sample share its error)
IDLE_COLUMNS = [*IDLE_RATES, "idle_sample"]
#: the loss table's note on a CPU cell with a run at or below the idle baseline
NOT_ABOVE_IDLE = "net CPU <= 0: within idle noise"
#: the loss table's note on a CPU row whose interval is withheld (``interval`` "withheld")
SHARED_BASELINE = (
    "no interval: one idle CPU sample nets every pair of the session, so its error is shared by "
    "all of them and no interval over the pairs covers it (seeded simulation: 45 % coverage at "
    "12 pairs); measured since, every round takes its own sample, or measure sessions >= 2"
)


def idle_rates(baseline, session_started=None) -> dict:
    """The schedule table's :data:`IDLE_COLUMNS` from an idle sample (a manifest's
    ``cpu_idle_baseline`` or one of its ``cpu_idle_samples``); ``session_started`` names the
    sample when it records no start of its own."""
    base = baseline if isinstance(baseline, dict) else {}
    delta = base.get("delta_s") if isinstance(base.get("delta_s"), dict) else {}
    seconds = base.get("interval_s")
    if not isinstance(seconds, int | float) or seconds <= 0:
        return dict.fromkeys(IDLE_COLUMNS, np.nan)
    busy, system, pct = (
        _number(x) for x in (base.get("busy_s"), delta.get("system"), base.get("busy_pct"))
    )
    rates = dict(zip(IDLE_RATES, (busy / seconds, system / seconds, pct), strict=True))
    return rates | {"idle_sample": _posix(base.get("started") or session_started)}


def run_idle_rates(manifest: dict, run: dict) -> dict:
    """:data:`IDLE_COLUMNS` of one run of a manifest: its own round's sample, else the session's
    one baseline."""
    samples, index = manifest.get("cpu_idle_samples"), run.get("cpu_idle_sample")
    if isinstance(samples, list) and type(index) is int and 0 <= index < len(samples):
        return idle_rates(samples[index])
    return idle_rates(manifest.get("cpu_idle_baseline"), manifest.get("started"))


@functools.lru_cache(maxsize=4096)
def _posix(text) -> float:
    """POSIX seconds of an ISO time (naive: UTC), NaN when missing or malformed."""
    try:
        stamp = pd.Timestamp(text) if isinstance(text, str) and text else pd.NaT
    except (ValueError, TypeError):
        stamp = pd.NaT
    if stamp is pd.NaT:
        return np.nan
    return (stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp).timestamp()


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
    recorded = idle[IDLE_RATES].notna().all(axis=1).groupby(idle["host_dir"]).transform("all")
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
            idle_sample=idle["idle_sample"].to_numpy(float),
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
