"""Teardown of a throwaway Ceph cluster (testbox/ceph.py) from its record (``cluster.json``) or
from what runs on this machine: every daemon and client of the cluster stopped (OSDs first),
the OSDs' loop devices detached, the cluster's folder removed, and the check that nothing of it
is left. Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from luksbench.testbox.safety import loop_devices_backed_by
from luksbench.testbox.sysutil import (
    TestboxError,
    cmdline,
    pid_alive,
    read_text,
    run_tool,
    stop_process,
)

RECORD_NAME = "cluster.json"


def start_time(pid: int) -> str | None:
    stat = read_text(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split() if stat else []
    return fields[19] if len(fields) > 19 else None


def detach_loops(paths: list[str], actions: list[str], errors: list[str]) -> None:
    """Detach the loop devices over ``paths`` (the files the OSDs sit on through a loop)."""
    for loop in loop_devices_backed_by(paths):
        try:
            run_tool(["losetup", "-d", loop], f"detach {loop}")
            actions.append(f"detached OSD loop device {loop}")
        except TestboxError as exc:
            errors.append(str(exc))


def load_cluster(top: str | Path) -> dict | None:
    try:
        return json.loads((Path(top) / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None


def cluster_processes(top: str | Path) -> list[int]:
    """Ceph daemons (and clients) whose command line or environment names this cluster's conf."""
    conf = str(Path(top) / "ceph.conf")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        argv = cmdline(pid)
        environ = (read_text(f"/proc/{pid}/environ") or "").split("\0")
        if (conf in argv or f"CEPH_CONF={conf}" in environ) and pid_alive(pid):
            found.append(pid)
    return sorted(found)


def _recorded_pids(cluster: dict) -> list[int]:
    """Recorded daemons still running as the same process (a reused pid is not ours)."""
    return [
        d["pid"]
        for d in cluster.get("daemons", [])
        if pid_alive(d["pid"]) and start_time(d["pid"]) == d.get("started")
    ]


def cluster_down(top: str | Path) -> dict:
    """Stop every daemon and client of the cluster in ``top`` (OSDs first), remove its folder,
    and check nothing is left. Idempotent; works from the record alone (after a kill -9)."""
    top = Path(top)
    actions, errors = [], []
    cluster = load_cluster(top) or {"daemons": []}
    recorded = _recorded_pids(cluster)
    order = sorted(set(recorded) | set(cluster_processes(top)), key=lambda p: p not in recorded)
    osds_first = sorted(order, key=lambda p: "ceph-mon" in " ".join(cmdline(p)))
    for pid in osds_first:
        name = os.path.basename(cmdline(pid)[0] or "?")
        if stopped_by := stop_process(pid, (signal.SIGTERM, signal.SIGKILL)):
            actions.append(f"stopped {name} pid {pid} ({stopped_by})")
        elif pid_alive(pid):
            errors.append(f"{name} pid {pid} did not stop")
    if not errors:
        over = [o["loop_over"] for o in cluster.get("osds", []) if o.get("loop_over")]
        detach_loops(over, actions, errors)
    if top.exists() and not errors:
        shutil.rmtree(top, ignore_errors=True)
        actions.append(f"removed Ceph folder {top}")
    left = cluster_leftovers(top, cluster)
    if any(left.values()):
        errors.append(f"Ceph leftovers: {left}")
    return {"actions": actions, "errors": errors, "leftovers": left}


def cluster_leftovers(top: str | Path, cluster: dict | None = None) -> dict:
    top = Path(top)
    pids = set(cluster_processes(top)) | set(_recorded_pids(cluster or {}))
    sockets = [str(p) for p in top.rglob("*.asok")] if top.exists() else []
    over = [o["loop_over"] for o in (cluster or {}).get("osds", []) if o.get("loop_over")]
    left = {"pids": sorted(pids), "sockets": sockets, "loop_devices": loop_devices_backed_by(over)}
    return {**left, "folder": [str(top)] if top.exists() else []}
