"""fio's command lines (local, fleet clients, clock source) and the checks of a finished fio
result. Standard library only."""

from __future__ import annotations

import math
import re
import socket
import subprocess
from pathlib import Path

from luksbench.formats.fio import (
    FIO_COLUMNS,
    FioParseError,
    document_tuples,
    job_entries,
    load_fio_document,
)
from luksbench.formats.layout import Workload
from luksbench.testbox import cephrun, jobs, sysutil
from luksbench.testbox.planbuild import RANDOM_RW, cell_options
from luksbench.testbox.sysutil import TestboxError, log


def fio_argv(
    plan: dict,
    entry: dict,
    stack: str,
    w: Workload,
    output: Path,
    io_size: int,
    rate_iops: int | None = None,
    devices: dict | None = None,
) -> list[str]:
    """fio's command line for one run of cell ``w`` on ``stack`` over the first ``io_size`` bytes
    (0: all), at most ``rate_iops`` I/Os per second in all jobs, with the job options decided for
    all the cell's ``devices``; TestboxError when the block does not fit ``io_size``."""
    f = plan["fio"]
    cell = cell_options(plan, w)
    if io_size and w.bs_bytes > io_size:
        what = f"pattern {w.pattern}: cell {w.id}" if w.pattern else f"cell {w.id}"
        raise TestboxError(
            f"{what} on stack {stack}: its block of {w.bs} is larger than the span fio uses on "
            f"every stack ({io_size} bytes, the smallest device): use larger devices or take "
            f"{w.bs} out of the matrix"
        )
    if entry.get("ceph"):  # an RBD arm over the run's own cluster
        target = cephrun.fio_target_for(entry)
    elif entry.get("device_type") == "rbd":
        # Ceph: fio's rbd engine talks to the cluster itself (client keyring from ceph.conf).
        rbd = plan["stacks"][stack]
        target = [
            "--ioengine=rbd",
            f"--clientname={rbd['client']}",
            f"--pool={rbd['pool']}",
            f"--rbdname={rbd['image']}",
        ]
    else:
        target = [f"--filename={entry['device']}", f"--ioengine={cell['ioengine']}"]
    n = cell["ios_per_block"]
    if n > 1 and w.rw in RANDOM_RW:
        # One random offset per block, then n sequential I/Os of io_bs. blockalign turns fio's
        # random map off anyway; saying so keeps fio's notice out of the output.
        rw = [
            f"--rw={w.rw}:{n}",
            "--rw_sequencer=sequential",
            f"--blockalign={w.bs_bytes}",
            "--norandommap",
        ]
    else:
        rw = [f"--rw={w.rw}"]
    argv = [
        "fio",
        f"--output-format={f['output_format']}",
        f"--output={output}",
        f"--name={stack}-{w.id}",
        *target[:1],
        *rw,
        f"--bs={cell['io_bs_bytes']}",
        f"--iodepth={w.iodepth}",
        *target[1:],
        f"--direct={1 if cell['direct'] else 0}",
    ]
    if cell["sync"]:
        argv.append("--sync=1")
    if cell["fsync"]:
        argv.append(f"--fsync={cell['fsync']}")
    argv += [
        "--time_based",
        f"--runtime={f['runtime_s']}s",
        f"--ramp_time={f['ramp_time_s']}s",
        f"--numjobs={cell['numjobs']}",
    ]
    # several jobs: one entry each (ingest sums throughput and merges their histograms)
    argv += ["--group_reporting"] if cell["numjobs"] == 1 else []
    argv += jobs.job_setup(cell, devices or {stack: entry.get("device")})["args"]
    if io_size:
        argv.append(f"--size={io_size}")
    if rate_iops:  # fio's rate_iops holds for each job
        argv.append(f"--rate_iops={math.ceil(rate_iops / cell['numjobs'])}")
    return argv


# fio's clock sources by the number its ``--debug=time`` start-up line prints (enum fio_cs).
_CLOCKSOURCES = {"1": "gettimeofday", "2": "clock_gettime", "3": "cpu"}


def fio_clocksource(timeout: float = 30, tries: int = 3) -> str | None:
    """The clock source fio picks here (None: fio does not say), asked once per session so all
    its runs use one clock. fio's TSC check can pass on one start-up and fail on the next (VMs):
    see :func:`steadiest_clock`."""
    argv = ["fio", "--debug=time", "--parse-only", "--name=clock", "--filename=/dev/null"]
    picks = []
    for _ in range(tries):
        try:
            proc = subprocess.run([*argv, "--size=1m"], timeout=timeout, **sysutil.QUIET)
        except (OSError, subprocess.TimeoutExpired):
            return None
        found = re.findall(r"gettime: clocksource=(\d+)", proc.stdout + proc.stderr)
        picks.append(_CLOCKSOURCES.get(found[-1]) if found and proc.returncode == 0 else None)
    return steadiest_clock(picks)


def steadiest_clock(picks: list[str | None]) -> str | None:
    """The TSC (``cpu``) only when fio chose it every time, else the first other clock fio chose
    (None: fio did not say every time)."""
    if not picks or None in picks:
        return None
    return next((pick for pick in picks if pick != "cpu"), "cpu")


def fleet_clients(plan: dict) -> list[dict]:
    """The fio servers every run is sent to (fleet mode ``clients``); empty: fio runs here."""
    fleet = plan.get("fleet") or {}
    return list(fleet.get("hosts") or []) if fleet.get("mode") == "clients" else []


# Options that stay on the client's command line; every other one goes to the job file.
_CLIENT_SIDE = ("--output-format=", "--output=")


def client_argv(
    local_argv: list[str], job_path: Path, clients: list[dict]
) -> tuple[list[str], str]:
    """fio's client/server form of a local command line: (argv, job file text). Every server runs
    the job at once; the JSON has one ``client_stats`` entry per server."""
    job_lines, client_side = [], []
    for arg in local_argv[1:]:
        if arg.startswith(_CLIENT_SIDE):
            client_side.append(arg)
        elif arg.startswith("--name="):
            job_lines.insert(0, f"[{arg.split('=', 1)[1]}]")
        else:
            job_lines.append(arg[2:])
    # One job file per --client: with one after several, fio 3.33 sends the job to one server.
    servers = [
        arg
        for c in clients
        for arg in (f"--client=ip:{c['address']},{int(c.get('port', 8765))}", str(job_path))
    ]
    return ["fio", *client_side, *servers], "\n".join(job_lines) + "\n"


def _session_form(plan: dict, argv: list[str], clocksource: str | None, job: Path) -> list[str]:
    """A run's fio command line on the session's clock; in fleet mode its client form (job file
    ``job``)."""
    if clocksource:
        argv = [*argv, f"--clocksource={clocksource}"]
    if fleet_clients(plan):
        argv, job_text = client_argv(argv, job, fleet_clients(plan))
        job.write_text(job_text)
    return argv


def check_servers(clients: list[dict], timeout: float = 5.0) -> None:
    """Every fio server answers on its port, or TestboxError names the ones that do not."""
    down = []
    for c in clients:
        address = (c["address"], c.get("port", 8765))
        try:
            socket.create_connection((address[0], int(address[1])), timeout).close()
        except OSError as exc:
            down.append(f"{c['name']} ({address[0]}:{address[1]}: {exc.strerror or exc})")
    if down:
        raise TestboxError(
            f"fio servers not reachable: {'; '.join(down)} "
            "(start `fio --server=ip:<address>,<port>` on each host)"
        )


def check_fio_result(path: Path) -> dict:
    """The fio document in ``path`` if ingest's loader takes it and no job failed, else ValueError."""
    try:
        doc = load_fio_document(path, warn=log)
        rows = document_tuples(path, doc)
    except FioParseError as exc:
        raise ValueError(f"fio output unreadable ({exc})") from exc
    error_column = FIO_COLUMNS.index("error")
    errors = [e for e in dict.fromkeys(r[error_column] for r in rows) if e]
    if errors:
        raise ValueError(f"fio job error {errors}")
    return doc


def _total(entry: dict, key: str) -> float:
    """``key`` summed over an entry's read, write and trim statistics."""
    return sum(entry.get(d, {}).get(key, 0.0) for d in ("read", "write", "trim"))


def _summary(doc: dict) -> str:
    entries = [e for _, e, _ in job_entries(doc)]
    if len(entries) > 1 and doc.get("client_stats"):
        per_host = ", ".join(
            f"{e.get('hostname')}:{e.get('port')} {_total(e, 'bw_bytes') / 2**20:.1f}"
            for e in entries
        )
        return f"MiB/s per server: {per_host}"
    bw, iops = (sum(_total(e, key) for e in entries) for key in ("bw_bytes", "iops"))
    iops_s = f"{iops / 1000:.1f}k" if iops >= 1000 else f"{iops:.0f}"
    return f"{bw / 2**20:.1f} MiB/s, {iops_s} IOPS"


#: seconds fio gets to stop its jobs after SIGINT before it is killed
