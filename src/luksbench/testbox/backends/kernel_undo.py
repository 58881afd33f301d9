"""Teardown of what the kernel backend built: every object of the undo log removed, newest first,
and what of it is left. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

from luksbench.testbox import safety
from luksbench.testbox.sysutil import QUIET


def _retry(argv: list[str], tries: int = 10) -> subprocess.CompletedProcess:
    """Teardown commands are retried: udev or a closing process may hold the device briefly."""
    proc = None
    for attempt in range(tries):
        proc = subprocess.run(argv, timeout=120, **QUIET)
        if proc.returncode == 0:
            return proc
        time.sleep(0.2 * (attempt + 1))
    return proc


def _undo_run(argv: list[str], actions: list[str], errors: list[str], tries=10, done=None) -> None:
    proc = _retry(argv, tries)
    if proc.returncode == 0:
        actions.append(done or " ".join(argv))
    else:
        errors.append(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def undo(objects: list[dict], actions: list[str], errors: list[str]) -> None:
    """Remove every recorded object, newest first; objects already gone are fine."""
    for obj in reversed(objects):
        kind, path = obj["type"], obj.get("path")
        try:
            if kind == "mount" and safety.is_mounted(path):
                umounts = (["umount", path], ["umount", "-l", path])  # lazy when busy
                if any(_retry(argv, 5).returncode == 0 for argv in umounts):
                    actions.append(f"umount {path}")
                else:
                    errors.append(f"umount {path} failed")
            elif kind in ("file", "backing_file"):
                if os.path.lexists(path) and not safety.is_mounted(path):
                    os.unlink(path)
                    actions.append(f"removed {path}")
            elif kind == "dir" and os.path.isdir(path) and not safety.is_mounted(path):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
                    actions.append(f"removed directory {path}")
            elif kind in ("crypt", "dm"):
                _undo_mapping(kind, obj["name"], actions, errors)
            elif kind == "md":
                dev = obj["device"]
                if os.path.exists(f"/sys/block/{os.path.basename(dev)}/md"):
                    _undo_run(["mdadm", "--stop", dev], actions, errors)
                for member in obj.get("members") or []:
                    zero = ["mdadm", "--zero-superblock", member]
                    if os.path.exists(member) and _retry(zero, 1).returncode == 0:
                        actions.append(" ".join(zero))
            elif kind == "wipe" and os.path.exists(obj["device"]):
                done = f"wipefs --all {obj['device']} (our signatures)"
                _undo_run(["wipefs", "--all", "--quiet", obj["device"]], actions, errors, 1, done)
            elif kind == "loop":
                for loop in safety.loop_devices_backed_by([obj["backing"]]):
                    _undo_run(["losetup", "-d", loop], actions, errors, 5)
        except Exception as exc:  # keep going: tear down as much as possible
            errors.append(f"{kind} {obj}: {exc}")


def _undo_mapping(kind: str, name: str, actions: list[str], errors: list[str]) -> None:
    """Close a crypt mapping or remove a dm device of ours (never one without our prefix)."""
    if not name.startswith(safety.MAPPER_PREFIX) or not os.path.exists(f"/dev/mapper/{name}"):
        return
    close = (
        ["cryptsetup", "close", name] if kind == "crypt" else ["dmsetup", "remove", "--retry", name]
    )
    proc = _retry(close)
    if proc.returncode == 0 or not os.path.exists(f"/dev/mapper/{name}"):
        actions.append(f"{close[0]} {close[1]} {name}")
    else:
        errors.append(f"{' '.join(close)} failed: {proc.stderr.strip()}")


def leftovers(objects: list[dict]) -> dict[str, list[str]]:
    """What of the recorded objects still exists (empty lists: all gone)."""

    def recorded(key: str, *types: str) -> list[str]:
        return [o[key] for o in objects if o["type"] in types]

    mounts = set(safety.mountpoints())
    mapped = [n for n in recorded("name", "crypt", "dm") if os.path.exists(f"/dev/mapper/{n}")]
    arrays = recorded("device", "md")
    return {
        "mounts": [p for p in recorded("path", "mount") if p in mounts],
        "mapper_devices": mapped,
        "md_devices": [d for d in arrays if os.path.exists(f"/sys/block/{os.path.basename(d)}/md")],
        "loop_devices": safety.loop_devices_backed_by(recorded("backing", "loop")),
        "files": [p for p in recorded("path", "file", "backing_file") if os.path.lexists(p)],
    }
