"""One benchmark at a time per test box.

Two runs measuring at once on one machine would measure each other (shared CPU, memory bandwidth,
page cache, disks), and two workflows sharing a scratch directory or a device would destroy each
other's stacks. stack-up takes the machine's measurement lock and stack-down gives it back; a
second stack-up meanwhile is refused with a message naming the holder.

The lock is held while the holder's stack state file exists (its devices are up), so a crashed run
keeps the box locked until its stacks are torn down, which is exactly when it is safe to go on.
Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from luksbench.testbox.sysutil import TestboxError, log, utc_now

LOCK_DIR = Path("/run/luksbench")
LOCK_NAME = "measure.lock"


class Locked(TestboxError):
    """Another run holds the test box; the message names it."""


def _holder(plan: dict, state_path: Path) -> dict:
    return {
        "run": plan["run"],
        "host": plan["host"],
        "state": str(Path(state_path).resolve()),
        "scratch_dir": plan["scratch_dir"],
        "pid": os.getpid(),
        "parent_pid": os.getppid(),
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


def acquire(plan: dict, state_path: Path, lock_dir: Path = LOCK_DIR) -> Path:
    """Take the test box for this run, or raise :class:`Locked` naming the run that holds it."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_dir / LOCK_NAME
    holder = _holder(plan, state_path)
    text = json.dumps(holder, indent=2) + "\n"
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        current = _read(lock)
        if current is not None and Path(current["state"]).exists():
            raise Locked(
                f"the test box is busy: run {current.get('run')!r} (host {current.get('host')!r}) "
                f"started from {current.get('cwd')} at {current.get('since')} has stacks up "
                f"(state {current['state']}). Wait for it to finish, or if it is gone, tear its "
                f"stacks down with `luksbench testbox stack-down --state {current['state']}`. "
                f"Lock: {lock}"
            ) from None
        # The holder's stacks are down (or the lock is unreadable): it is stale, take it over.
        log(f"luksbench testbox: taking over a stale lock {lock} (holder: {current})")
        tmp = lock.with_name(f".{LOCK_NAME}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, lock)
        return lock
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return lock


def release(state_path: Path, lock_dir: Path = LOCK_DIR) -> bool:
    """Give the test box back if this state's run holds it; True when a lock was removed."""
    lock = lock_dir / LOCK_NAME
    current = _read(lock)
    if current is not None and current["state"] == str(Path(state_path).resolve()):
        lock.unlink(missing_ok=True)
        return True
    return False
