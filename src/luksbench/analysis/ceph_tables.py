"""The Ceph table: one row per fio run of an RBD arm over the run's own cluster, read from the
``ceph`` record of its CPU sidecar (``rep<k>.cpu.json``, :func:`luksbench.testbox.cephrun.finish_entry_run`)
and from the run's fio rows.

Where Ceph spends CPU, per run:

* ``osd_cpu_s``: user + system seconds of the arm's OSD daemons (``/proc/<pid>/stat``), from just
  before fio starts (after the mode probe) to just after it exits: gross, each OSD's background
  work (heartbeats, ticks) included. ``other_daemon_cpu_s``: the monitor's and the other OSD
  groups' seconds over the same window (an idle OSD's background shows there).
* ``client_cpu_s``: user + system seconds of fio's whole process tree, every thread (librbd's
  and librados' messenger threads, where msgr2 secure mode encrypts, included), as the runner
  recorded it (``ceph.client_cpu_s``: getrusage of its waited-for children). Records without it
  fall back to fio's own ``usr_cpu + sys_cpu`` times ``job_runtime_ms``: fio measures those with
  ``RUSAGE_THREAD``, its job thread only, without the library's threads; ``client_cpu_basis``
  says which. The CPU sidecar's ``busy_cpu_s`` is the whole machine (client and daemons alike
  on one box), so it is not the client's.

Per GiB and per I/O divide by the run's bytes and I/Os (every direction). The arm's verified
messenger mode (``messenger_mode_seen``: the one mode the probe client's connections used) and its
OSDs' device encryption come from the same record; a record that is not what the runner writes is
a problem naming the file and key, and its run has no row.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from luksbench.analysis.stats import with_dtypes
from luksbench.formats.layout import cpu_rep_path, read_raw_file

CEPH_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "run host stack workload rep session file messenger_mode messenger_mode_seen daemon_modes "
    "osd_ids osd_encryption osd_encrypted osd_cpu_s other_daemon_cpu_s daemon_window_s "
    "osd_peak_rss_bytes client_cpu_s client_window_s client_cpu_basis io_gib ios osd_cpu_s_per_gib "
    "osd_cpu_us_per_io client_cpu_s_per_gib client_cpu_us_per_io"
).split()
CEPH_DTYPES = {
    "string": (
        *("run", "host", "stack", "workload", "session", "file", "messenger_mode"),
        *("messenger_mode_seen", "daemon_modes", "osd_ids", "osd_encryption", "client_cpu_basis"),
    ),
    "int64": ("rep",),
    "boolean": ("osd_encrypted",),
}
#: per-run CPU metrics of the table, as the loss stage compares them (all: higher is worse)
CEPH_CPU_METRICS = (
    "client_cpu_s_per_gib",
    "client_cpu_us_per_io",
    "osd_cpu_s_per_gib",
    "osd_cpu_us_per_io",
)


def empty_ceph_table() -> pd.DataFrame:
    return with_dtypes(pd.DataFrame(columns=CEPH_COLUMNS), CEPH_DTYPES)


def rbd_stacks(stacks: pd.DataFrame) -> set[tuple[str, str]]:
    """(host, stack) of the ``rbd`` stacks (only their sidecars are read again)."""
    if stacks is None or stacks.empty or "kind" not in stacks:
        return set()
    rbd = stacks[stacks["kind"].astype("string").eq("rbd")]
    return set(zip(rbd["host"].astype(str), rbd["stack"].astype(str), strict=True))


def ceph_table(raw_dir: Path, fio: pd.DataFrame, stacks: pd.DataFrame) -> pd.DataFrame:
    """The Ceph table (:data:`CEPH_COLUMNS`) of the RBD arms' runs in ``fio`` (ingest's fio table,
    CPU columns included); ``attrs["problems"]``: (file, why) of every sidecar whose ``ceph``
    record is unreadable. Runs whose sidecar has no ``ceph`` record (an existing cluster, a raw
    ``rbd`` stack) have no row."""
    wanted = rbd_stacks(stacks)
    if fio.empty or not wanted:
        return empty_ceph_table()
    runs = _client_runs(fio)
    keep = [(h, s) in wanted for h, s in zip(runs["host_dir"], runs["stack"], strict=True)]
    rows, problems = [], []
    for run in runs[keep].to_dict("records"):
        sidecar = cpu_rep_path(Path(raw_dir) / str(run["file"]))
        try:
            record = read_ceph_record(sidecar)
        except ValueError as exc:
            problems.append((str(sidecar), str(exc)))
            continue
        if record is not None:
            rows.append({**run, **ceph_values(record), **client_cpu(record, run)})
    table = pd.DataFrame(rows).reindex(columns=[*CEPH_COLUMNS, "host_dir"])
    table = _per_gib_and_io(table.drop(columns="host_dir"))
    out = with_dtypes(table[CEPH_COLUMNS], CEPH_DTYPES)
    out.attrs["problems"] = problems
    return out


def _client_runs(fio: pd.DataFrame) -> pd.DataFrame:
    """One row per raw fio file: its cell, bytes, I/Os and fio's client CPU seconds (usr + sys
    share of each job's runtime, summed over the file's jobs)."""
    jobs = fio.drop_duplicates(["file", "job_index"])
    cpu_pct = jobs["usr_cpu"].astype(float) + jobs["sys_cpu"].astype(float)
    window = jobs["job_runtime_ms"].astype(float) / 1000
    jobs = jobs.assign(_client=cpu_pct / 100 * window, _window=window)
    per_job = jobs.groupby("file", sort=False)[["_client", "_window"]].sum(min_count=1)
    ios = (fio["io_bytes"].astype(float) / fio["io_bs_bytes"].astype(float)).fillna(0)
    moved = fio.assign(_ios=ios).groupby("file", sort=False)[["io_gib", "_ios"]].sum()
    keys = ["run", "host", "host_dir", "stack", "workload", "rep", "session", "file"]
    first = fio.drop_duplicates("file")[keys].set_index("file", drop=False)
    out = first.join(per_job).join(moved).reset_index(drop=True)
    return out.rename(columns={"_client": "client_cpu_s", "_window": "client_window_s"}).rename(
        columns={"_ios": "ios"}
    )


def read_ceph_record(path: Path) -> dict | None:
    """The ``ceph`` record of a CPU sidecar (None: the sidecar has none); ValueError naming the
    file and key when the sidecar or the record is not what the runner writes."""
    try:
        doc = json.loads(read_raw_file(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: CPU sidecar is not readable JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: CPU sidecar must be a JSON object")
    record = doc.get("ceph")
    if record is None:
        return None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: key 'ceph' must be an object")
    for key, kind in (("daemon_cpu_s", dict), ("osd_devices", list), ("mode_probe", dict)):
        if not isinstance(record.get(key), kind):
            raise ValueError(f"{path}: key 'ceph.{key}' must be a JSON {kind.__name__}")
    if not isinstance(record.get("messenger_mode"), str):
        raise ValueError(f"{path}: key 'ceph.messenger_mode' must be a string")
    for name, value in record["daemon_cpu_s"].items():
        if value is not None and (type(value) not in (int, float) or not value >= 0):
            raise ValueError(f"{path}: key 'ceph.daemon_cpu_s.{name}' is {value!r}, not >= 0")
    return record


def seen_mode(connections: dict) -> str:
    """The one mode every probed connection used, else each entity's (``mon.0: crc; ...``)."""
    modes = set(connections.values()) if isinstance(connections, dict) else set()
    if len(modes) == 1:
        return str(modes.pop())
    return "; ".join(f"{e}: {m}" for e, m in sorted((connections or {}).items())) or "none seen"


def ceph_values(record: dict) -> dict:
    """The Ceph table's columns of one run's ``ceph`` record (:func:`read_ceph_record`)."""
    devices = [d for d in record["osd_devices"] if isinstance(d, dict)]
    ids = [str(d.get("osd")) for d in devices]
    arm = {f"ceph-osd.{i}" for i in ids}
    cpu = record["daemon_cpu_s"]
    osd = [cpu.get(name) for name in sorted(arm)]
    other = [v for name, v in cpu.items() if name not in arm]
    encryption = sorted({str(d.get("encryption") or "none") for d in devices}) or ["none"]
    rss = [v for n, v in (record.get("daemon_peak_rss_bytes") or {}).items() if n in arm]
    return {
        "messenger_mode": record["messenger_mode"],
        "messenger_mode_seen": seen_mode(record["mode_probe"].get("connections")),
        "daemon_modes": str(record.get("daemon_modes") or ""),
        "osd_ids": ",".join(ids),
        "osd_encryption": "; ".join(encryption),
        "osd_encrypted": bool(devices) and all(d.get("encryption") for d in devices),
        # a daemon gone or restarted in the window (None) leaves the sum unknown
        "osd_cpu_s": _total(osd) if osd else math.nan,
        "other_daemon_cpu_s": _total(other),
        "daemon_window_s": _number(record.get("seconds")),
        "osd_peak_rss_bytes": max((v for v in rss if isinstance(v, int)), default=math.nan),
    }


#: what ``client_cpu_s`` counts
PROCESS_TREE = (
    "fio process tree over fio's lifetime (start-up and image open included), every thread "
    "(runner's getrusage of its children)"
)
JOB_THREAD = "fio job thread only (fio usr_cpu + sys_cpu: RUSAGE_THREAD, no librbd threads)"


def client_cpu(record: dict, run: dict) -> dict:
    """The client's CPU of a run: the runner's record of fio's process tree, else fio's own
    job-thread figures (``run``: :func:`_client_runs`'s row)."""
    seconds = record.get("client_cpu_s")
    if type(seconds) in (int, float) and seconds >= 0:
        window = _number(record.get("seconds"))
        return {
            "client_cpu_s": float(seconds),
            "client_window_s": window,
            "client_cpu_basis": PROCESS_TREE,
        }
    return {"client_cpu_basis": JOB_THREAD if not math.isnan(run["client_cpu_s"]) else ""}


def _total(values: list) -> float:
    return math.nan if any(v is None for v in values) else float(sum(values))


def _number(value) -> float:
    return float(value) if type(value) in (int, float) else math.nan


def _per_gib_and_io(table: pd.DataFrame) -> pd.DataFrame:
    gib = table["io_gib"].astype(float).to_numpy()
    ios = table["ios"].astype(float).to_numpy()
    out = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for who in ("osd", "client"):
            seconds = table[f"{who}_cpu_s"].astype(float).to_numpy()
            out[f"{who}_cpu_s_per_gib"] = np.where(gib > 0, seconds / gib, np.nan)
            out[f"{who}_cpu_us_per_io"] = np.where(ios > 0, 1e6 * seconds / ios, np.nan)
    return table.assign(**out)
