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

import os
import secrets
import subprocess
import time
from pathlib import Path

from luksbench.testbox import safety
from luksbench.testbox.backends.kernel_tools import (
    crypt_target_version,
    cryptsetup_perf_flags,
    device_size,
    dm_table,
    free_md_device,
    losetup_argv,
    luks_dump,
    luks_facts,
    luks_format_argv,
    luks_open_argv,
    mdadm_create_argv,
    mdstat,
    mkfs_argv,
    parse_cryptsetup_status,
    usable_perf_flags,
)
from luksbench.testbox.backends.kernel_undo import leftovers as leftovers
from luksbench.testbox.backends.kernel_undo import undo
from luksbench.testbox.planbuild import MIB, NULL_CIPHERS, baseline_first, first_layer, plan_layers
from luksbench.testbox.sysutil import (
    QUIET,
    TestboxError,
    log,
    private_dir,
    run_quiet,
    run_tool,
    write_json_atomic,
)


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
            size = int(layer["size_mib"] or self.plan["device_size_mib"]) * MIB
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
            desc["client"] = layer["client"]
            desc["secure_mode"] = layer["secure_mode"]
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
        luks_type = layer["luks_type"]
        sector = int(layer["sector_size"])
        notes = []
        if luks_type == "luks1" and sector != 512:
            notes.append(f"luks1 supports only 512-byte sectors; plan asked {sector}")
            sector = 512
        name = self._dm_name(stack)
        key_file = write_key(self.key_dir, name)
        self.save()
        cipher = layer["cipher"]
        self._before_writing(below)
        log(f"  {stack}: luksFormat --type {luks_type} {cipher} on {below['device']}")
        cfg = {**layer, "sector_size": sector}
        argv = luks_format_argv(cfg, below["device"], key_file, luks_type)
        run_tool(argv, f"stack {stack}: luksFormat")
        if self._perf is None:
            self._perf = (cryptsetup_perf_flags(), crypt_target_version())
        applied, skipped = usable_perf_flags(list(layer["perf_flags"]), *self._perf)
        for flag, why in skipped.items():
            notes.append(f"perf flag {flag} skipped: {why}")
        self.record({"type": "crypt", "name": name})
        discards = bool(layer["allow_discards"])
        argv = luks_open_argv(below["device"], name, key_file, applied, discards)
        run_tool(argv, f"stack {stack}: cryptsetup open")
        device = f"/dev/mapper/{name}"
        status = parse_cryptsetup_status(
            run_tool(["cryptsetup", "status", name], f"stack {stack}: cryptsetup status").stdout
        )
        table = dm_table(name)
        options = [*applied, *(["allow_discards"] if discards else [])]
        if missing := [f for f in options if table is not None and f not in table.split()]:
            notes.append(f"dm-crypt options {missing} requested but not in the dm table")
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
            perf_flags_requested=list(layer["perf_flags"]),
            perf_flags_applied=applied,
            perf_flags_skipped=skipped,
            allow_discards=discards,
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
        level, chunk = int(layer["level"]), int(layer["chunk_kib"])
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
        fstype = layer["fstype"]
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
        size = int(layer["file_size_mib"]) * MIB or int(room * 0.9) // MIB * MIB
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
            if not plan["stacks"][name]["optional"] or name == plan["baseline"]:
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
