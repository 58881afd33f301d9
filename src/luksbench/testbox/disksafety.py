"""Guards before a real disk of the ``devices`` allowlist is written to: its path is stable,
nothing has it mounted, held, claimed or open, and it is blank or its serial is named in
``wipe_serial`` (:func:`check_devices`). Standard library and util-linux.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path

from luksbench.testbox.scratchsafety import (
    SafetyError,
    file_id,
    loop_table,
    open_fds,
    unescape_mountinfo,
)
from luksbench.testbox.sysutil import read_text, run_quiet, whole_disk

# Names that keep pointing at the same disk across reboots and hot-plugging. Left out on purpose:
# /dev/sdX, /dev/nvmeXnY, /dev/vdX and /dev/loopN (enumeration order), by-diskseq (a per-boot
# counter), by-uuid and by-label (they name the filesystem about to be destroyed, and clones share
# them), by-partlabel (free text, often duplicated).
STABLE_PATH_PREFIXES = (
    "/dev/disk/by-id/",  # model + serial or WWN: follows the disk to any port
    "/dev/disk/by-path/",  # controller and port: stable while the hardware stays put
    "/dev/disk/by-partuuid/",  # GPT partition UUID
)

# O_EXCL on a block device is the kernel's "claimed" check (it does not create anything).
_EXCL_CLAIMERS = (
    "a mounted filesystem, active swap, a device-mapper/md/bcache member, or a program such as "
    "cryptsetup, mkfs or fio"
)


def is_stable_path(path: str) -> bool:
    """``path`` is one link directly inside a STABLE_PATH_PREFIXES directory (``..`` resolved)."""
    norm = os.path.normpath(path)
    rests = [norm.removeprefix(p) for p in STABLE_PATH_PREFIXES if norm.startswith(p)]
    return any(rest and "/" not in rest for rest in rests)


def stable_links_to(resolved: str) -> list[str]:
    """Links in the STABLE_PATH_PREFIXES directories that point at ``resolved`` (for messages)."""
    target = os.path.realpath(resolved)
    found = []
    for prefix in STABLE_PATH_PREFIXES:
        try:
            names = sorted(os.listdir(prefix))
        except OSError:
            continue
        found += [prefix + n for n in names if os.path.realpath(prefix + n) == target]
    return found


def _block_rdev(resolved: str) -> int:
    st = os.stat(resolved)
    if not stat.S_ISBLK(st.st_mode):
        raise SafetyError(f"{resolved} is not a block device")
    return st.st_rdev


def _sysfs_dir(resolved: str) -> Path:
    """/sys/devices/.../block/<disk>[/<partition>] of a block device node."""
    rdev = _block_rdev(resolved)
    sysdir = Path(os.path.realpath(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}"))
    if not (sysdir / "dev").is_file():
        raise SafetyError(f"{resolved}: no sysfs entry for block device {_major_minor(rdev)}")
    return sysdir


def _major_minor(rdev: int) -> str:
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def _is_partition(sysdir: Path) -> bool:
    return (sysdir / "partition").is_file()


def _partitions(sysdir: Path) -> list[Path]:
    if _is_partition(sysdir):
        return []
    try:
        return sorted(c for c in sysdir.iterdir() if (c / "partition").is_file())
    except OSError:
        return []


def _family(sysdir: Path) -> list[Path]:
    """The device and, for a whole disk, its partitions: what wiping it would destroy."""
    return [sysdir, *_partitions(sysdir)]


def _rdev_of(sysdir: Path) -> int | None:
    major, sep, minor = (read_text(sysdir / "dev") or "").partition(":")
    return os.makedev(int(major), int(minor)) if sep else None


def _dev_node(sysdir: Path) -> str:
    """/dev node of a sysfs block entry (DEVNAME from uevent; the kernel name otherwise)."""
    for line in (read_text(sysdir / "uevent") or "").splitlines():
        if line.startswith("DEVNAME="):
            return "/dev/" + line.removeprefix("DEVNAME=")
    return f"/dev/{sysdir.name}"


def _lsblk_field(node: str, column: str) -> str | None:
    proc = run_quiet(["lsblk", "-dno", column, node])
    return (proc.stdout.strip() or None) if proc is not None and proc.returncode == 0 else None


def device_serial(resolved: str) -> str | None:
    """What ``wipe_serial`` must name: the disk's serial (sysfs, else lsblk's, else the WWID; a
    loop device's backing file); None when there is none."""
    disk = whole_disk(_sysfs_dir(resolved))
    if (disk / "loop").is_dir():
        return read_text(disk / "loop" / "backing_file") or None
    for candidate in (disk / "device" / "serial", disk / "serial"):
        if value := read_text(candidate):
            return value
    if value := _lsblk_field(_dev_node(disk), "SERIAL"):
        return value
    return read_text(disk / "device" / "wwid") or None


def device_model(resolved: str) -> str | None:
    disk = whole_disk(_sysfs_dir(resolved))
    if (disk / "loop").is_dir():
        return None
    return read_text(disk / "device" / "model") or _lsblk_field(_dev_node(disk), "MODEL")


def _signatures_of(node: str) -> list[dict]:
    proc = run_quiet(["wipefs", "--no-act", "--json", node])
    if proc is not None and proc.returncode == 0:
        if not proc.stdout.strip():
            return []  # older wipefs prints nothing for a blank device
        with contextlib.suppress(json.JSONDecodeError):  # not JSON: an old wipefs, ask blkid
            found = json.loads(proc.stdout).get("signatures", [])
            keys = ("type", "offset", "uuid", "label")
            return [{k: s[k] for k in keys if s.get(k) is not None} for s in found]
    # Fallback (no wipefs, or one without --json): blkid reports the first signature only.
    probe = run_quiet(["blkid", "-p", "-o", "export", node])
    if probe is not None and probe.returncode == 2:
        return []
    if probe is not None and probe.returncode == 8:
        return [{"type": "ambivalent (blkid -p found several signatures)", "offset": None}]
    if probe is not None and probe.returncode == 0:
        values = dict(
            line.split("=", 1) for line in probe.stdout.splitlines() if "=" in line.strip()
        )
        kind = values.get("TYPE") or values.get("PTTYPE") or "unknown"
        offset = values.get("SBMAGIC_OFFSET") or values.get("PTMAGIC_OFFSET")
        return [{"type": kind, "offset": hex(int(offset)) if offset else None}]
    said = ((proc.stderr if proc else "") + (probe.stderr if probe else "")).strip()
    raise SafetyError(
        f"cannot read the signatures of {node} (wipefs and blkid failed or are missing"
        f"{': ' + said if said else ''}); install util-linux"
    )


def device_signatures(resolved: str) -> list[dict]:
    """Signatures of the device and, with a ``partition`` key, of its partitions (empty: blank)."""
    sysdir = _sysfs_dir(resolved)
    found = _signatures_of(resolved)
    for part in _partitions(sysdir):
        found += [{**s, "partition": part.name} for s in _signatures_of(_dev_node(part))]
    return found


def _is_one_of(path: str, rdevs: set[int]) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISBLK(st.st_mode) and st.st_rdev in rdevs


def device_mounts(resolved: str) -> list[str]:
    """Mount points of the device or its partitions in this namespace, ``[swap]`` for swap."""
    family = _family(_sysfs_dir(resolved))
    rdevs = {r for r in map(_rdev_of, family) if r is not None}
    numbers = {_major_minor(r) for r in rdevs}
    found: list[str] = []
    for line in (read_text("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5:
            continue
        source = unescape_mountinfo(tail[1]) if len(tail) > 1 else ""
        # btrfs shows an anonymous 0:N in mountinfo: its source names the real device.
        if fields[2] in numbers or (source.startswith("/dev/") and _is_one_of(source, rdevs)):
            found.append(unescape_mountinfo(fields[4]))
    for line in (read_text("/proc/swaps") or "").splitlines()[1:]:
        if line.split() and _is_one_of(unescape_mountinfo(line.split()[0]), rdevs):
            found.append("[swap]")
    return sorted(set(found))


def device_holders(resolved: str) -> list[str]:
    """Kernel devices stacked on the device or its partitions, dm ones with their name."""
    found = set()
    for member in _family(_sysfs_dir(resolved)):
        try:
            holders = os.listdir(member / "holders")
        except OSError:
            continue
        for holder in holders:
            dm_name = read_text(Path("/sys/class/block") / holder / "dm" / "name")
            found.add(f"{holder} ({dm_name})" if dm_name else holder)
    return sorted(found)


def processes_using_device(resolved: str) -> list[int]:
    """PIDs with the device or one of its partitions open, by device number."""
    rdevs = {r for r in map(_rdev_of, _family(_sysfs_dir(resolved))) if r is not None}
    # a link without a path is a socket, pipe or anon inode
    fds = open_fds()
    return sorted({pid for pid, fd, link in fds if link.startswith("/") and _is_one_of(fd, rdevs)})


def loops_over_content(resolved: str) -> list[str]:
    """Other loop devices that read the device's content, at any offset: over the device (or a
    partition of it) by any node, or, for a loop device, over the same backing file. Each named
    with its offset, what it is over, and where it is mounted."""
    sysdir = _sysfs_dir(resolved)
    disk = whole_disk(sysdir)
    family = list(dict.fromkeys([disk, *_family(sysdir)]))  # a partition's disk covers it too
    rdevs = {r for r in map(_rdev_of, family) if r is not None}
    nodes = {file_id(_dev_node(m)) for m in family} | {file_id(resolved)}
    nodes.discard(None)
    table = loop_table()
    own = next((e for e in table if e["name"] == _dev_node(disk)), None)
    found = []
    for e in table:
        if e is own or not e["name"]:
            continue
        if e["back"] in nodes or _is_one_of(e["back_file"], rdevs):
            over = "over it"
        elif own is not None and (
            (own["back"] is not None and e["back"] == own["back"])
            or (own["back_file"] and e["back_file"] == own["back_file"])
        ):
            over = f"over its backing file {own['back_file']}"
        else:
            continue
        mounts = device_mounts(e["name"]) if os.path.exists(e["name"]) else []
        mounted = f", mounted at {', '.join(mounts)}" if mounts else ""
        found.append(f"{e['name']} ({over} at offset {e['offset']}{mounted})")
    return sorted(found)


def _open_for_writing(pid: int, fd_path: str) -> bool:
    """The fd's open flags (/proc/<pid>/fdinfo/<n>) allow writing."""
    fdinfo = fd_path.replace("/fd/", "/fdinfo/", 1)
    for line in (read_text(fdinfo) or "").splitlines():
        if line.startswith("flags:"):
            with contextlib.suppress(ValueError):
                return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    return False


def backing_file_writers(resolved: str) -> tuple[str | None, list[int]]:
    """(backing file, PIDs holding it open for writing) of a loop device (or a partition of
    one); (None, []) for any other device."""
    disk = whole_disk(_sysfs_dir(resolved))
    if not (disk / "loop").is_dir():
        return None, []
    own = next((e for e in loop_table() if e["name"] == _dev_node(disk)), None)
    if own is None or own["back"] is None:
        return None, []
    pids = {
        pid
        for pid, fd, link in open_fds()
        if link.startswith("/") and file_id(fd) == own["back"] and _open_for_writing(pid, fd)
    }
    return own["back_file"], sorted(pids)


def read_only_reason(resolved: str) -> str | None:
    """Where sysfs says the device (or its disk) is read-only, or None."""
    sysdir = _sysfs_dir(resolved)
    for d in dict.fromkeys((sysdir, whole_disk(sysdir))):
        if read_text(d / "ro") == "1":
            return f"/sys/class/block/{d.name}/ro is 1"
    return None


def _pid_names(pids: list[int]) -> str:
    return ", ".join(f"pid {p} ({read_text(f'/proc/{p}/comm') or '?'})" for p in pids)


def device_in_use(resolved: str) -> str | None:
    """Why the device is busy (the kernel's O_EXCL claim, or open by a process), or None."""
    reasons = []
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            reasons.append(f"claimed exclusively (open with O_EXCL: EBUSY) by {_EXCL_CLAIMERS}")
        else:
            reasons.append(f"cannot be opened ({exc.strerror})")
    else:
        os.close(fd)
    if pids := processes_using_device(resolved):
        reasons.append("open by " + _pid_names(pids))
    return "; ".join(reasons) or None


def _queue_value(sysdir: Path, name: str) -> int | None:
    # Partitions have no queue/: it is their disk's.
    text = read_text(whole_disk(sysdir) / "queue" / name)
    return int(text) if text and text.isdigit() else None


def _describe_signatures(signatures: list[dict]) -> str:
    parts = []
    for s in signatures:
        where = f" in partition {s['partition']}" if "partition" in s else ""
        at = f" at offset {s['offset']}" if s.get("offset") else ""
        label = f" label {s['label']!r}" if s.get("label") else ""
        parts.append(f"{s['type']}{at}{where}{label}")
    return ", ".join(parts)


def check_device(name: str, spec: dict) -> dict:
    """Refuse (SafetyError naming ``devices.<name>``) unless the entry may be written to; return
    what it is. The checks only read, and hold when made: callers write to ``resolved``."""
    where = f"devices.{name}"
    path = spec.get("path")
    wipe_serial = spec.get("wipe_serial") or ""
    _check_spec(where, path, wipe_serial, spec.get("allow_unstable_path", False))
    resolved, shown, sysdir, size_bytes = _block_device(where, path)
    _check_unused(where, resolved, shown)
    serial, signatures = _check_wipe_confirmed(where, resolved, shown, wipe_serial)
    return {
        "name": name,
        "path": path,
        "resolved": resolved,
        "kernel_name": sysdir.name,
        "major_minor": _major_minor(_block_rdev(resolved)),
        "is_partition": _is_partition(sysdir),
        "whole_disk": whole_disk(sysdir).name,
        "size_bytes": size_bytes,
        "serial": serial,
        "model": device_model(resolved),
        "rotational": _queue_value(sysdir, "rotational") == 1,
        "logical_block_size": _queue_value(sysdir, "logical_block_size"),
        "physical_block_size": _queue_value(sysdir, "physical_block_size"),
        "read_only": read_text(sysdir / "ro") == "1",
        "signatures": signatures,
        "wipe_confirmed": bool(wipe_serial) and wipe_serial == serial,
    }


def _check_spec(where: str, path, wipe_serial, allow_unstable) -> None:
    """The entry's keys are well-formed and its path is a stable name (or allowed not to be)."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise SafetyError(
            f"{where}.path must be an absolute device path such as /dev/disk/by-id/..., "
            f"not {path!r}"
        )
    if not isinstance(wipe_serial, str):
        raise SafetyError(f"{where}.wipe_serial must be a string (the disk's serial)")
    if not isinstance(allow_unstable, bool):
        raise SafetyError(f"{where}.allow_unstable_path must be true or false")
    if not allow_unstable and not is_stable_path(path):
        hint = "see ls -l /dev/disk/by-id/ for the disk's names"
        if links := ", ".join(stable_links_to(path) if os.path.exists(path) else []):
            hint = f"links to it here: {links}"
        raise SafetyError(
            f"{where}: path {path} is not a stable name: it can point at another disk after a "
            f"reboot or hot-plug. Use a link under {', '.join(STABLE_PATH_PREFIXES)} ({hint}), "
            f"or set {where}.allow_unstable_path: true (VMs, loop test disks)"
        )
    if not os.path.exists(path):
        dangling = f" (a symlink to {os.readlink(path)}, missing)" if os.path.islink(path) else ""
        raise SafetyError(
            f"{where}: path {path} does not exist{dangling}; check the name "
            "(ls -l /dev/disk/by-id/) and that the disk is attached"
        )


def _block_device(where: str, path: str) -> tuple[str, str, Path, int]:
    """(resolved path, how to show it, sysfs dir, size in bytes) of a block device with a size."""
    resolved = os.path.realpath(path)
    shown = path if resolved == path else f"{path} (-> {resolved})"
    mode = os.stat(resolved).st_mode
    if not stat.S_ISBLK(mode):
        kinds = {stat.S_IFREG: "a regular file", stat.S_IFDIR: "a directory"}
        kinds[stat.S_IFCHR] = "a character device"
        kind = kinds.get(stat.S_IFMT(mode), "a special file")
        raise SafetyError(
            f"{where}: {shown} is {kind}, not a block device; name a disk, or use "
            f"size_mib instead of path for a scratch file on a loop device"
        )
    sysdir = _sysfs_dir(resolved)
    size_bytes = int(read_text(sysdir / "size") or 0) * 512
    if size_bytes == 0:
        raise SafetyError(
            f"{where}: {shown} has size 0 (an unattached loop device, or no medium); "
            "attach the disk or fix the path"
        )
    return resolved, shown, sysdir, size_bytes


def _check_unused(where: str, resolved: str, shown: str) -> None:
    """Not mounted (nor swap), no holders, not open by any process, no other loop device over
    its content, no writer of its backing file, not read-only."""
    if mounts := device_mounts(resolved):
        at = ", ".join("as swap" if m == "[swap]" else f"at {m}" for m in mounts)
        raise SafetyError(
            f"{where}: {shown} (or a partition of it) is mounted {at}; unmount it (umount / "
            "swapoff) if its data may go, or name another disk"
        )
    if holders := device_holders(resolved):
        raise SafetyError(
            f"{where}: {shown} (or a partition of it) is held by {', '.join(holders)}: it is part "
            "of a device-mapper, md or bcache device; take that down (dmsetup remove, cryptsetup "
            "close, mdadm --stop) if its data may go, or name another disk"
        )
    if busy := device_in_use(resolved):
        raise SafetyError(
            f"{where}: {shown} is in use: {busy}; stop that first, or name another disk"
        )
    if loops := loops_over_content(resolved):
        raise SafetyError(
            f"{where}: {shown} (or a partition of it) backs other loop devices: "
            f"{', '.join(loops)}; its content is in use: unmount and detach them (umount, "
            "losetup -d) if its data may go, or name another disk"
        )
    backing, writers = backing_file_writers(resolved)
    if writers:
        raise SafetyError(
            f"{where}: {shown} is a loop device whose backing file {backing} is open for "
            f"writing by {_pid_names(writers)}; stop that first, or name another disk"
        )
    if read_only := read_only_reason(resolved):
        raise SafetyError(
            f"{where}: {shown} is read-only ({read_only}); luksbench must write to it: "
            "name a writable disk (for a loop device: losetup without -r)"
        )


def _check_wipe_confirmed(
    where: str, resolved: str, shown: str, wipe_serial: str
) -> tuple[str | None, list[dict]]:
    """(serial, signatures): a disk with signatures only when wipe_serial names its serial."""
    serial = device_serial(resolved)
    if wipe_serial and serial is None:
        raise SafetyError(
            f"{where}: wipe_serial is {wipe_serial!r} but {shown} has no serial to compare it "
            "with; clear the disk yourself (wipefs -a) after checking, and leave wipe_serial empty"
        )
    if wipe_serial and wipe_serial != serial:
        raise SafetyError(
            f"{where}: wipe_serial is {wipe_serial!r} but {shown} has serial {serial!r}: either "
            "path names another disk than the one you confirmed (check path) or wipe_serial is "
            "mistyped"
        )
    signatures = device_signatures(resolved)
    if signatures and not wipe_serial:
        fix = "it has no serial to confirm by: clear it yourself (wipefs -a) after checking"
        if serial is not None:
            fix = f"set {where}.wipe_serial: {serial!r} (its serial) to let luksbench overwrite it"
        raise SafetyError(
            f"{where}: {shown} is not blank, it carries {_describe_signatures(signatures)}; "
            f"if its data may go, {fix}"
        )
    return serial, signatures


def check_devices(devices: dict[str, dict]) -> dict[str, dict]:
    """check_device for every entry with a ``path``, refusing two names for one disk or a disk
    and its partition; returns name -> description."""
    described: dict[str, dict] = {}
    for name, spec in devices.items():
        if not isinstance(spec, dict) or ("path" in spec) == ("size_mib" in spec):
            raise SafetyError(
                f"devices.{name} needs exactly one of 'path' (a real disk) or 'size_mib' "
                "(a scratch file on a loop device)"
            )
        if "path" in spec:
            described[name] = check_device(name, spec)
    seen: dict[str, str] = {}
    for name, d in described.items():
        if d["major_minor"] in seen:
            other = seen[d["major_minor"]]
            raise SafetyError(
                f"devices.{name}: {d['path']} and devices.{other} ({described[other]['path']}) "
                f"are the same block device ({d['resolved']}, {d['major_minor']}); "
                "name each disk once and share it between stacks by name"
            )
        seen[d["major_minor"]] = name
    for name, d in described.items():
        for other, o in described.items():
            if d["is_partition"] and not o["is_partition"] and d["whole_disk"] == o["kernel_name"]:
                raise SafetyError(
                    f"devices.{name}: {d['resolved']} is a partition of devices.{other} "
                    f"({o['resolved']}); writing one destroys the other: use one of them"
                )
    return described
