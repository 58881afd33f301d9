"""Kernel backend: every stack is a tree of layers built from loop devices, dm-crypt, dm-linear,
md and filesystems, on scratch files or on allowlisted disks.

Layers (``kind``), top first in the config, built bottom-up here:

``plain`` / ``loop``  a scratch file of the stack's own, attached with ``losetup --direct-io=on``
``raw``               an allowlisted device itself (a real disk, or a scratch-file device's loop)
``external``          a device prepared outside (SED, krbd, an existing mapping): used as it is
``luks``              ``cryptsetup luksFormat`` + ``open`` (perf flags, sector size, null cipher)
``linear``            dm-linear over the LBAs of another stack's luks payload (same region)
``md``                ``mdadm --create --assume-clean`` RAID-0/5 over its members
``fs``                mkfs (ext4/xfs) + mount; fio's target is a preallocated file on it
``rbd``               nothing to build: fio's rbd engine talks to the cluster

Every object enters the undo log (``state["objects"]``) *before* it is created, so :func:`undo`
can reverse a partial build. A device in ``devices`` is built once and shared by every stack that
names it. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import struct
import subprocess
import time
from pathlib import Path

from luksbench.testbox import safety
from luksbench.testbox.plan import MIB, NULL_CIPHERS, baseline_first, first_layer, plan_layers
from luksbench.testbox.sysinfo import strip_dm_table_keys
from luksbench.testbox.sysutil import (
    QUIET,
    TestboxError,
    log,
    private_dir,
    run_quiet,
    run_tool,
    write_json_atomic,
)

BLKGETSIZE64 = 0x80081272
# dm-crypt target versions that brought the optional parameters (kernel 4.0, 5.9 and 6.10).
PERF_FLAG_MIN_CRYPT_VERSION = {
    "same_cpu_crypt": (1, 14, 0),
    "submit_from_crypt_cpus": (1, 14, 0),
    "no_read_workqueue": (1, 22, 0),
    "no_write_workqueue": (1, 22, 0),
    "high_priority": (1, 26, 0),
}
# Our arrays are /dev/md120 and up, skipping numbers in use: clear of the low numbers a system's
# own arrays usually have (mdadm's automatic names count down from md127).
MD_FIRST_MINOR = 120


def device_size(path: str | Path) -> int:
    """Size in bytes of a block device (BLKGETSIZE64) or regular file."""
    st = os.stat(path)
    if stat.S_ISBLK(st.st_mode):
        fd = os.open(path, os.O_RDONLY)
        try:
            buf = fcntl.ioctl(fd, BLKGETSIZE64, b"\0" * 8)
        finally:
            os.close(fd)
        return struct.unpack("Q", buf)[0]
    return st.st_size


def loop_direct_io(loop: str) -> bool | None:
    """Whether the loop device really does direct I/O to its backing file (``losetup -J -l``)."""
    dio = next(iter(safety.loop_devices(loop)), {}).get("dio")
    return dio if isinstance(dio, bool) else (str(dio) == "1" if dio is not None else None)


def write_key(key_dir: Path, name: str) -> Path:
    """A random 64-character hex passphrase (qemu secrets must be UTF-8), mode 0600, no newline."""
    path = key_dir / f"{name}.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
        f.flush()
        os.fsync(f.fileno())
    return path


def create_backing(path: Path, size: int) -> list[int]:
    """A new file (never through a link, never an existing one), fully allocated; its
    [st_dev, st_ino], which every later step that writes through the name checks again."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    return [st.st_dev, st.st_ino]


def check_recorded_files(objects: list[dict], before: str) -> None:
    """Every file the undo log holds with its identity is still that file, and every loop device
    over one still reads it (SafetyError otherwise)."""
    for obj in objects:
        if obj.get("identity") is None:
            continue
        if obj["type"] in ("backing_file", "file"):
            safety.check_same_file(obj["path"], obj["identity"], before)
        elif obj["type"] == "loop" and obj.get("device"):
            safety.check_loop_backing(obj["device"], obj["identity"], before)


# --- command lines (pure functions; unit-tested) -------------------------------------------------


def losetup_argv(backing: str | Path) -> list[str]:
    return ["losetup", "--direct-io=on", "--show", "-f", str(backing)]


def luks_facts(cfg: dict, luks_type: str, sector: int) -> dict:
    """How a luks layer is formatted, as its description records it."""
    return {
        "cipher": cfg.get("cipher", "aes-xts-plain64"),
        "key_bits": int(cfg.get("key_bits", 512)),
        "hash": cfg.get("hash", "sha256"),
        "luks_type": luks_type,
        "luks_type_requested": cfg.get("luks_type", "luks2"),
        "sector_size": sector,
        "pbkdf": "pbkdf2",
        "pbkdf_iterations": int(cfg.get("pbkdf_iterations", 1000)),
    }


def luks_format_argv(
    cfg: dict, target: str | Path, key_file: str | Path, luks_type: str
) -> list[str]:
    facts = luks_facts(cfg, luks_type, int(cfg.get("sector_size", 512)))
    cipher = str(facts["cipher"])
    argv = ["cryptsetup", "luksFormat", "--batch-mode", "--type", luks_type, "--cipher", cipher]
    argv += ["--key-size", str(facts["key_bits"]), "--hash", str(facts["hash"])]
    if luks_type == "luks2":
        argv += ["--sector-size", str(facts["sector_size"])]
        if cipher in NULL_CIPHERS:
            # The null arm encrypts nothing; its key slot still needs a real cipher.
            argv += ["--keyslot-cipher", "aes-xts-plain64", "--keyslot-key-size", "512"]
    argv += ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", str(facts["pbkdf_iterations"])]
    return [*argv, "--key-file", str(key_file), str(target)]


def luks_dump(device: str | Path, key_file: str | Path, stack: str) -> str:
    """``cryptsetup luksDump``, refused if it holds the key (it prints none: belt and braces)."""
    dump = run_tool(["cryptsetup", "luksDump", str(device)], f"stack {stack}: luksDump").stdout
    if Path(key_file).read_text() in dump:
        raise TestboxError(f"stack {stack}: luksDump output contains key material")
    return dump


def luks_open_argv(
    device: str | Path, name: str, key_file: str | Path, perf_flags: list[str] | None = None
) -> list[str]:
    argv = ["cryptsetup", "open", "--type", "luks", *[f"--perf-{f}" for f in perf_flags or []]]
    return [*argv, "--key-file", str(key_file), str(device), name]


def mdadm_create_argv(device: str, level: int, chunk_kib: int, members: list[str]) -> list[str]:
    # --assume-clean: no initial resync competing with the measurements (parity is computed on
    # write anyway); --run: no interactive confirmation.
    argv = ["mdadm", "--create", device, "--run", "--assume-clean", "--metadata=1.2"]
    argv += [f"--level={level}", f"--raid-devices={len(members)}", f"--chunk={chunk_kib}"]
    return [*argv, *members]


def mkfs_argv(fstype: str, device: str) -> list[str]:
    if fstype == "ext4":
        # Initialise inode tables and journal now, not lazily in the background during the runs.
        return ["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", device]
    if fstype == "xfs":
        return ["mkfs.xfs", "-f", "-q", device]
    raise TestboxError(f"unsupported fstype {fstype!r}")


# --- what the kernel and cryptsetup support ------------------------------------------------------


def crypt_target_version() -> tuple[int, ...] | None:
    """dm-crypt target version from ``dmsetup targets`` (None when unknown)."""
    proc = run_quiet(["dmsetup", "targets"])
    for line in proc.stdout.splitlines() if proc is not None and proc.returncode == 0 else []:
        parts = line.split()
        if parts[:1] == ["crypt"] and len(parts) > 1:
            with contextlib.suppress(ValueError):
                return tuple(int(x) for x in parts[1].lstrip("v").split("."))
    return None


def cryptsetup_perf_flags() -> set[str]:
    proc = run_quiet(["cryptsetup", "--help"])
    text = proc.stdout if proc is not None else ""
    return {flag for flag in PERF_FLAG_MIN_CRYPT_VERSION if f"--perf-{flag}" in text}


def usable_perf_flags(
    wanted: list[str], cryptsetup_flags: set[str], crypt_version: tuple[int, ...] | None
) -> tuple[list[str], dict[str, str]]:
    """Split the requested perf flags into (applied, {skipped: reason})."""
    applied, skipped = [], {}
    for flag in wanted:
        need = PERF_FLAG_MIN_CRYPT_VERSION[flag]
        if flag not in cryptsetup_flags:
            skipped[flag] = f"this cryptsetup has no --perf-{flag}"
        elif crypt_version is not None and crypt_version < need:
            have, since = (".".join(map(str, v)) for v in (crypt_version, need))
            skipped[flag] = f"dm-crypt target v{have} is older than v{since}, which brought {flag}"
        else:
            applied.append(flag)
    return applied, skipped


def parse_cryptsetup_status(text: str) -> dict:
    """``cryptsetup status NAME`` -> {type, cipher, keysize_bits, device, sector_size,
    offset_sectors, size_sectors, flags}."""
    out: dict = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        number = re.match(r"(\d+)", value)
        if key == "offset" and number:
            out["offset_sectors"] = int(number.group(1))
        elif key == "size" and number:
            out["size_sectors"] = int(number.group(1))
        elif key == "keysize" and number:
            out["keysize_bits"] = int(number.group(1))
        elif key == "sector size" and number:
            out["sector_size"] = int(number.group(1))
        elif key in ("type", "cipher", "device", "mode", "flags"):
            out[key] = value
    return out


def dm_table(name: str) -> str | None:
    proc = run_quiet(["dmsetup", "table", name])
    ok = proc is not None and proc.returncode == 0
    return strip_dm_table_keys(proc.stdout.strip()) if ok else None


def free_md_device() -> str:
    for minor in range(MD_FIRST_MINOR, 1 << 20):
        if not os.path.exists(f"/sys/block/md{minor}") and not os.path.exists(f"/dev/md{minor}"):
            return f"/dev/md{minor}"
    raise TestboxError("no free md device number")


def mdstat() -> str | None:
    try:
        return Path("/proc/mdstat").read_text()
    except OSError:
        return None


# --- the builder ---------------------------------------------------------------------------------


def _block_layer(device: str, **description) -> dict:
    """A built layer on a block device, with what the stack's description records of it."""
    built = {"device": device, "device_type": "block", "size_bytes": device_size(device)}
    return {**built, "description": description}


def planned_dm_names(plan: dict, stacks: list[str]) -> list[str]:
    """The device-mapper names :class:`KernelBuilder` will give (refused before building when one
    is in use)."""
    names = []
    for stack in stacks:
        base = safety.mapper_name(plan["run"], stack)
        kinds = [lay["kind"] for lay in plan_layers({"stacks": {stack: plan["stacks"][stack]}})]
        count = kinds.count("luks") + kinds.count("linear")
        names += [base if n == 1 else f"{base}-{n}" for n in range(1, count + 1)]
    return names


class KernelBuilder:
    """Builds the plan's layer trees; records every object in ``state["objects"]`` first."""

    def __init__(self, plan: dict, state: dict, save, device_checks: dict[str, dict]):
        self.plan, self.state, self.save = plan, state, save
        self.scratch = Path(state["scratch_dir"])
        self.key_dir = Path(state["key_dir"]) if state.get("key_dir") else None
        self.run = state["run"]
        self.device_checks = device_checks  # name -> safety.check_device description
        self.shared: dict[str, dict] = {}  # device name -> built layer
        self.stack_luks: dict[str, dict] = {}  # stack -> its first luks layer's mapping
        self.dm_names: set[str] = set()
        self._perf = None

    # The undo log: appended (and saved) before the object exists.
    def record(self, obj: dict) -> dict:
        self.state.setdefault("objects", []).append(obj)
        self.save()
        return obj

    def _dm_name(self, stack: str) -> str:
        base = safety.mapper_name(self.run, stack)
        name, n = base, 1
        while name in self.dm_names:
            n += 1
            name = f"{base}-{n}"
        self.dm_names.add(name)
        if os.path.exists(f"/dev/mapper/{name}"):
            raise safety.SafetyError(f"device-mapper name {name} is already in use")
        return name

    def build(self, layer, stack: str) -> dict:
        """Build a layer tree of ``stack``: {device, device_type, size_bytes, description, ...}."""
        if isinstance(layer, str):
            return self._device(layer)
        kind = layer["kind"]
        if kind in ("plain", "loop"):
            size = int(layer.get("size_mib") or self.plan["device_size_mib"]) * MIB
            return self._loop_file(f"{stack}" if kind == "plain" else f"{stack}-loop", size)
        if kind in ("raw", "external"):
            built = self._device(layer["device"])
            if kind == "external":
                built = {**built, "description": {**built["description"], "kind": "external"}}
            return built
        if kind == "luks":
            below = (
                self.build(layer["over"], stack)
                if "over" in layer
                else self._loop_file(stack, int(self.plan["device_size_mib"]) * MIB)
            )
            return self._luks(layer, stack, below)
        if kind == "linear":
            return self._linear(layer, stack)
        if kind == "md":
            members = [self.build(m, stack) for m in layer["members"]]
            return self._md(layer, stack, members)
        if kind == "fs":
            return self._fs(layer, stack, self.build(layer["over"], stack))
        if kind == "rbd":
            desc = {"kind": "rbd", "pool": layer["pool"], "image": layer["image"]}
            desc["client"] = layer.get("client", "admin")
            desc["secure_mode"] = layer.get("secure_mode", "")
            desc["note"] = "fio's rbd engine against the user's pool/image; secure_mode is a label"
            return {"device": None, "device_type": "rbd", "size_bytes": None, "description": desc}
        raise TestboxError(f"stack {stack}: unknown kind {kind!r}")

    def _device(self, name: str) -> dict:
        if name in self.shared:
            return self.shared[name]
        spec = self.plan["devices"][name]
        if "size_mib" in spec:
            built = self._loop_file(f"dev-{name}", int(spec["size_mib"]) * MIB)
            built["description"]["device_name"] = name
        else:
            check = self.device_checks[name]
            built = _block_layer(check["resolved"], kind="raw", device_name=name, **check)
            built["real_device"] = True
        self.shared[name] = built
        return built

    def _loop_file(self, key: str, size: int) -> dict:
        name = f"luksbench-{self.run}-{key}.img"
        backing = safety.check_inside(self.scratch / name, self.scratch)
        safety.check_free(backing=backing)
        made = self.record({"type": "backing_file", "path": str(backing)})
        log(f"  backing file {backing} ({size // MIB} MiB, fully allocated)")
        made["identity"] = create_backing(backing, size)
        self.save()
        safety.check_same_file(backing, made["identity"], f"attach {backing} to a loop device")
        obj = self.record({"type": "loop", "backing": str(backing), "device": None})
        loop = run_tool(losetup_argv(backing), f"losetup {backing.name}").stdout.strip()
        obj["device"] = loop
        self.save()
        try:  # swapped between the check and losetup: detach before anything writes to it
            safety.check_loop_backing(loop, made["identity"], f"use {loop}")
        except safety.SafetyError:
            subprocess.run(["losetup", "-d", loop], timeout=60, **QUIET)
            raise
        obj["identity"] = made["identity"]
        self.save()
        dio = loop_direct_io(loop)
        notes = []
        if dio is not True:
            notes.append(
                f"{loop}: direct I/O to the backing file is {'off' if dio is False else 'unknown'} "
                "(filesystem without O_DIRECT?); the page cache sits under this stack"
            )
        log(f"  {backing.name} -> {loop} (direct I/O {'on' if dio else 'NOT on'})")
        facts = {"backing_file": str(backing), "backing_size_bytes": size, "loop_device": loop}
        return _block_layer(loop, kind="loop", **facts, loop_direct_io=dio, notes=notes)

    def _before_writing(self, built: dict) -> None:
        """Called before every write of a layer: the files and loop devices built so far are
        still ours (SafetyError otherwise); a real disk we write a layer onto is wiped again at
        teardown, for the next run."""
        check_recorded_files(self.state.get("objects") or [], f"write to {built['device']}")
        if built.get("real_device"):
            self.record({"type": "wipe", "device": built["device"]})

    def _luks(self, layer: dict, stack: str, below: dict) -> dict:
        luks_type = layer.get("luks_type", "luks2")
        sector = int(layer.get("sector_size", 512))
        notes = []
        if luks_type == "luks1" and sector != 512:
            notes.append(f"luks1 supports only 512-byte sectors; plan asked {sector}")
            sector = 512
        name = self._dm_name(stack)
        key_file = write_key(self.key_dir, name)
        self.save()
        cipher = layer.get("cipher", "aes-xts-plain64")
        self._before_writing(below)
        log(f"  {stack}: luksFormat --type {luks_type} {cipher} on {below['device']}")
        cfg = {**layer, "sector_size": sector}
        argv = luks_format_argv(cfg, below["device"], key_file, luks_type)
        run_tool(argv, f"stack {stack}: luksFormat")
        if self._perf is None:
            self._perf = (cryptsetup_perf_flags(), crypt_target_version())
        applied, skipped = usable_perf_flags(list(layer.get("perf_flags") or []), *self._perf)
        for flag, why in skipped.items():
            notes.append(f"perf flag {flag} skipped: {why}")
        self.record({"type": "crypt", "name": name})
        argv = luks_open_argv(below["device"], name, key_file, applied)
        run_tool(argv, f"stack {stack}: cryptsetup open")
        device = f"/dev/mapper/{name}"
        status = parse_cryptsetup_status(
            run_tool(["cryptsetup", "status", name], f"stack {stack}: cryptsetup status").stdout
        )
        table = dm_table(name)
        if missing := [f for f in applied if table is not None and f not in table.split()]:
            notes.append(f"perf flags {missing} requested but not in the dm table")
        dump = luks_dump(below["device"], key_file, stack)
        log(f"  {stack}: {below['device']} -> {device} (dm-crypt {cipher}, flags {applied})")
        payload = {k: status.get(k) for k in ("offset_sectors", "size_sectors")}
        self.stack_luks.setdefault(
            stack, {"mapper": name, "underlying": below["device"], **payload}
        )
        return _block_layer(
            device,
            kind="luks",
            **luks_facts(layer, luks_type, sector),
            null_cipher=str(cipher) in NULL_CIPHERS,
            perf_flags_requested=list(layer.get("perf_flags") or []),
            perf_flags_applied=applied,
            perf_flags_skipped=skipped,
            mapper=device,
            payload_offset_sectors=status.get("offset_sectors"),
            cryptsetup_status=status,
            dm_table=table,
            luks_dump=dump,
            notes=notes,
            over=below["description"],
        )

    def _linear(self, layer: dict, stack: str) -> dict:
        luks = self.stack_luks.get(layer["like"])
        if luks is None:
            raise TestboxError(f"stack {stack}: stack {layer['like']!r} must be built first")
        if luks["offset_sectors"] is None or luks["size_sectors"] is None:
            raise TestboxError(
                f"stack {stack}: cryptsetup status of {luks['mapper']} lacks offset/size"
            )
        name = self._dm_name(stack)
        table = f"0 {luks['size_sectors']} linear {luks['underlying']} {luks['offset_sectors']}"
        self.record({"type": "dm", "name": name})
        run_tool(
            ["dmsetup", "create", name, "--table", table], f"stack {stack}: dmsetup create (linear)"
        )
        device = f"/dev/mapper/{name}"
        for _ in range(50):  # without udev the node may take a moment
            if os.path.exists(device):
                break
            time.sleep(0.1)
        log(f"  {stack}: {device} = dm-linear over the payload of {luks['mapper']}")
        return _block_layer(
            device,
            kind="linear",
            like=layer["like"],
            dm_table=dm_table(name) or table,
            underlying=luks["underlying"],
            offset_sectors=luks["offset_sectors"],
            size_sectors=luks["size_sectors"],
            note="same LBAs of the same device as the luks payload of " + layer["like"],
        )

    def _md(self, layer: dict, stack: str, members: list[dict]) -> dict:
        device = free_md_device()
        level, chunk = int(layer.get("level", 0)), int(layer.get("chunk_kib", 512))
        for m in members:
            self._before_writing(m)
        paths = [m["device"] for m in members]
        self.record({"type": "md", "device": device, "members": paths})
        log(f"  {stack}: mdadm --create {device} RAID-{level} chunk {chunk} KiB over {paths}")
        run_tool(mdadm_create_argv(device, level, chunk, paths), f"stack {stack}: mdadm --create")
        detail = run_quiet(["mdadm", "--detail", device])
        return _block_layer(
            device,
            kind="md",
            level=level,
            chunk_kib=chunk,
            md_device=device,
            assume_clean=True,
            note="--assume-clean: no initial resync runs during the measurements",
            mdstat=mdstat(),
            mdadm_detail=detail.stdout if detail is not None else None,
            members=[m["description"] for m in members],
        )

    def _fs(self, layer: dict, stack: str, below: dict) -> dict:
        fstype = layer.get("fstype", "ext4")
        mnt = safety.check_inside(self.scratch / f"mnt-{stack}", self.scratch)
        if safety.is_mounted(mnt):
            raise safety.SafetyError(f"{mnt} is already a mountpoint (run stack-down)")
        self._before_writing(below)
        log(f"  {stack}: mkfs.{fstype} {below['device']}")
        run_tool(mkfs_argv(fstype, below["device"]), f"stack {stack}: mkfs.{fstype}", timeout=3600)
        self.record({"type": "dir", "path": str(mnt)})
        mnt.mkdir(mode=0o700, exist_ok=True)
        self.record({"type": "mount", "path": str(mnt)})
        run_tool(["mount", "-t", fstype, "-o", "noatime", below["device"], str(mnt)], "mount")
        target = mnt / "fio.dat"
        vfs = os.statvfs(mnt)
        room = vfs.f_bavail * vfs.f_frsize
        size = int(layer.get("file_size_mib") or 0) * MIB or int(room * 0.9) // MIB * MIB
        if size > room:
            raise TestboxError(
                f"stack {stack}: file_size_mib {size // MIB} does not fit ({room // MIB} MiB free)"
            )
        made = self.record({"type": "file", "path": str(target)})
        made["identity"] = create_backing(target, size)
        self.save()
        log(f"  {stack}: {fstype} on {below['device']} mounted at {mnt}; target {target}")
        desc = {
            "kind": "fs",
            "fstype": fstype,
            "mkfs": " ".join(mkfs_argv(fstype, below["device"])),
        }
        desc.update(mount_options="noatime", file_size_bytes=size)
        desc.update(fs_size_bytes=vfs.f_blocks * vfs.f_frsize, over=below["description"])
        built = {"device": str(target), "device_type": "fsfile", "mountpoint": str(mnt)}
        return {**built, "size_bytes": size, "description": desc}


# --- teardown ------------------------------------------------------------------------------------


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


# --- building a plan's stacks ------------------------------------------------------------------


def build_order(plan: dict) -> list[str]:
    """Stacks in the order they can be built: a linear arm after the stack it covers."""
    order, stacks = baseline_first(plan), plan["stacks"]
    late = [n for n in order if isinstance(stacks[n], dict) and stacks[n]["kind"] == "linear"]
    return [n for n in order if n not in late] + late


def _layer_summary(desc: dict) -> str:
    """'luks aes-xts-plain64 on md raid0 [loop, loop]': the tree in one line."""
    kind = desc.get("kind")
    if kind == "luks":
        head = f"luks {desc.get('cipher')}"
    elif kind == "md":
        head = f"md raid{desc.get('level')}"
    elif kind == "fs":
        head = f"{desc.get('fstype')} file"
    elif kind in ("raw", "loop") and desc.get("device_name"):
        head = f"{kind} {desc['device_name']}"
    else:
        head = str(kind)
    if "members" in desc:
        return f"{head} [{', '.join(_layer_summary(m) for m in desc['members'])}]"
    if isinstance(desc.get("over"), dict):
        return f"{head} on {_layer_summary(desc['over'])}"
    return head


def build_kernel(plan: dict, state: dict, state_path: Path, device_checks: dict) -> dict:
    if any(layer["kind"] == "luks" for layer in plan_layers(plan)):
        state["key_dir"] = str(private_dir(Path(state["scratch_dir"]), ".luksbench-keys-"))
    write_json_atomic(state_path, state, mode=0o600)

    def save() -> None:
        write_json_atomic(state_path, state, mode=0o600)

    builder = KernelBuilder(plan, state, save, device_checks)
    described: dict[str, dict] = {}
    for name in build_order(plan):
        mark = len(state["objects"])
        try:
            built = builder.build(plan["stacks"][name], name)
        except (TestboxError, safety.SafetyError) as exc:
            if not plan["stacks"][name].get("optional") or name == plan["baseline"]:
                raise
            described[name] = _unavailable(name, plan, state, builder, mark, exc)
            save()
            continue
        keys = ("device", "device_type", "size_bytes", "mountpoint")
        state["stacks"][name].update({k: built.get(k) for k in keys})
        save()
        described[name] = _describe(plan["stacks"][name]["kind"], state["backend"], built)
    return {name: described[name] for name in state["order"]}


def _describe(kind: str, backend: str, built: dict) -> dict:
    """A built stack's description: its layer tree, and the facts of its luks and loop layers."""
    tree = built["description"]
    luks = first_layer(tree, "luks") or {}
    loop = first_layer(tree, "loop") or {}
    notes = [n for d in (tree, luks, loop) for n in d.get("notes", [])]
    return {
        "kind": kind,
        "backend": backend,
        "layout": _layer_summary(tree),
        **{k: luks.get(k) for k in ("cipher", "key_bits", "hash", "luks_type", "sector_size")},
        "perf_flags": luks.get("perf_flags_applied"),
        **{k: loop.get(k) for k in ("backing_file", "loop_device", "loop_direct_io")},
        "device": built["device"],
        "device_type": built["device_type"],
        "device_size_bytes": built["size_bytes"],
        "layers": tree,
        "notes": sorted(set(notes), key=notes.index),
    }


def _unavailable(name: str, plan: dict, state: dict, builder, mark: int, exc: Exception) -> dict:
    """An optional stack that cannot be built here: undo its objects, record why."""
    actions, errors = [], []
    undo(state["objects"][mark:], actions, errors)
    if errors:
        raise TestboxError(f"stack {name}: could not be built ({exc}) nor undone: {errors}")
    del state["objects"][mark:]
    # shared devices first built for this stack are gone again
    builder.shared = {k: v for k, v in builder.shared.items() if os.path.exists(v["device"])}
    builder.stack_luks.pop(name, None)
    reason = str(exc)
    state["stacks"][name]["unavailable"] = reason
    log(f"  {name}: UNAVAILABLE here, left out of the run: {reason}")
    return {
        "kind": plan["stacks"][name]["kind"],
        "backend": state["backend"],
        "unavailable": reason,
        "cipher": (first_layer(plan["stacks"][name], "luks") or {}).get("cipher"),
        "notes": [f"optional stack not built here: {reason}"],
    }
