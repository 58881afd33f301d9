"""Run the fio matrix over the stacks that ``stack-up`` brought up.

Schedule: repetition k of every cell is "round" k. Within a round the cells run in the order
``random.Random(seed + k).shuffle``; within a cell all stacks run back to back, and their order is
counterbalanced across rounds ABBA-style (round 1 baseline first, rounds 2 and 3 reversed,
round 4 baseline first, then repeat). Repetition k of every stack forms pair k.

Raw results are immutable: each rep is written to a temp file in its directory, fsynced, renamed
into place and made read-only (0444). An existing ``rep<k>.json`` is never overwritten, it is
skipped, so re-running an interrupted command does only the missing repetitions.

Ctrl-C / SIGTERM: the running fio is stopped, its temp output removed (no partial rep file
remains), the manifest is written with ``complete: false`` and the command exits non-zero
(130 / 143). The devices stay up; the caller (the workflow's error handler) runs ``stack-down``.

Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from luksbench.formats.layout import Workload, cpu_rep_path, fio_rep_path
from luksbench.testbox import probes, safety
from luksbench.testbox.plan import RANDOM_RW, baseline_first, cell_options, workloads
from luksbench.testbox.stacks import load_state
from luksbench.testbox.sysutil import TestboxError, log, pid_alive, utc_now, write_json_atomic

PAIRING = "rep k of every stack forms pair k (same round k, same cell, run back to back)"
COUNTERBALANCE = (
    "ABBA across rounds: rounds 1,4,5,8,... stacks in order; rounds 2,3,6,7,... reversed"
)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived while running the matrix."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# --- schedule ------------------------------------------------------------------------------------


def stacks_for_round(stacks: list[str], round_no: int) -> list[str]:
    """ABBA counterbalancing: rounds 1, 4, 5, 8, ... in order; 2, 3, 6, 7, ... reversed."""
    return list(stacks) if (round_no - 1) % 4 in (0, 3) else list(reversed(stacks))


def load_targets(path: Path) -> dict[str, int]:
    """Per-cell repetition targets (workload id -> pairs) from an adaptive targets file.

    The file is written by the analysis side (``luksbench.analysis.design``); only its ``pairs`` object is
    read here. Raises TestboxError naming the file when it is malformed."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TestboxError(f"{path}: cannot read targets: {exc}") from exc
    pairs = doc.get("pairs") if isinstance(doc, dict) else None
    if not isinstance(pairs, dict):
        raise TestboxError(f"{path}: 'pairs' must be an object (workload id -> pairs)")
    for w, n in pairs.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TestboxError(f"{path}: pairs of {w!r} must be a positive integer, not {n!r}")
    return dict(pairs)


def cell_repetitions(plan: dict, targets: dict[str, int] | None = None) -> dict[str, int]:
    """Repetitions per cell: the plan's, or a cell's target when larger (adaptive stage 2)."""
    fixed = int(plan["repetitions"])
    targets = targets or {}
    return {w.id: max(fixed, int(targets.get(w.id, fixed))) for w in workloads(plan)}


def schedule(plan: dict, targets: dict[str, int] | None = None) -> list[dict]:
    """The whole matrix in run order: one entry per fio run.

    Round k shuffles all cells with ``random.Random(seed + k)`` and runs those that need a k-th
    repetition (every cell with a fixed design; with ``targets``, cells whose target is >= k), so the
    rounds of the fixed design (and of an adaptive pilot) are the same with or without targets."""
    cells = workloads(plan)
    reps = cell_repetitions(plan, targets)
    stacks = baseline_first(plan)
    runs = []
    for k in range(1, max(reps.values(), default=0) + 1):
        order = list(cells)
        random.Random(int(plan["seed"]) + k).shuffle(order)
        for w in (w for w in order if reps[w.id] >= k):
            for pos, stack in enumerate(stacks_for_round(stacks, k)):
                runs.append(
                    {"round": k, "rep": k, "stack": stack, "workload": w, "position_in_cell": pos}
                )
    for i, r in enumerate(runs, 1):
        r["index"] = i
    return runs


# --- /proc/stat and RAPL (sampling in luksbench.testbox.probes) ---------------------------------

read_proc_stat = probes.read_proc_stat


def cpu_sidecar(before: dict, after: dict, interval_s: float, rapl: dict | None = None) -> dict:
    """The rep's sidecar: /proc/stat deltas over the fio run and its RAPL energy (None: absent)."""
    return {
        **probes.cpu_delta(before, after, interval_s),
        "window": "fio process lifetime (startup, ramp_time and runtime); aggregate cpu line of /proc/stat; iowait counts as idle",
        "rapl": rapl,
    }


# --- fio -----------------------------------------------------------------------------------------


def fio_argv(
    plan: dict, entry: dict, stack: str, w: Workload, output: Path, io_size: int
) -> list[str]:
    """fio's command line for one run of cell ``w`` on ``stack``, over the first ``io_size`` bytes
    of its device (0: all of it). A pattern cell runs with its pattern's fio options; one whose
    block does not fit ``io_size`` is refused (TestboxError) before fio starts."""
    f = plan["fio"]
    cell = cell_options(plan, w)
    if io_size and w.bs_bytes > io_size:
        what = f"pattern {w.pattern}: cell {w.id}" if w.pattern else f"cell {w.id}"
        raise TestboxError(
            f"{what} on stack {stack}: its block of {w.bs} is larger than the span fio uses on "
            f"every stack ({io_size} bytes, the smallest device): use larger devices or take "
            f"{w.bs} out of the matrix"
        )
    if entry.get("device_type") == "rbd":
        # Ceph: fio's rbd engine talks to the cluster itself (client keyring from ceph.conf).
        rbd = plan["stacks"][stack]
        target = [
            "--ioengine=rbd",
            f"--clientname={rbd.get('client', 'admin')}",
            f"--pool={rbd['pool']}",
            f"--rbdname={rbd['image']}",
        ]
    else:
        target = [f"--filename={entry['device']}", f"--ioengine={cell['ioengine']}"]
    n = cell["ios_per_block"]
    if n > 1 and w.rw in RANDOM_RW:
        # One random offset per block (aligned to the block), then n sequential I/Os of io_bs.
        # blockalign turns fio's random map off anyway; saying so keeps fio's notice out of
        # the output.
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
        f"--output-format={f.get('output_format', 'json+')}",
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
        f"--runtime={f.get('runtime_s', 3)}s",
        f"--ramp_time={f.get('ramp_time_s', 0)}s",
        "--numjobs=1",
        "--group_reporting",
    ]
    if io_size:
        argv.append(f"--size={io_size}")
    return argv


# fio's clock sources by the number its ``--debug=time`` start-up line prints (enum fio_cs).
_CLOCKSOURCES = {"1": "gettimeofday", "2": "clock_gettime", "3": "cpu"}


def fio_clocksource(timeout: float = 30) -> str | None:
    """The clock source fio picks on this machine, or None when fio does not say.

    Every fio start-up without ``--clocksource`` checks whether the TSC can be used (about 60 ms
    of a 0.3 s start-up); ``run_fio`` asks once per session here and passes fio's own choice to
    every run, so each run uses the clock fio would pick and all runs of a session use the same."""
    argv = ["fio", "--debug=time", "--parse-only", "--name=clock", "--filename=/dev/null"]
    try:
        proc = subprocess.run(
            [*argv, "--size=1m"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.findall(r"gettime: clocksource=(\d+)", proc.stdout + proc.stderr)
    return _CLOCKSOURCES.get(found[-1]) if found and proc.returncode == 0 else None


def fleet_clients(plan: dict) -> list[dict]:
    """The fio servers every run is sent to (fleet mode ``clients``); empty: fio runs here."""
    fleet = plan.get("fleet") or {}
    return list(fleet.get("hosts") or []) if fleet.get("mode") == "clients" else []


# Options that stay on the client's command line; every other one goes to the job file.
_CLIENT_SIDE = ("--output-format=", "--output=")


def client_argv(
    local_argv: list[str], job_path: Path, clients: list[dict]
) -> tuple[list[str], str]:
    """fio's client/server form of a local fio command line: (argv, job file text).

    One ``--client`` per server, so all of them run the job at the same time (many clients
    loading one shared target); the JSON then has one ``client_stats`` entry per server."""
    job_lines, client_side = [], []
    for arg in local_argv[1:]:
        if arg.startswith(_CLIENT_SIDE):
            client_side.append(arg)
        elif arg.startswith("--name="):
            job_lines.insert(0, f"[{arg.split('=', 1)[1]}]")
        else:
            job_lines.append(arg[2:])
    # Each --client names its own job file: with one job file after several --client options,
    # fio 3.33 sends the job to one server only.
    servers = [
        arg
        for c in clients
        for arg in (f"--client=ip:{c['address']},{int(c.get('port', 8765))}", str(job_path))
    ]
    return ["fio", *client_side, *servers], "\n".join(job_lines) + "\n"


def check_servers(clients: list[dict], timeout: float = 5.0) -> None:
    """Every fio server answers on its port, or TestboxError names the ones that do not."""
    down = []
    for c in clients:
        try:
            with socket.create_connection((c["address"], int(c.get("port", 8765))), timeout):
                pass
        except OSError as exc:
            down.append(
                f"{c['name']} ({c['address']}:{c.get('port', 8765)}: {exc.strerror or exc})"
            )
    if down:
        raise TestboxError(
            "fio servers not reachable: "
            + "; ".join(down)
            + " (start `fio --server=ip:<address>,<port>` on each host)"
        )


def parse_fio_output(text: str) -> dict:
    """fio's JSON document (fio may print warnings before it); raises ValueError."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in fio output")
    doc = json.loads(text[start:])
    if not (doc.get("jobs") or doc.get("client_stats")):
        raise ValueError("fio output has no jobs")
    return doc


def job_entries(doc: dict) -> list[dict]:
    """Per-job entries: ``jobs``, or in client/server output every server's (not the sum)."""
    if doc.get("client_stats"):
        return [e for e in doc["client_stats"] if e.get("jobname") != "All clients"]
    return doc["jobs"]


def _summary(doc: dict) -> str:
    entries = job_entries(doc)
    if len(entries) > 1:
        per_host = ", ".join(
            f"{e.get('hostname')}:{e.get('port')} "
            f"{sum(e.get(d, {}).get('bw_bytes', 0) for d in ('read', 'write', 'trim')) / 2**20:.1f}"
            for e in entries
        )
        return f"MiB/s per server: {per_host}"
    job = entries[0]
    bw = sum(job.get(d, {}).get("bw_bytes", 0) for d in ("read", "write", "trim"))
    iops = sum(job.get(d, {}).get("iops", 0.0) for d in ("read", "write", "trim"))
    iops_s = f"{iops / 1000:.1f}k" if iops >= 1000 else f"{iops:.0f}"
    return f"{bw / 2**20:.1f} MiB/s, {iops_s} IOPS"


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)


# --- checks --------------------------------------------------------------------------------------


def check_state_live(state: dict) -> None:
    """The devices STATE names must still be there."""
    problems = []
    if not state.get("complete"):
        problems.append("stack-up did not complete")
    for name, e in state["stacks"].items():
        dev = e.get("device")
        if e.get("unavailable") or e.get("device_type") == "rbd":
            continue  # nothing local to check; fio reports a failure to connect
        if not dev or not os.path.exists(dev):
            problems.append(f"{name}: {dev} is gone")
        elif e.get("device_type") == "block":
            if not stat.S_ISBLK(os.stat(dev).st_mode):
                problems.append(f"{name}: {dev} is not a block device")
        elif e.get("device_type") == "fsfile":
            if not safety.is_mounted(e["mountpoint"]):
                problems.append(f"{name}: filesystem {e['mountpoint']} is not mounted")
        else:
            if not safety.is_mounted(e["mountpoint"]):
                problems.append(f"{name}: FUSE export {e['mountpoint']} is not mounted")
            if not pid_alive((e.get("daemon") or {}).get("pid")):
                problems.append(
                    f"{name}: qemu-storage-daemon pid {(e.get('daemon') or {}).get('pid')} is not running"
                )
    if problems:
        raise TestboxError(
            "stack state is stale; run stack-down and stack-up again (" + "; ".join(problems) + ")"
        )


def _previous_times(manifest_path: Path) -> dict:
    try:
        old = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {
        (r["stack"], r["workload"], r["rep"]): (r.get("started"), r.get("ended"))
        for r in old.get("runs", [])
        if r.get("started")
    }


# --- run-fio -------------------------------------------------------------------------------------


def run_fio(
    plan: dict,
    state_path: Path,
    raw_host_dir: Path,
    manifest_path: Path,
    describe_path: Path | None = None,
    targets_path: Path | None = None,
) -> int:
    """Run the matrix; returns 0 when every rep exists at the end. Raises Interrupted on signals.

    ``targets_path``: per-cell repetition targets (adaptive stage 2, :func:`load_targets`); cells
    are topped up to their own target, none gets fewer than the plan's repetitions.

    The manifest is the index of the run as it stands (rewritten by every session); each session
    also leaves a write-once copy in ``fio/sessions/`` so no session's record is ever lost. Both
    carry the stack descriptions (``describe_path``, written by stack-up: no key material).
    """
    state = load_state(Path(state_path))
    if state["run"] != plan["run"] or set(state["stacks"]) != set(plan["stacks"]):
        raise TestboxError(
            f"{state_path} is for run {state['run']!r} with stacks {sorted(state['stacks'])}, "
            f"but the plan is run {plan['run']!r} with stacks {sorted(plan['stacks'])}"
        )
    check_state_live(state)
    if fleet_clients(plan):
        check_servers(fleet_clients(plan))
    raw_host_dir = Path(raw_host_dir).resolve()
    raw_dir, host = raw_host_dir.parent, raw_host_dir.name
    if host != plan["host"]:
        log(
            f"luksbench testbox run-fio: warning: host dir {host!r} differs from plan host {plan['host']!r}"
        )
    manifest_path = Path(manifest_path)
    previous = _previous_times(manifest_path)
    stack_descriptions = (
        json.loads(Path(describe_path).read_text()) if describe_path is not None else None
    )
    io_size = int(state.get("io_size_bytes") or 0)
    targets = load_targets(Path(targets_path)) if targets_path is not None else None
    if targets:
        unknown = sorted(set(targets) - {w.id for w in workloads(plan)})
        if unknown:
            log(f"luksbench testbox run-fio: warning: targets for cells not in the plan: {unknown}")
    # Optional stacks that could not be built here (stack-up recorded why) are not measured.
    unavailable = {n: e["unavailable"] for n, e in state["stacks"].items() if e.get("unavailable")}
    measured_plan = {
        **plan,
        "stacks": {n: s for n, s in plan["stacks"].items() if n not in unavailable},
    }
    for name, why in unavailable.items():
        log(f"luksbench testbox run-fio: stack {name} unavailable here, not measured: {why}")
    runs = schedule(measured_plan, targets)
    reps = cell_repetitions(plan, targets)
    total = len(runs)
    width = len(str(total))
    rep_text = (
        f"{plan['repetitions']} reps"
        if len(set(reps.values())) <= 1 and not targets
        else f"{min(reps.values())}-{max(reps.values())} reps per cell from {targets_path}"
    )
    log(
        f"luksbench testbox run-fio: {total} fio runs ({len(workloads(plan))} cells x "
        f"{len(measured_plan['stacks'])} stacks x {rep_text}), backend {state['backend']}"
    )
    done: list[dict] = []
    failed: list[str] = []
    started = utc_now()

    def on_signal(signum, _frame):
        raise Interrupted(signum)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    interrupted: Interrupted | None = None
    cpu_idle_baseline: dict | None = None
    clocksource: str | None = None
    try:
        # fio servers pick their own clock; here one probe per session instead of one per fio start.
        if not fleet_clients(plan):
            clocksource = fio_clocksource()
        # Once per session, before any fio run: the load and power of the box doing nothing.
        cpu_idle_baseline = probes.idle_baseline()
        for r in runs:
            w: Workload = r["workload"]
            stack = r["stack"]
            path = fio_rep_path(raw_dir, host, stack, w, r["rep"])
            rec = {
                "index": r["index"],
                "round": r["round"],
                "rep": r["rep"],
                "stack": stack,
                "workload": w.id,
                "position_in_cell": r["position_in_cell"],
                "path": str(path.relative_to(raw_host_dir)),
                "cpu_path": str(cpu_rep_path(path).relative_to(raw_host_dir)),
                "started": None,
                "ended": None,
                "skipped_existing": False,
                "status": None,
            }
            tag = f"[{r['index']:>{width}}/{total}] {stack} {w.id} rep{r['rep']}"
            if path.exists():
                rec["skipped_existing"] = True
                rec["status"] = "skipped_existing"
                rec["started"], rec["ended"] = previous.get((stack, w.id, r["rep"]), (None, None))
                done.append(rec)
                log(f"{tag}: exists, skipped")
                continue
            check_state_live(state)
            check_free_space(path.parent)
            rec["started"] = utc_now()
            ok, msg = _one_run(plan, state["stacks"][stack], stack, w, path, io_size, clocksource)
            rec["ended"] = utc_now()
            rec["status"] = "ok" if ok else "failed"
            done.append(rec)
            log(f"{tag}: {msg}")
            if not ok:
                failed.append(f"{stack} {w.id} rep{r['rep']}")
                # A full disk fails every later run too: stop now, keeping what was measured.
                check_free_space(path.parent)
    except Interrupted as exc:
        interrupted = exc
        log(
            f"luksbench testbox run-fio: interrupted by {exc}; fio stopped, no partial rep kept; devices stay up (run stack-down)"
        )
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        manifest = {
            "run": plan["run"],
            "host": host,
            "seed": plan["seed"],
            "repetitions": plan["repetitions"],
            "cell_repetitions": reps,
            "targets": str(targets_path) if targets_path is not None else None,
            "adaptive": plan.get("adaptive"),
            "backend": state["backend"],
            "backend_reason": state["backend_reason"],
            "baseline": plan["baseline"],
            "fleet": plan.get("fleet"),
            "stacks": baseline_first(measured_plan),
            "unavailable_stacks": unavailable,
            "cells": [w.id for w in workloads(plan)],
            "pairing": PAIRING,
            "counterbalance": COUNTERBALANCE,
            "cell_order": (
                "round k shuffles the cells with random.Random(seed + k) and runs those with at "
                "least k repetitions (cell_repetitions)"
            ),
            "io_size_bytes": io_size,
            "cpu_idle_baseline": cpu_idle_baseline,
            "fio_clocksource": clocksource,
            "fio": plan["fio"],
            "started": started,
            "ended": utc_now(),
            "complete": interrupted is None and not failed and len(done) == total,
            "interrupted": str(interrupted) if interrupted else None,
            "failed": failed,
            "stack_descriptions": stack_descriptions,
            "runs": done,
        }
        try:
            write_json_atomic(manifest_path, manifest)
            _keep_session_record(manifest_path.parent / "sessions", manifest)
        except OSError as exc:
            # The rep files are the data and are already safe; say why the record is missing.
            log(f"luksbench testbox run-fio: could not write the manifest {manifest_path}: {exc}")
            if interrupted is None and not failed:
                raise TestboxError(f"could not write the manifest {manifest_path}: {exc}") from exc
    if interrupted is not None:
        raise interrupted
    if failed:
        log(f"luksbench testbox run-fio: {len(failed)} fio run(s) failed: {', '.join(failed)}")
        return 1
    log(f"luksbench testbox run-fio: done; manifest {manifest_path}")
    return 0


# Room a fio run needs in the raw directory: a json+ result with its CPU sidecar is ~10-60 KiB;
# the margin keeps the manifest writable too.
MIN_FREE_BYTES = 4 * 1024 * 1024


def check_free_space(directory: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """Stop before a run whose result could not be stored (a full disk truncates fio's JSON)."""
    directory.mkdir(parents=True, exist_ok=True)
    fs = os.statvfs(directory)
    free = fs.f_bavail * fs.f_frsize
    if free < min_free:
        raise TestboxError(
            f"no space left for raw results in {directory}: {free // 1024} KiB free, "
            f"{min_free // 1024} KiB needed per fio run; finished repetitions are kept, "
            "free some space and run again to measure the rest"
        )


def _keep_session_record(sessions_dir: Path, manifest: dict) -> None:
    """A read-only copy of this session's manifest, named by its start time; never overwritten."""
    sessions_dir.mkdir(parents=True, exist_ok=True)
    stamp = "".join(ch for ch in manifest["started"] if ch.isalnum())
    path = sessions_dir / f"{stamp}.json"
    suffix = 1
    while path.exists():
        suffix += 1
        path = sessions_dir / f"{stamp}-{suffix}.json"
    write_json_atomic(path, manifest)
    path.chmod(0o444)


def _one_run(
    plan: dict,
    entry: dict,
    stack: str,
    w: Workload,
    path: Path,
    io_size: int,
    clocksource: str | None = None,
) -> tuple[bool, str]:
    """One fio run into ``path`` (+ cpu sidecar). Returns (ok, progress message).

    ``clocksource``: fio's own choice on this machine (:func:`fio_clocksource`), passed on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)  # left by a SIGKILLed earlier attempt
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    proc = None
    try:
        argv = fio_argv(plan, entry, stack, w, tmp, io_size)
        if clocksource:
            argv.append(f"--clocksource={clocksource}")
        clients = fleet_clients(plan)
        if clients:
            job = tmp.with_suffix(".job.tmp")  # matched by the stale-file glob above
            argv, job_text = client_argv(argv, job, clients)
            job.write_text(job_text)
        before, rapl_before, t0 = read_proc_stat(), probes.read_rapl(), time.monotonic()
        # Own session: a terminal Ctrl-C reaches only us; we stop fio ourselves and discard output.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        _, err = proc.communicate()
        t1, after, rapl_after = time.monotonic(), read_proc_stat(), probes.read_rapl()
        if err.strip():
            for line in err.strip().splitlines():
                log(f"    fio: {line}")
        if proc.returncode != 0:
            return (
                False,
                f"FAILED: fio exited {proc.returncode} (cell {stack} {w.id}); no rep file written",
            )
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
            text = f.read().decode(errors="replace")
        try:
            doc = parse_fio_output(text)
        except ValueError as exc:
            return False, f"FAILED: fio output unreadable ({exc}); no rep file written"
        errs = [j.get("error") for j in job_entries(doc) if j.get("error")]
        if errs:
            return False, f"FAILED: fio job error {errs}; no rep file written"
        sidecar = cpu_sidecar(
            before, after, t1 - t0, probes.rapl_delta(rapl_before, rapl_after, t1 - t0)
        )
        # The sidecar goes first: the rep file's appearance is the commit point.
        write_json_atomic(cpu_rep_path(path), sidecar, mode=0o444)
        os.chmod(tmp, 0o444)
        if path.exists():  # never overwrite a raw result (someone else wrote it meanwhile)
            return False, f"FAILED: {path} appeared during the run; not overwritten"
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return True, f"{_summary(doc)} (cpu busy {sidecar['busy_pct']}%, {t1 - t0:.2f} s)"
    except BaseException:
        if proc is not None:
            _stop(proc)
        raise
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".job.tmp").unlink(missing_ok=True)
