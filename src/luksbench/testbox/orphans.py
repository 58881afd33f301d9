"""A workflow killed outright (``kill -9``, the OOM killer) runs no error handler: its test-box
steps would live on as orphans, its stacks stay up and the test box stays locked. Two halves make
the same command resume cleanly: every test-box step stops itself once the workflow session it
belongs to is gone (:func:`watch_session`), and the next start of the run tears down what a dead
session left behind (:func:`recover`). A workflow that stops on an error or a signal stops, once
its stacks are down, whatever else it started that still runs (:func:`stop_session_leftovers`).
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

from luksbench.testbox import lock
from luksbench.testbox.stacks import stack_down
from luksbench.testbox.stopping import background_thread
from luksbench.testbox.sysutil import (
    ancestors,
    cmdline,
    log,
    pid_alive,
    stop_process,
    wait_gone,
)

# How long an orphaned step may take to undo its own work after it noticed its session ended.
ORPHAN_GRACE_S = 60.0


def watch_session(interval_s: float = 0.5) -> threading.Thread | None:
    """Send this process SIGTERM once the workflow session (``LUKSBENCH_SESSION``) that started it
    has ended, so the step unwinds as after Ctrl-C (stack-up undoes what it built, run-fio stops
    fio and keeps no partial result). A step run by hand (no session of its own) is not watched."""
    session = lock.current_session()
    if session["pid"] == os.getpid() or session["started"] is None:
        return None

    def watch() -> None:
        while lock.session_alive(session):
            time.sleep(interval_s)
        log(f"luksbench testbox: the workflow (process {session['pid']}) is gone; stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    return background_thread(watch, "luksbench-session-watch")


def abandoned(state_path: Path, lock_dir: Path = lock.LOCK_DIR) -> dict | None:
    """The lock entry of a run whose stacks (``state_path``) are up but whose session has ended
    (``{}`` when no run holds the test box); None when the stacks are down or a live session (of
    this run or another) holds the box."""
    if not Path(state_path).exists():
        return None
    holder = lock.holder(lock_dir)
    if holder is None:
        return {}
    if holder["state"] != str(Path(state_path).resolve()):
        return None
    # A live session, even this one (a job's own snakemake), still owns its stacks.
    return None if lock.session_alive(holder.get("session")) else holder


def session_processes(session_pid: int, started_after: int | None = None) -> list[int]:
    """Every process started under the workflow ``session_pid`` (its environment names the
    session), but this one and the processes it runs under; with ``started_after``, only those
    started later (clock ticks since boot), so a process of an earlier holder of a reused pid
    is never among them."""
    marker = f"{lock.SESSION_ENV}={session_pid}".encode()
    spared = {os.getpid(), *ancestors(os.getpid())}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared:
            continue
        began = lock.started(int(entry))
        try:  # an environment is bytes: a value need not be text
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker not in environ or began is None or lock.started(int(entry)) != began:
            continue  # not the session's, or gone (its pid perhaps reused) while being read
        if (started_after is None or int(began) >= started_after) and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def session_steps(session_pid: int) -> list[int]:
    """Test-box steps (``luksbench ... testbox``) still running for the workflow ``session_pid``."""
    return [pid for pid in session_processes(session_pid) if "testbox" in cmdline(pid)]


def stop_session_steps(session_pid: int, grace_s: float = ORPHAN_GRACE_S) -> list[int]:
    """Stop the test-box steps of the workflow ``session_pid`` (SIGTERM: they unwind as after
    Ctrl-C; SIGKILL after ``grace_s``), e.g. a run-fio whose job shell was killed, before its
    stacks are torn down under it. The pids stopped."""
    steps = session_steps(session_pid)
    _stop(steps, grace_s)
    for pid in steps:
        log(f"  stopped the test-box step {pid} of workflow process {session_pid}")
    return steps


def stop_session_leftovers(grace_s: float = ORPHAN_GRACE_S) -> list[int]:
    """Once its stacks are down, stop whatever else this workflow process started that still
    runs (SIGTERM, SIGKILL after ``grace_s``): a stop signal ends a job's shell at once while the
    job's own snakemake is still winding up its failed job. Only when this process is the
    session: a session inherited from another invocation is not this one's to stop. The pids
    stopped, each logged with its command line."""
    session = lock.current_session()
    if session["pid"] != os.getpid() or session["started"] is None:
        return []
    leftovers = session_processes(session["pid"], started_after=int(session["started"]))
    commands = {pid: " ".join(cmdline(pid)).strip() for pid in leftovers}
    stopped = _stop(leftovers, grace_s)
    for pid in stopped:
        log(f"  stopped process {pid} the workflow left running: {commands[pid][:200]}")
    return stopped


def _stop(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM to every pid, then SIGKILL to those still running ``grace_s`` later (one deadline
    for all: a process that ends only when its writers do, like a log's tee, costs no grace of
    its own). The pids that were still there to stop."""
    signalled = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)
    deadline = time.monotonic() + grace_s
    for pid in signalled:
        if not wait_gone(pid, max(0.0, deadline - time.monotonic())):
            stop_process(pid, (signal.SIGKILL,))
    return signalled


def recover(
    state_path: Path, lock_dir: Path = lock.LOCK_DIR, grace_s: float = ORPHAN_GRACE_S
) -> dict | None:
    """Tear down the stacks of ``state_path`` when the session that built them has ended: its
    orphaned test-box steps are given ``grace_s`` to stop (then stopped), then stack-down removes
    everything STATE records and releases the lock. The stack-down record, or None when there
    was nothing to recover."""
    holder = abandoned(Path(state_path), lock_dir)
    if holder is None:
        return None
    session_pid = (holder.get("session") or {}).get("pid")
    log(
        f"luksbench testbox: the run that built the stacks of {state_path} ended without tearing "
        f"them down (workflow process {session_pid} is gone); tearing them down now"
    )
    if isinstance(session_pid, int):
        stop_session_steps(session_pid, grace_s)
    return stack_down(Path(state_path))


def snakemakes_here(workdir: str) -> list[int]:
    """Other snakemake processes whose working directory is ``workdir``."""
    here, found = os.path.realpath(workdir), []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]
            named = any("snakemake" in os.path.basename(os.fsdecode(a)) for a in argv)
            if named and os.path.realpath(f"/proc/{pid}/cwd") == here:
                found.append(pid)
    return found
