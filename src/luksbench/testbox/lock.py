"""One benchmark at a time per test box: two runs at once would measure each other, or destroy
each other's stacks. Every step that loads the machine takes the lock; stack-down gives it back.

The holder is a run's stack state file in a session (the workflow process, ``LUKSBENCH_SESSION``,
or a step run by hand). It holds the lock while that session lives or its stacks are up, so a
crashed run keeps the box until its stacks are torn down; only the holding session gives it back.
All access happens under ``flock`` on a guard file that is never removed, so two processes never
both win, even when taking over a stale lock. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path

from luksbench.testbox.sysutil import TestboxError, log, read_text, utc_now, write_json_atomic

LOCK_DIR = Path("/run/luksbench")
LOCK_NAME = "measure.lock"
GUARD_NAME = ".measure.lock.guard"
SESSION_ENV = "LUKSBENCH_SESSION"


class Locked(TestboxError):
    """Another run holds the test box; the message names it."""


def started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    stat = read_text(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split() if stat else []
    return fields[19] if len(fields) > 19 else None


def current_session() -> dict:
    value = os.environ.get(SESSION_ENV, "")
    pid = int(value) if value.isdigit() else os.getpid()
    return {"pid": pid, "started": started(pid)}


def _alive(session) -> bool:
    if not isinstance(session, dict) or not isinstance(session.get("pid"), int):
        return False
    started_at = started(session["pid"])
    return started_at is not None and started_at == session.get("started")


def session_alive(session) -> bool:
    """Whether the session (``{"pid", "started"}``) is still the same living process."""
    return _alive(session)


def holder(lock_dir: Path = LOCK_DIR) -> dict | None:
    """Who holds the test box (the lock file's entry), or None."""
    if not (lock_dir / GUARD_NAME).exists():
        return _read(lock_dir / LOCK_NAME)
    with _guarded(lock_dir) as lock:
        return _read(lock)


def _holder(plan: dict | None, state_path: Path, session: dict) -> dict:
    return {
        "run": (plan or {}).get("run"),
        "host": (plan or {}).get("host"),
        "state": str(Path(state_path).resolve()),
        "scratch_dir": (plan or {}).get("scratch_dir"),
        "session": session,
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "since": utc_now(),
    }


def _read(lock: Path) -> dict | None:
    try:
        holder = json.loads(lock.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and "state" in holder else None


@contextlib.contextmanager
def _guarded(lock_dir: Path):
    """The lock file, with every other process kept out of it until the block ends."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    # Read-only is enough for flock: a user who may not write here can still see who holds it.
    guard = os.open(lock_dir / GUARD_NAME, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when the file is closed
        yield lock_dir / LOCK_NAME
    finally:
        os.close(guard)


def _busy(current: dict, holder: dict) -> bool:
    """Whether ``current`` keeps ``holder`` out: another run that is alive or has stacks up, or
    this run in another session that is still alive."""
    alive = _alive(current.get("session"))
    if current["state"] == holder["state"]:
        return alive and current.get("session") != holder["session"]
    return alive or Path(current["state"]).exists()


def _busy_message(current: dict, lock: Path) -> str:
    state = current["state"]
    doing = (
        f"has stacks up (state {state})"
        if Path(state).exists()
        else f"is measuring (process {(current.get('session') or {}).get('pid')})"
    )
    return (
        f"the test box is busy: run {current.get('run')!r} (host {current.get('host')!r}) "
        f"started from {current.get('cwd')} at {current.get('since')} {doing}. Wait for it to "
        f"finish, or if it is gone, tear its stacks down with `luksbench testbox stack-down "
        f"--state {state}`. Lock: {lock}"
    )


def acquire(
    plan: dict | None,
    state_path: Path | None = None,
    lock_dir: Path = LOCK_DIR,
    session: dict | None = None,
) -> Path:
    """Take (or keep) the test box for this run, or raise :class:`Locked` naming the holder."""
    if state_path is None:
        state_path = Path(plan["scratch_dir"]) / "state.json"
    holder = _holder(plan, state_path, session or current_session())
    with _guarded(lock_dir) as lock:
        current = _read(lock)
        if current is not None and _busy(current, holder):
            raise Locked(_busy_message(current, lock))
        if current is not None and current["state"] != holder["state"]:
            log(f"luksbench testbox: taking over a stale lock {lock} (holder: {current})")
        write_json_atomic(lock, holder)
    return lock


def release(state_path: Path, lock_dir: Path = LOCK_DIR, session: dict | None = None) -> bool:
    """Give the test box back if this state's run holds it in this session or in one that has
    ended (the same run started again elsewhere must not free it); True when removed."""
    if not (lock_dir / GUARD_NAME).exists():
        return False
    session = session or current_session()
    with _guarded(lock_dir) as lock:
        current = _read(lock)
        if current is None or current["state"] != str(Path(state_path).resolve()):
            return False
        if current.get("session") != session and _alive(current.get("session")):
            return False
        lock.unlink(missing_ok=True)
        return True
