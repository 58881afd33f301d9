"""Run the fio matrix over the stacks that ``stack-up`` brought up.

Raw results are immutable: each rep is written to a temp file, fsynced, renamed into place and
made read-only; an existing ``rep<k>.json`` is skipped, so a re-run does only the missing reps.
Ctrl-C / SIGTERM stops fio, keeps no partial rep, records the session in ``fio/sessions/`` with
``complete: false`` (no ``manifest.json``: that is written only by a complete measurement) and
exits 130 / 143; the devices stay up for ``stack-down``. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import math
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

from luksbench.formats.envdoc import read_env
from luksbench.formats.fio import (
    FIO_COLUMNS,
    FioParseError,
    document_tuples,
    job_entries,
    load_fio_document,
)
from luksbench.formats.layout import REP_NAME, Workload, cpu_rep_path, fio_rep_path
from luksbench.formats.manifest import (
    CELL_ORDER,
    COUNTERBALANCE,
    PAIRING,
    SESSIONS_DIR,
    new_session_path,
    read_manifest,
    result_sessions,
    run_times,
    write_manifest,
)
from luksbench.formats.plan import plan_changes
from luksbench.formats.sidecar import cpu_sidecar_document, write_cpu_sidecar
from luksbench.formats.targets import TargetsError, read_targets, read_targets_document
from luksbench.testbox import cephrun, jobs, probes, safety, sysutil
from luksbench.testbox.plan import RANDOM_RW, baseline_first, cell_options, workloads
from luksbench.testbox.stacks import check_files_unchanged, load_state, stack_down, stack_up
from luksbench.testbox.sysutil import TestboxError, log, pid_alive, utc_now


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived while running the matrix."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def raise_on_stop_signals(interrupt) -> dict:
    """Make SIGINT and SIGTERM raise ``interrupt(signum)``; returns the old handlers. A repeated
    signal (the workflow forwards them) is ignored: it must not cut the teardown short."""

    def on_signal(signum, _frame):
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise interrupt(signum)

    return {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}


def order_positions(plan: dict) -> dict[str, int]:
    """Each cell's place in a seeded permutation of the plan's cells (see :func:`stacks_in_order`)."""
    ids = sorted(w.id for w in workloads(plan))
    random.Random(f"{plan['seed']}:stack-order").shuffle(ids)
    return {w: p for p, w in enumerate(ids)}


def stacks_in_order(stacks: list[str], round_no: int, position: int) -> list[str]:
    """The stacks of a cell in round ``round_no``: rounds 1-2, 3-4, ... each run the cell once in
    order (baseline first) and once reversed, so every even count of rounds is balanced. Which comes
    first flips from block to block (AB BA BA AB: a linear drift cancels too) and alternates over
    the cells' ``position`` (:func:`order_positions`): with an odd count half of the cells have the
    extra pair in order and half reversed."""
    block, second = divmod(round_no - 1, 2)
    forward = (position + block) % 2 == second
    return list(stacks) if forward else list(reversed(stacks))


def load_targets(path: Path) -> dict[str, int]:
    """Workload id -> pairs from an adaptive targets file; TestboxError naming a malformed one."""
    try:
        return {w: design[0] for w, design in read_targets(Path(path)).items()}
    except TargetsError as exc:
        raise TestboxError(f"{path}: {exc}") from exc


def cell_repetitions(plan: dict, targets: dict[str, int] | None = None) -> dict[str, int]:
    """Repetitions per cell: the plan's, or a cell's target when larger (adaptive stage 2)."""
    fixed = int(plan["repetitions"])
    return {w.id: max(fixed, int((targets or {}).get(w.id, fixed))) for w in workloads(plan)}


def session_pairs(
    plan: dict,
    targets: dict[str, int] | None,
    existing: dict[tuple[str, int], dict[str, str]],
    session: str | None,
) -> dict[str, list[int]]:
    """The pairs (rep numbers) each cell runs in ``session``, the current stack-up.

    ``existing``: (cell, rep) -> {stack: session that measured it}. A pair measured half in
    another session is never completed here (other devices, keys, preconditioning): the cell gets
    a new pair number. A session holds at most a cell's per-session pairs, all sessions together
    ``sessions`` times that."""
    stacks = set(baseline_first(plan))
    per_session = cell_repetitions(plan, targets)
    sessions = int(plan.get("sessions", 1))
    pairs = {}
    for w in workloads(plan):
        reps = {rep: by for (cell, rep), by in existing.items() if cell == w.id}
        here = sorted(rep for rep, by in reps.items() if set(by.values()) == {session})
        elsewhere = sum(
            set(by) >= stacks and len(set(by.values())) == 1 and session not in by.values()
            for by in reps.values()
        )
        wanted = min(per_session[w.id], sessions * per_session[w.id] - elsewhere)
        free = (r for r in range(1, len(reps) + wanted + 1) if r not in reps)
        pairs[w.id] = sorted(here + [next(free) for _ in range(wanted - len(here))])
    return pairs


def schedule(
    plan: dict, targets: dict[str, int] | None = None, pairs: dict[str, list[int]] | None = None
) -> list[dict]:
    """The whole matrix in run order: one entry per fio run.

    Round k shuffles all cells with ``random.Random(seed + k)`` and runs those that need a k-th
    pair (``pairs``; default 1..n per cell), so the rounds of the fixed design are the same with
    or without targets. The stack order within a pair follows its number."""
    cells = workloads(plan)
    if pairs is None:
        pairs = {w: list(range(1, n + 1)) for w, n in cell_repetitions(plan, targets).items()}
    stacks = baseline_first(plan)
    positions = order_positions(plan)
    runs = []
    # a later session's rounds continue the seeds after the pairs before it: its own cell order
    offset = min((reps[0] for reps in pairs.values() if reps), default=1) - 1
    for k in range(1, max(map(len, pairs.values()), default=0) + 1):
        order = list(cells)
        random.Random(int(plan["seed"]) + offset + k).shuffle(order)
        for w in (w for w in order if len(pairs[w.id]) >= k):
            rep = pairs[w.id][k - 1]
            for pos, stack in enumerate(stacks_in_order(stacks, rep, positions[w.id])):
                runs.append(
                    {"round": k, "rep": rep, "stack": stack, "workload": w, "position_in_cell": pos}
                )
    for i, r in enumerate(runs, 1):
        r["index"] = i
    return runs


def cpu_sidecar(
    before: dict, after: dict, interval_s: float, rapl: dict | None = None, idle: dict | None = None
) -> dict:
    """The rep's sidecar: /proc/stat deltas over the fio run, its RAPL energy (None: absent) and
    the idle sample of its round."""
    return cpu_sidecar_document(probes.cpu_delta(before, after, interval_s), rapl, idle)


def round_idle_sample(outcome: dict, round_: int) -> int:
    """Index in ``outcome["idle_samples"]`` of the idle CPU sample of round ``round_``, taken now
    if the round has none yet (just before its first measured run): one short sample per round
    makes the baseline's error differ from pair to pair, so it averages out over the pairs and
    their interval carries it (one sample per session would shift every pair of the session
    alike); per round costs 2 s a round, beside each run it would cost 2 s a run."""
    samples = outcome["idle_samples"]
    for i, sample in enumerate(samples):
        if sample["round"] == round_:
            return i
    samples.append({"round": round_, **probes.idle_baseline(when=f"before round {round_}")})
    if outcome["cpu_idle_baseline"] is None:  # the session's first: what earlier readers know
        outcome["cpu_idle_baseline"] = samples[-1]
    return len(samples) - 1


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
            f"--clientname={rbd.get('client', 'admin')}",
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
STOP_GRACE_S = 10


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT to fio (it stops its jobs), then SIGKILL to its process group (its own session):
    a killed fio's forked job processes would run on and write its output."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if sig == signal.SIGKILL:  # fio not reaped yet: its pid still names its group
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_GRACE_S)


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
        else:
            fsfile, pid = e.get("device_type") == "fsfile", (e.get("daemon") or {}).get("pid")
            if not safety.is_mounted(e["mountpoint"]):
                what = "filesystem" if fsfile else "FUSE export"
                problems.append(f"{name}: {what} {e['mountpoint']} is not mounted")
            if not fsfile and not pid_alive(pid):
                problems.append(f"{name}: qemu-storage-daemon pid {pid} is not running")
    if problems:
        raise TestboxError(
            f"stack state is stale; run stack-down and stack-up again ({'; '.join(problems)})"
        )


def _previous(manifest_path: Path) -> tuple[dict, dict, dict]:
    """From every session record, then the manifest: when earlier sessions measured their runs,
    their fixed-rate cells' rates, and the session of every result (path -> session)."""
    sessions = sorted((manifest_path.parent / SESSIONS_DIR).glob("*.json"))
    times, rates, measured_in = {}, {}, {}
    for path in [*sessions, manifest_path]:
        with contextlib.suppress(ValueError):
            manifest = read_manifest(path)
            times.update(run_times(manifest))
            rates.update(manifest.get("fixed_rates") or {})
            measured_in.update(result_sessions(manifest))
    return times, rates, measured_in


def _existing(session: dict) -> dict[tuple[str, int], dict[str, str]]:
    """(cell, rep) -> {stack: its session} of every result already on disk."""
    host_dir, existing = session["raw_host_dir"], {}
    for stack in session["measured_plan"]["stacks"]:
        for w in workloads(session["measured_plan"]):
            folder = fio_rep_path(host_dir.parent, session["host"], stack, w, 0).parent
            for path in folder.glob("rep*.json"):
                if m := REP_NAME.match(path.name):
                    key = str(path.relative_to(host_dir))
                    by_stack = existing.setdefault((w.id, int(m["rep"])), {})
                    by_stack[stack] = session["measured_in"].get(key, "unrecorded")
    return existing


def fixed_rates(plan: dict, session: dict, known: dict, clocksource: str | None) -> dict:
    """The rate of every fixed-rate cell: as ``known`` (an earlier session), else ``rate_pct`` %
    of the slower stack's IOPS in an unthrottled pilot run, so all stacks run at one load."""
    rates = {}
    for w in workloads(session["measured_plan"]):
        cell = cell_options(plan, w)
        pct = cell["rate_pct"]
        if not pct:
            continue
        if w.id in known:
            rates[w.id] = known[w.id]
            continue
        stacks = baseline_first(session["measured_plan"])
        pilot = {stack: _pilot_iops(plan, session, stack, w, clocksource) for stack in stacks}
        rate = max(1, int(pct / 100 * min(pilot.values())))
        per_job = math.ceil(rate / cell["numjobs"])
        rates[w.id] = {"rate_pct": pct, "rate_iops": rate, "rate_iops_per_job": per_job}
        rates[w.id]["pilot_iops"] = pilot
        log(
            f"luksbench testbox run-fio: fixed-rate cell {w.id}: {rate} IOPS on every stack "
            f"({per_job} per job; {pct:g} % of the slower pilot: {', '.join(f'{s} {v:.0f}' for s, v in pilot.items())})"
        )
    return rates


def _pilot_iops(plan: dict, session: dict, stack: str, w: Workload, clocksource) -> float:
    """IOPS of one unthrottled run of cell ``w`` on ``stack`` (its output is not kept)."""
    with tempfile.TemporaryDirectory(prefix="luksbench-pilot-") as tmp:
        out = Path(tmp) / "pilot.json"
        entry = session["state"]["stacks"][stack]
        argv = fio_argv(plan, entry, stack, w, out, session["io_size"], None, session["devices"])
        argv = _session_form(plan, argv, clocksource, Path(tmp) / "pilot.job")
        proc = subprocess.run(argv, **sysutil.QUIET)
        try:
            if proc.returncode != 0:
                raise ValueError(f"fio exited {proc.returncode}: {proc.stderr.strip()}")
            doc = check_fio_result(out)
        except ValueError as exc:
            raise TestboxError(f"pilot of fixed-rate cell {w.id} on {stack} failed: {exc}") from exc
    return sum(_total(e, "iops") for _, e, _ in job_entries(doc))


def measurement_final(plan: dict, manifest_path: Path, env_path: Path, pilot: bool = False) -> bool:
    """Whether ``manifest_path`` records a complete measurement of this very plan (env.json's plan
    unchanged): then its raw files are final and no workflow step may rewrite them."""
    try:
        manifest, measured = read_manifest(manifest_path), read_env(env_path)["plan"]
        changed = plan_changes(measured, plan)
        # a sequential run is final once its last look stopped every cell
        if (plan.get("adaptive") or {}).get("mode") == "sequential" and not pilot:
            changed = (
                changed or not read_targets_document(manifest_path.parent / "targets.json")["done"]
            )
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    stacks = {*manifest.get("stacks", []), *(manifest.get("unavailable_stacks") or {})}
    return (
        manifest.get("complete") is True
        and not changed
        and manifest.get("cells") == [w.id for w in workloads(plan)]
        and manifest.get("repetitions") == plan["repetitions"]
        and manifest.get("sessions", 1) == (1 if pilot else plan.get("sessions", 1))
        and stacks == set(plan["stacks"])
        and (pilot or manifest.get("adaptive") == plan.get("adaptive"))
    )


def run_fio(
    plan: dict,
    state_path: Path,
    raw_host_dir: Path,
    manifest_path: Path,
    describe_path: Path | None = None,
    targets_path: Path | None = None,
) -> int:
    """Run the matrix, session by session; 0 when every rep exists at the end; Interrupted on
    signals. The manifest is rewritten by every session, which also leaves a write-once copy in
    ``fio/sessions/``; both carry the stack descriptions (``describe_path``)."""
    state_path, manifest_path = Path(state_path), Path(manifest_path)
    describe_path = Path(describe_path or state_path.with_name("stacks.json"))
    while True:
        session = _open_session(plan, state_path, Path(raw_host_dir), manifest_path, targets_path)
        session["stack_descriptions"] = (
            json.loads(describe_path.read_text()) if describe_path.exists() else None
        )
        outcome: dict = {"started": utc_now(), "done": [], "failed": [], "interrupted": None}
        outcome.update(cpu_idle_baseline=None, idle_samples=[], clocksource=None, fixed_rates={})
        session["more"] = True  # until shown otherwise: an error here leaves the run incomplete
        try:
            _measure(plan, session, outcome)
            session["more"] = not outcome["failed"] and _another_session(session, outcome)
        finally:  # also after an error: the manifest says what this session measured
            _write_manifest(plan, session, outcome)
        if outcome["interrupted"] is not None:
            raise outcome["interrupted"]
        if outcome["failed"]:
            failed = outcome["failed"]
            log(f"luksbench testbox run-fio: {len(failed)} fio run(s) failed: {', '.join(failed)}")
            return 1
        if not session["more"]:
            break
        _restack(plan, state_path, describe_path)
    log(f"luksbench testbox run-fio: done; manifest {manifest_path}")
    return 0


def _another_session(session: dict, outcome: dict) -> bool:
    """Whether a fresh stack-up would have pairs to measure (the run's sessions are not done)."""
    session["measured_in"].update({r["path"]: r["session"] for r in outcome["done"]})
    pairs = session_pairs(session["measured_plan"], session["targets"], _existing(session), None)
    return any(pairs.values())


def _restack(plan: dict, state_path: Path, describe_path: Path) -> None:
    """Tear every stack down (checked clean) and build them afresh for the next session."""
    log("luksbench testbox run-fio: session done; tearing down and building the stacks afresh")
    record = stack_down(state_path, keep_lock=True)
    if not record["ok"]:
        raise TestboxError(f"teardown between sessions failed: {record['errors'] or record}")
    stack_up(plan, state_path, describe_path)


def _live_state(plan: dict, state_path: Path) -> dict:
    """STATE of the stacks this plan's run measures, checked to be up."""
    state = load_state(state_path)
    if state["run"] != plan["run"] or set(state["stacks"]) != set(plan["stacks"]):
        raise TestboxError(
            f"{state_path} is for run {state['run']!r} with stacks {sorted(state['stacks'])}, "
            f"but the plan is run {plan['run']!r} with stacks {sorted(plan['stacks'])}"
        )
    check_state_live(state)
    check_files_unchanged(state, "run fio")
    if fleet_clients(plan):
        check_servers(fleet_clients(plan))
    return state


def _open_session(
    plan: dict, state_path: Path, raw_host_dir: Path, manifest_path: Path, targets_path
) -> dict:
    """Everything a session measures: live stacks, where results go, the schedule."""
    state = _live_state(plan, state_path)
    raw_host_dir = raw_host_dir.resolve()
    host = raw_host_dir.name
    if host != plan["host"]:
        log(
            f"luksbench testbox run-fio: warning: host dir {host!r} differs from plan host {plan['host']!r}"
        )
    targets = load_targets(Path(targets_path)) if targets_path is not None else None
    if unknown := sorted(set(targets or {}) - {w.id for w in workloads(plan)}):
        log(f"luksbench testbox run-fio: warning: targets for cells not in the plan: {unknown}")
    # Optional stacks that could not be built here (stack-up recorded why) are not measured.
    unavailable = {n: e["unavailable"] for n, e in state["stacks"].items() if e.get("unavailable")}
    for name, why in unavailable.items():
        log(f"luksbench testbox run-fio: stack {name} unavailable here, not measured: {why}")
    measured_plan = {
        **plan,
        "stacks": {n: s for n, s in plan["stacks"].items() if n not in unavailable},
    }
    if plan.get("adaptive") and targets_path is None:
        measured_plan["sessions"] = 1  # the adaptive pilot: the first session's first pairs
    session = {
        "state": state,
        "id": state.get("session") or state["created"],
        "raw_host_dir": raw_host_dir,
        "manifest_path": manifest_path,
        "host": host,
        "io_size": int(state.get("io_size_bytes") or 0),
        "targets_path": targets_path,
        "targets": targets,
        "unavailable": unavailable,
        "measured_plan": measured_plan,
        "reps": cell_repetitions(plan, targets),
        "devices": {n: state["stacks"][n].get("device") for n in measured_plan["stacks"]},
    }
    session["previous"], session["previous_rates"], session["measured_in"] = _previous(
        manifest_path
    )
    pairs = session_pairs(measured_plan, targets, _existing(session), session["id"])
    session["runs"] = schedule(measured_plan, targets, pairs)
    _announce(plan, session, targets)
    return session


def run_seconds(plan: dict) -> float:
    """How long one fio run measures (runtime and ramp), without its start-up."""
    return float(plan["fio"]["runtime_s"]) + float(plan["fio"]["ramp_time_s"])


def _announce(plan: dict, session: dict, targets: dict | None) -> None:
    reps = session["reps"]
    rep_text = (
        f"{plan['repetitions']} reps"
        if len(set(reps.values())) <= 1 and not targets
        else f"{min(reps.values())}-{max(reps.values())} reps per cell from {session['targets_path']}"
    )
    log(
        f"luksbench testbox run-fio: {len(session['runs'])} fio runs ({len(workloads(plan))} cells x "
        f"{len(session['measured_plan']['stacks'])} stacks x {rep_text}), "
        f"backend {session['state']['backend']}; at least "
        f"{sysutil.duration(len(session['runs']) * run_seconds(plan))} of fio"
    )


def _measure(plan: dict, session: dict, outcome: dict) -> None:
    """Every scheduled run into ``outcome``, under handlers that stop fio on SIGINT/SIGTERM."""
    old_handlers = raise_on_stop_signals(Interrupted)
    try:
        # fio servers pick their own clock; here one probe per session instead of one per fio start.
        if not fleet_clients(plan):
            outcome["clocksource"] = fio_clocksource()
        outcome["fixed_rates"] = fixed_rates(
            plan, session, session["previous_rates"], outcome["clocksource"]
        )
        session["progress"] = sysutil.Progress(len(session["runs"]), run_seconds(plan))
        for r in session["runs"]:
            _scheduled_run(plan, session, r, outcome)
    except Interrupted as exc:
        outcome["interrupted"] = exc
        log(
            f"luksbench testbox run-fio: interrupted by {exc}; fio stopped, no partial rep kept; devices stay up (run stack-down)"
        )
    finally:
        if outcome["interrupted"] is None:
            for s, h in old_handlers.items():
                signal.signal(s, h)


def _scheduled_run(plan: dict, session: dict, r: dict, outcome: dict) -> None:
    """One entry of the schedule: skipped when its result exists, else measured; recorded."""
    w: Workload = r["workload"]
    stack, raw_host_dir = r["stack"], session["raw_host_dir"]
    path = fio_rep_path(raw_host_dir.parent, session["host"], stack, w, r["rep"])
    rec = {
        **{k: r[k] for k in ("index", "round", "rep", "stack")},
        "workload": w.id,
        "session": session["id"],
        "position_in_cell": r["position_in_cell"],
        "path": str(path.relative_to(raw_host_dir)),
        "cpu_path": str(cpu_rep_path(path).relative_to(raw_host_dir)),
        "started": None,
        "ended": None,
        "skipped_existing": False,
        "status": None,
    }
    total = len(session["runs"])
    tag = f"[{r['index']:>{len(str(total))}}/{total}] {stack} {w.id} rep{r['rep']}"
    if path.exists():
        started, ended = session["previous"].get((stack, w.id, r["rep"]), (None, None))
        rec.update(started=started, ended=ended, skipped_existing=True, status="skipped_existing")
        rec["session"] = session["measured_in"].get(rec["path"], "unrecorded")
        outcome["done"].append(rec)
        log(f"{tag}: exists, skipped ({session['progress'].step(None)})")
        return
    state = session["state"]
    check_state_live(state)
    check_free_space(path.parent)
    rec["cpu_idle_sample"] = round_idle_sample(outcome, r["round"])
    rec["started"], t0 = utc_now(), time.monotonic()
    rate = outcome["fixed_rates"].get(w.id, {}).get("rate_iops")
    entry, clock = state["stacks"][stack], outcome["clocksource"]
    setup = jobs.job_setup(cell_options(plan, w), session["devices"])
    rec["fio_jobs"] = {k: v for k, v in setup.items() if k not in ("args", "numa_nodes")}
    rec["fio_jobs"]["numa_node"] = setup["numa_nodes"][stack]
    idle = outcome["idle_samples"][rec["cpu_idle_sample"]]
    ok, msg = _one_run(
        plan, entry, stack, w, path, session["io_size"], clock, rate, session["devices"], idle
    )
    rec["ended"] = utc_now()
    rec["status"] = "ok" if ok else "failed"
    outcome["done"].append(rec)
    log(f"{tag}: {msg}; {session['progress'].step(time.monotonic() - t0)}")
    if not ok:
        outcome["failed"].append(f"{stack} {w.id} rep{r['rep']}")
        # A full disk fails every later run too: stop now, keeping what was measured.
        check_free_space(path.parent)


def _manifest(plan: dict, session: dict, outcome: dict) -> dict:
    """The session's record (:mod:`luksbench.formats.manifest`)."""
    state, interrupted = session["state"], outcome["interrupted"]
    return {
        "run": plan["run"],
        "host": session["host"],
        "seed": plan["seed"],
        "repetitions": plan["repetitions"],
        "sessions": int(session["measured_plan"].get("sessions", 1)),
        "session": session["id"],
        "cell_repetitions": session["reps"],
        "targets": str(session["targets_path"]) if session["targets_path"] is not None else None,
        "adaptive": plan.get("adaptive"),
        "backend": state["backend"],
        "backend_reason": state["backend_reason"],
        "baseline": plan["baseline"],
        "fleet": plan.get("fleet"),
        "stacks": baseline_first(session["measured_plan"]),
        "unavailable_stacks": session["unavailable"],
        "cells": [w.id for w in workloads(plan)],
        "pairing": PAIRING,
        "counterbalance": COUNTERBALANCE,
        "cell_order": CELL_ORDER,
        "io_size_bytes": session["io_size"],
        "cpu_idle_baseline": outcome["cpu_idle_baseline"],
        "cpu_idle_samples": outcome["idle_samples"],
        "fixed_rates": outcome["fixed_rates"],
        "fio_clocksource": outcome["clocksource"],
        "fio": plan["fio"],
        "started": outcome["started"],
        "ended": utc_now(),
        "complete": interrupted is None
        and not outcome["failed"]
        and len(outcome["done"]) == len(session["runs"])
        and not session["more"],
        "interrupted": str(interrupted) if interrupted else None,
        "failed": outcome["failed"],
        "stack_descriptions": session["stack_descriptions"],
        "runs": outcome["done"],
    }


def _write_manifest(plan: dict, session: dict, outcome: dict) -> None:
    """This session's write-once copy, and the manifest only when the measurement is complete:
    the workflow takes an existing manifest as done, so an interrupted or failed session (also one
    killed after Snakemake removed its outputs) leaves none; its record in ``fio/sessions/`` keeps
    what it measured. Failing to write is an error only when the session itself went well."""
    manifest_path = session["manifest_path"]
    manifest = _manifest(plan, session, outcome)
    try:
        session_record = new_session_path(manifest_path.parent / SESSIONS_DIR, manifest["started"])
        write_manifest(session_record, manifest, mode=0o444)
        if manifest["complete"]:
            write_manifest(manifest_path, manifest)
        else:
            manifest_path.unlink(missing_ok=True)
    except OSError as exc:
        log(f"luksbench testbox run-fio: could not write the manifest {manifest_path}: {exc}")
        if outcome["interrupted"] is None and not outcome["failed"]:
            raise TestboxError(f"could not write the manifest {manifest_path}: {exc}") from exc


# Room a fio run needs: its json+ result and CPU sidecar (~10-60 KiB), and the manifest.
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


def _one_run(
    plan: dict,
    entry: dict,
    stack: str,
    w: Workload,
    path: Path,
    io_size: int,
    clocksource: str | None = None,
    rate_iops: int | None = None,
    devices: dict | None = None,
    idle: dict | None = None,
) -> tuple[bool, str]:
    """One fio run into ``path`` and its cpu sidecar (with ``idle``, the idle sample it is netted
    with); returns (ok, progress message)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)  # left by a SIGKILLed earlier attempt
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    proc = None
    try:
        argv = fio_argv(plan, entry, stack, w, tmp, io_size, rate_iops, devices)
        # The job file (fleet mode) is matched by the stale-file glob above.
        argv = _session_form(plan, argv, clocksource, tmp.with_suffix(".job.tmp"))
        ceph_run = cephrun.prepare_entry_run(entry, path, plan["fio"])  # None: not a Ceph arm
        before, rapl_before, t0 = probes.read_proc_stat(), probes.read_rapl(), time.monotonic()
        # Own session: a terminal Ctrl-C reaches only us; we stop fio ourselves and discard output.
        # A stop signal waits until Popen returns (else fio would run on unknown and write its
        # output after the cleanup); fio itself starts with the signals unblocked.
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
                env=ceph_run["env"] if ceph_run else None,
                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, unblocked),
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        _, err = cephrun.communicate(proc, ceph_run)
        t1, after, rapl_after = time.monotonic(), probes.read_proc_stat(), probes.read_rapl()
        for line in err.strip().splitlines():
            log(f"    fio: {line}")
        if proc.returncode != 0:
            return (
                False,
                f"FAILED: fio exited {proc.returncode} (cell {stack} {w.id}); no rep file written",
            )
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        try:
            doc = check_fio_result(tmp)
        except ValueError as exc:
            return False, f"FAILED: {exc}; no rep file written"
        sidecar = cpu_sidecar(
            before, after, t1 - t0, probes.rapl_delta(rapl_before, rapl_after, t1 - t0), idle
        )
        if ceph_run:
            sidecar["ceph"] = cephrun.finish_entry_run(ceph_run)
        # The sidecar goes first: the rep file's appearance is the commit point.
        write_cpu_sidecar(cpu_rep_path(path), sidecar)
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
            proc.stderr.close()
        raise
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".job.tmp").unlink(missing_ok=True)
