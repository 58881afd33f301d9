"""Guards for the test box's own files: names, the scratch folder, the files it creates (the same
inode from check to use), and what on this machine is already in use (mounts, loop devices, open
files, device-mapper names). Standard library and util-linux.

Scratch files live directly in scratch_dir, named after the run and stack.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import re
import stat
import subprocess
from pathlib import Path

from luksbench.testbox.sysutil import QUIET, read_text, run_quiet

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
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
    check_scratch_owners(path)
    return path


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def trusted_uids(euid: int) -> set[int]:
    """Users who may change the scratch folder: root, the user running luksbench and, run
    through sudo, the user who ran sudo (they could run anything as root already)."""
    sudo = os.environ.get("SUDO_UID", "")
    return {0, euid} | ({int(sudo)} if sudo.isdigit() else set())


def _private_group(gid: int, owner: int) -> bool:
    """A user-private group (Debian's default with umask 002): named as its owner, no members."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(owner)
    except KeyError:
        return False
    return (
        group.gr_name == user.pw_name
        and user.pw_gid == gid
        and not set(group.gr_mem) - {user.pw_name}
    )


def others_can_change(st: os.stat_result, euid: int) -> str | None:
    """Why a folder lets a user other than the trusted ones (:func:`trusted_uids`) rename, replace
    or add its entries (it is theirs, or other-writable, or writable by a group that is not its
    owner's private group, without the sticky bit of a root-owned folder such as /tmp), or None."""
    if st.st_uid not in trusted_uids(euid):
        return f"is owned by {_user(st.st_uid)}"
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable == stat.S_IWGRP and st.st_uid != 0 and _private_group(st.st_gid, st.st_uid):
        writable = 0
    if writable and not (st.st_mode & stat.S_ISVTX and st.st_uid == 0):
        who = {stat.S_IWGRP: "its group", stat.S_IWOTH: "every user"}.get(writable, "its group")
        if writable == stat.S_IWGRP | stat.S_IWOTH:
            who = "its group and every user"
        mode = stat.S_IMODE(st.st_mode)
        return (
            f"is writable by {who} (mode {mode:04o}, not a root-owned folder with the sticky bit)"
        )
    return None


def check_scratch_owners(path: Path) -> None:
    """Refuse a scratch_dir when another user can change it or a folder above it (up to /, as
    named and as resolved): they could swap a backing file for a link to a disk between its
    creation and the writes. Folders not created yet are skipped."""
    path = Path(os.path.normpath(path))
    real = Path(os.path.realpath(path))
    euid = os.geteuid()
    for folder in dict.fromkeys([path, *path.parents, real, *real.parents]):
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise SafetyError(f"scratch_dir {path}: cannot check {folder}: {exc}") from exc
        if reason := others_can_change(st, euid):
            real_folder = os.path.realpath(folder)
            shown = folder if str(folder) == real_folder else f"{folder} (-> {real_folder})"
            what = "it" if folder == path else f"{shown}, a folder above it,"
            raise SafetyError(
                f"scratch_dir {path}: {what} {reason}: that user could swap a backing file for a "
                "link to a disk that luksbench would then overwrite; use a folder only root "
                "(and you) can change, e.g. /var/tmp/luksbench, or fix it (chown root, chmod go-w)"
            )


def make_scratch_dir(path: str | Path) -> Path:
    """Create a checked scratch_dir (missing folders at most 0755, whatever the umask) and check it
    again once it exists; returns it resolved."""
    path = check_scratch_dir(path)
    for folder in [*reversed(path.parents), path]:
        if not os.path.isdir(folder):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755)
    check_scratch_owners(path)
    return path.resolve()


def check_inside(path: str | Path, scratch_dir: str | Path) -> Path:
    """``path`` must be a direct child of ``scratch_dir`` (after resolving symlinks)."""
    p = Path(path)
    parent = Path(scratch_dir).resolve()
    if p.parent.resolve() != parent or p.name in ("", ".", ".."):
        raise SafetyError(f"{p} is not a file directly inside scratch_dir {parent}")
    if p.is_symlink():
        raise SafetyError(f"{p} is a symlink; backing files must be regular files in scratch_dir")
    return parent / p.name


def check_same_file(path: str | Path, identity, before: str) -> None:
    """``path`` is still the regular file luksbench created: not a link, same (st_dev, st_ino) as
    recorded at creation. Called before every step that writes through the name."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise SafetyError(f"{path} is gone ({exc.strerror}); refusing to {before}") from exc
    swapped = "luksbench created (someone who can change scratch_dir swapped it"
    if stat.S_ISLNK(st.st_mode):
        raise SafetyError(
            f"{path} is now a symlink to {os.readlink(path)}, not the file {swapped}); "
            f"refusing to {before}: nothing was written to the link's target"
        )
    found = (st.st_dev, st.st_ino)
    if not stat.S_ISREG(st.st_mode) or found != tuple(identity):
        raise SafetyError(
            f"{path} is no longer the file {swapped}: device, inode {tuple(identity)}, now "
            f"{found}); refusing to {before}"
        )


@contextlib.contextmanager
def opened_same_file(path: str | Path, identity, before: str):
    """The file luksbench created, opened read-write without following links and checked by
    inode: a tool given /dev/fd/<n> writes to it and nothing else, whatever the name points at
    meanwhile. Yields the descriptor."""
    check_same_file(path, identity, before)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SafetyError(
            f"{path} cannot be opened without following links ({exc.strerror}); refusing to "
            f"{before}"
        ) from exc
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != tuple(identity):
            raise SafetyError(
                f"{path} was swapped while being opened (device, inode {tuple(identity)}, now "
                f"{(st.st_dev, st.st_ino)}); refusing to {before}"
            )
        yield fd
    finally:
        os.close(fd)


def check_loop_backing(loop: str, identity, before: str) -> None:
    """The loop device reads the file luksbench created (its backing inode, whatever its name)."""
    entry = next((e for e in loop_table() if e["name"] == loop), None)
    found = entry["back"] if entry is not None else None
    if found != tuple(identity):
        what = f"{entry['back_file']} (device, inode {found})" if entry else "nothing"
        raise SafetyError(
            f"{loop} is attached to {what}, not the file luksbench created (device, inode "
            f"{tuple(identity)}); refusing to {before}"
        )


def process_has_open(pid: int, identity) -> bool:
    """Whether process ``pid`` has the file with (st_dev, st_ino) ``identity`` open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    return any(file_id(f"/proc/{pid}/fd/{fd}") == tuple(identity) for fd in fds)


def unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mountpoints() -> list[str]:
    """Mount points of this mount namespace, from /proc/self/mountinfo."""
    lines = (read_text("/proc/self/mountinfo") or "").splitlines()
    return [unescape_mountinfo(f[4]) for f in map(str.split, lines) if len(f) > 4]


def is_mounted(path: str | Path) -> bool:
    return os.path.abspath(path) in mountpoints()


def loop_devices(*names: str) -> list[dict]:
    """``losetup -J -l`` entries of the named loop devices (of every one without names)."""
    argv = ["losetup", "-J", "-l", *names]
    try:
        proc = subprocess.run(argv, timeout=30, **QUIET)
        if proc.returncode == 0 and proc.stdout.strip():
            return json.loads(proc.stdout).get("loopdevices", [])
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        pass
    return []


def loop_devices_backed_by(files: list[str | Path]) -> list[str]:
    """Loop devices whose backing file is one of ``files``."""
    wanted = {os.path.abspath(f) + deleted for f in files for deleted in ("", " (deleted)")}
    return sorted(d["name"] for d in loop_devices() if d.get("back-file") in wanted)


def mapper_names_with_prefix(prefix: str) -> list[str]:
    try:
        names = os.listdir("/dev/mapper")
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def open_fds():
    """(pid, /proc/<pid>/fd/<n>, link target) of every other process's open files (root sees
    all users')."""
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
                yield int(entry), f"{fd_dir}/{fd}", os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue


def processes_holding(path: str | Path) -> list[int]:
    """PIDs with ``path`` open (scans /proc/*/fd; needs root to see other users' processes)."""
    target = os.path.abspath(path)
    return sorted({pid for pid, _, link in open_fds() if link.removesuffix(" (deleted)") == target})


def check_free(*, mapper: str | None = None, mountpoint: Path | None = None, backing: Path) -> None:
    """Refuse when a name or file we are about to create is already in use by someone."""
    if mapper is not None and os.path.exists(f"/dev/mapper/{mapper}"):
        raise SafetyError(f"device-mapper name {mapper} is already in use (/dev/mapper/{mapper})")
    if mountpoint is not None and is_mounted(mountpoint):
        raise SafetyError(
            f"{mountpoint} is already a mountpoint (stale FUSE export? run stack-down)"
        )
    if loops := loop_devices_backed_by([backing]):
        raise SafetyError(f"{backing} is already attached to {', '.join(loops)} (run stack-down)")
    if holders := processes_holding(backing):
        raise SafetyError(f"{backing} is open by pid(s) {holders} (run stack-down)")


# --- loop devices and the files they read


def loop_table() -> list[dict]:
    """Every loop device: ``name``, ``back_file``, ``back`` (st_dev, st_ino of the file it reads,
    whatever its name now), ``offset``. Refuses when losetup cannot list them: a check that sees
    nothing must not pass."""
    argv = ["losetup", "-J", "-l", "-O", "NAME,BACK-FILE,BACK-INO,BACK-MAJ:MIN,OFFSET"]
    proc = run_quiet(argv)
    if proc is None or proc.returncode != 0:
        said = proc.stderr.strip() if proc is not None else "losetup missing or hung"
        raise SafetyError(f"cannot list loop devices ({said}); install util-linux")
    try:
        entries = json.loads(proc.stdout).get("loopdevices", []) if proc.stdout.strip() else []
    except json.JSONDecodeError as exc:
        raise SafetyError(f"cannot read `{' '.join(argv)}`: {exc}") from exc
    return [_loop_entry(e) for e in entries]


def _loop_entry(entry: dict) -> dict:
    major, sep, minor = str(entry.get("back-maj:min") or "").strip().partition(":")
    ino = entry.get("back-ino")
    back = None
    if sep and major.isdigit() and minor.isdigit() and str(ino).isdigit():
        back = (os.makedev(int(major), int(minor)), int(ino))
    back_file = str(entry.get("back-file") or "").removesuffix(" (deleted)")
    offset = int(entry.get("offset") or 0)
    return {"name": entry.get("name"), "back_file": back_file, "back": back, "offset": offset}


def file_id(path: str | Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
