"""Guards before the test box touches anything: names, paths, and what is already in use.

Minimal for now (a later issue extends it to raw disks): every backing file lives directly in
the plan's scratch_dir, every loop device / mapper name / FUSE mountpoint we create is named after
the run and stack, and we refuse to start when one of those names or files is already in use.

Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAPPER_PREFIX = "luksbench-"


class SafetyError(RuntimeError):
    """The test box refuses to go on; the message says what was found and where."""


def check_name(value: str, what: str) -> str:
    """Run, host and stack names end up in device-mapper names and paths: keep them plain."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise SafetyError(
            f"{what} {value!r} must be 1-64 characters of letters, digits, '_', '.', '-' "
            "and start with a letter or digit"
        )
    return value


def mapper_name(run: str, stack: str) -> str:
    return f"{MAPPER_PREFIX}{check_name(run, 'run')}-{check_name(stack, 'stack')}"


def check_scratch_dir(scratch_dir: str | Path) -> Path:
    path = Path(scratch_dir)
    if not path.is_absolute():
        raise SafetyError(f"scratch_dir must be an absolute path, not {str(scratch_dir)!r}")
    path = Path(os.path.normpath(path))
    if path == Path("/") or len(path.parts) < 3:
        raise SafetyError(f"scratch_dir {str(path)!r} is too close to / to hold scratch files")
    if path.exists() and not path.is_dir():
        raise SafetyError(f"scratch_dir {str(path)!r} exists and is not a directory")
    return path


def check_inside(path: str | Path, scratch_dir: str | Path) -> Path:
    """``path`` must be a direct child of ``scratch_dir`` (after resolving symlinks)."""
    p = Path(path)
    parent = Path(scratch_dir).resolve()
    if p.parent.resolve() != parent or p.name in ("", ".", ".."):
        raise SafetyError(f"{p} is not a file directly inside scratch_dir {parent}")
    if p.is_symlink():
        raise SafetyError(f"{p} is a symlink; backing files must be regular files in scratch_dir")
    return parent / p.name


# --- what is in use ------------------------------------------------------------------------------


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mountpoints() -> list[str]:
    """Mount points of this mount namespace, from /proc/self/mountinfo."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    points = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(_unescape_mountinfo(fields[4]))
    return points


def is_mounted(path: str | Path) -> bool:
    return os.path.abspath(path) in mountpoints()


def loop_devices_backed_by(files: list[str | Path]) -> list[str]:
    """Loop devices whose backing file is one of ``files`` (per ``losetup -J -l``)."""
    wanted = {os.path.abspath(f) for f in files}
    try:
        proc = subprocess.run(
            ["losetup", "-J", "-l"], capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    try:
        devices = json.loads(proc.stdout).get("loopdevices", [])
    except json.JSONDecodeError:
        return []
    found = []
    for dev in devices:
        back = (dev.get("back-file") or "").removesuffix(" (deleted)")
        if back in wanted:
            found.append(dev["name"])
    return sorted(found)


def mapper_names_with_prefix(prefix: str) -> list[str]:
    try:
        names = os.listdir("/dev/mapper")
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def processes_holding(path: str | Path) -> list[int]:
    """PIDs with ``path`` open (scans /proc/*/fd; needs root to see other users' processes)."""
    target = os.path.abspath(path)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if link.removesuffix(" (deleted)") == target:
                pids.append(int(entry))
                break
    return pids


def check_free(*, mapper: str | None = None, mountpoint: Path | None = None, backing: Path) -> None:
    """Refuse when a name or file we are about to create is already in use by someone."""
    if mapper is not None and os.path.exists(f"/dev/mapper/{mapper}"):
        raise SafetyError(f"device-mapper name {mapper} is already in use (/dev/mapper/{mapper})")
    if mountpoint is not None and is_mounted(mountpoint):
        raise SafetyError(
            f"{mountpoint} is already a mountpoint (stale FUSE export? run stack-down)"
        )
    loops = loop_devices_backed_by([backing])
    if loops:
        raise SafetyError(f"{backing} is already attached to {', '.join(loops)} (run stack-down)")
    holders = processes_holding(backing)
    if holders:
        raise SafetyError(f"{backing} is open by pid(s) {holders} (run stack-down)")
