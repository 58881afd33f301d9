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
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from luksbench.formats.envdoc import read_env
from luksbench.formats.fio import job_entries
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
from luksbench.formats.remeasure import remeasure_pending
from luksbench.formats.sidecar import write_cpu_sidecar
from luksbench.formats.targets import read_targets_document
from luksbench.testbox import cephrun, jobs, probes, safety, sysutil
from luksbench.testbox.fiocommand import (  # fio_argv ... steadiest_clock: callers import them here
    _CLOCKSOURCES,  # noqa: F401
    _session_form,
    _summary,
    _total,
    check_fio_result,
    check_servers,
    client_argv,  # noqa: F401
    fio_argv,
    fio_clocksource,
    fleet_clients,
    steadiest_clock,  # noqa: F401
)
from luksbench.testbox.planbuild import baseline_first, cell_options, workloads
from luksbench.testbox.schedule import (  # stacks_in_order ...: callers import them here
    cell_repetitions,
    cpu_sidecar,
    load_targets,
    round_idle_sample,
    round_session,
    schedule,
    session_pairs,
    stacks_in_order,  # noqa: F401
)
from luksbench.testbox.stacks import check_files_unchanged, load_state, stack_down, stack_up
from luksbench.testbox.stopping import (
    Interrupted,
    raise_on_stop_signals,
    run_fio_or_stop,
    start_in_own_session,
    stop_fio,
)
from luksbench.testbox.sysutil import TestboxError, check_free_space, log, pid_alive, utc_now


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
        proc = run_fio_or_stop(argv)
        try:
            if proc.returncode != 0:
                raise ValueError(f"fio exited {proc.returncode}: {proc.stderr.strip()}")
            doc = check_fio_result(out)
        except ValueError as exc:
            raise TestboxError(f"pilot of fixed-rate cell {w.id} on {stack} failed: {exc}") from exc
    return sum(_total(e, "iops") for _, e, _ in job_entries(doc))


def measurement_final(plan: dict, manifest_path: Path, env_path: Path, pilot: bool = False) -> bool:
    """Whether ``manifest_path`` records a complete measurement of this very plan (env.json's plan
    unchanged): then its raw files are final and no workflow step may rewrite them. Not while
    flagged pairs are still to be measured again (its re-measure file says so)."""
    try:
        manifest, measured = read_manifest(manifest_path), read_env(env_path)["plan"]
        changed = plan_changes(measured, plan)
        changed = changed or (not pilot and remeasure_pending(Path(manifest_path).parents[1]))
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
        and manifest.get("sessions") == (1 if pilot else plan["sessions"])
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
    one_session: bool = False,
) -> int:
    """Run the matrix, session by session; 0 when every rep exists at the end; Interrupted on
    signals. The manifest is rewritten by every session, which also leaves a write-once copy in
    ``fio/sessions/``; both carry the stack descriptions (``describe_path``). ``one_session``:
    a round of the sequential design over sessions, measured in one fresh stack-up (the live
    one unless it measured already) as the session the round belongs to (:func:`round_session`)."""
    state_path, manifest_path = Path(state_path), Path(manifest_path)
    describe_path = Path(describe_path or state_path.with_name("stacks.json"))
    if one_session and _stack_up_used(state_path, manifest_path):
        _restack(plan, state_path, describe_path)
    while True:
        session = _open_session(
            plan, state_path, Path(raw_host_dir), manifest_path, targets_path, one_session
        )
        session["stack_descriptions"] = (
            json.loads(describe_path.read_text()) if describe_path.exists() else None
        )
        outcome: dict = {"started": utc_now(), "done": [], "failed": [], "interrupted": None}
        outcome.update(cpu_idle_baseline=None, idle_samples=[], clocksource=None, fixed_rates={})
        session["more"] = True  # until shown otherwise: an error here leaves the run incomplete
        try:
            _measure(plan, session, outcome)
            more = not one_session and not outcome["failed"]
            session["more"] = more and _another_session(session, outcome)
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


def _stack_up_used(state_path: Path, manifest_path: Path) -> bool:
    """Whether the live stack-up already measured a round (a session record names it)."""
    state = load_state(state_path)
    live = state.get("session") or state["created"]
    for path in (manifest_path.parent / SESSIONS_DIR).glob("*.json"):
        with contextlib.suppress(ValueError):
            if live and read_manifest(path).get("stack_up") == live:
                return True
    return False


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
    plan: dict,
    state_path: Path,
    raw_host_dir: Path,
    manifest_path: Path,
    targets_path,
    one_session: bool = False,
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
    session["stack_up"] = session["id"]
    if one_session:
        session["id"] = round_session(measured_plan, targets, _existing(session))
    pairs = session_pairs(measured_plan, targets, _existing(session), session["id"], one_session)
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
        "sessions": int(session["measured_plan"]["sessions"]),
        "session": session["id"],
        "stack_up": session["stack_up"],
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
        # Stopped by us on a stop signal, its output discarded.
        proc = start_in_own_session(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=ceph_run["env"] if ceph_run else None,
        )
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
            stop_fio(proc)
            proc.stderr.close()
        raise
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".job.tmp").unlink(missing_ok=True)
