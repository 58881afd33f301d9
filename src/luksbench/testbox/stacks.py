"""Bring the plan's storage stacks up and down.

Two backends, chosen by the plan (``auto`` picks kernel when it can):

``kernel``
    ``losetup --direct-io=on`` on a backing file; the plain arm is the loop device, the luks arm
    is ``cryptsetup open`` of the LUKS-formatted backing file's loop device onto
    ``/dev/mapper/luksbench-<run>-<stack>`` (dm-crypt). What real test boxes use.

``userspace``
    ``qemu-storage-daemon`` exports each backing file through FUSE (plain: the raw driver, luks:
    qemu's luks driver), so both arms take the same path. For machines without device-mapper
    (CI, containers). qemu 7.2's luks driver reads LUKS1 only, so this backend forces luks1.

STATE (``--state``) is written before anything is created and after every step, so that
``stack_down`` can always undo a partial ``stack_up``. It holds paths, pids and names, never key
material; the key is a random passphrase in a 0600 file in a 0700 directory under scratch_dir,
passed to tools by file only, and removed by ``stack_down``.

Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from luksbench.testbox import layers, lock, measure, safety
from luksbench.testbox.env import (
    TestboxError,
    log,
    resolve_plan_backend,
    tool_versions,
    userspace_compatible,
    utc_now,
    write_json_atomic,
)
from luksbench.testbox.env import run_tool as _run
from luksbench.testbox.layers import create_backing as _create_backing
from luksbench.testbox.layers import device_size, luks_format_argv
from luksbench.testbox.layers import write_key as _write_key
from luksbench.testbox.plan import device_uses, luks_layer, precondition_options, walk_layers

STATE_VERSION = 1
MIB = 1024 * 1024
BLKGETSIZE64 = 0x80081272
USERSPACE_LUKS_NOTE = (
    "userspace backend forces luks1: qemu-storage-daemon 7.2's luks block driver reads LUKS1 "
    "headers only (LUKS2 support arrived in later qemu versions)"
)


# --- small helpers -------------------------------------------------------------------------------


def _qemu_escape(value: str) -> str:
    """qemu option values escape ',' as ',,'."""
    return str(value).replace(",", ",,")


def stack_order(plan: dict) -> list[str]:
    """Baseline first, then the other stacks in plan order."""
    base = plan["baseline"]
    return [base, *[s for s in plan["stacks"] if s != base]]


def load_state(state_path: Path) -> dict:
    try:
        return json.loads(Path(state_path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TestboxError(f"{state_path}: cannot read stack state: {exc}") from exc


def _pid_state(pid: int) -> str | None:
    """Process state letter (R, S, Z, ...) or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()[0]


def pid_alive(pid: int | None) -> bool:
    return pid is not None and _pid_state(pid) not in (None, "Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def find_our_processes(
    markers: list[str], names=("qemu-storage-daemon", "fio"), exact: bool = False
) -> list[int]:
    """PIDs of qemu-storage-daemon / fio processes whose command line mentions one of ``markers``
    (our mountpoints, backing files; with ``exact``, whole arguments such as
    ``--filename=/dev/loop3``). Catches daemons whose pid never reached STATE and fio processes
    left by a killed run-fio."""
    found = []
    markers = [m for m in markers if m]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        argv = _cmdline(int(entry))
        if not argv or os.path.basename(argv[0]) not in names:
            continue
        joined = "\0".join(argv)
        hit = any(m in argv for m in markers) if exact else any(m in joined for m in markers)
        if hit and pid_alive(int(entry)):
            found.append(int(entry))
    return sorted(found)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


# --- command lines (pure functions; unit-tested) -------------------------------------------------


def qsd_argv(
    *,
    kind: str,
    backing: str | Path,
    mountpoint: str | Path,
    qmp_socket: str | Path,
    pidfile: str | Path,
    key_file: str | Path | None = None,
) -> list[str]:
    """qemu-storage-daemon exporting ``backing`` (raw, or through qemu's luks driver) via FUSE."""
    argv = [
        "qemu-storage-daemon",
        "--chardev",
        f"socket,id=qmp0,path={_qemu_escape(qmp_socket)},server=on,wait=off",
        "--monitor",
        "chardev=qmp0",
        "--blockdev",
        f"driver=file,node-name=file0,filename={_qemu_escape(backing)},cache.direct=on",
    ]
    if kind == "luks":
        if key_file is None:
            raise ValueError("luks export needs a key file")
        argv += [
            "--object",
            f"secret,id=sec0,file={_qemu_escape(key_file)},format=raw",
            "--blockdev",
            "driver=luks,node-name=dev0,file=file0,key-secret=sec0",
        ]
    else:
        argv += ["--blockdev", "driver=raw,node-name=dev0,file=file0"]
    argv += [
        "--export",
        f"type=fuse,id=exp0,node-name=dev0,mountpoint={_qemu_escape(mountpoint)},writable=on",
        "--pidfile",
        str(pidfile),
        "--daemonize",
    ]
    return argv


# --- QMP -----------------------------------------------------------------------------------------


def qmp_quit(sock_path: str, timeout: float = 5.0) -> None:
    """Ask qemu-storage-daemon to quit over its QMP monitor socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        f = s.makefile("rw")
        json.loads(f.readline())  # greeting
        for cmd in ("qmp_capabilities", "quit"):
            f.write(json.dumps({"execute": cmd}) + "\n")
            f.flush()
            while True:  # skip asynchronous events until the command's reply
                line = f.readline()
                if not line:
                    return  # daemon closed the socket: it is quitting
                reply = json.loads(line)
                if "error" in reply:
                    raise TestboxError(f"QMP {cmd}: {reply['error']}")
                if "return" in reply:
                    break


# --- stack-up ------------------------------------------------------------------------------------


def _private_dir(parent: Path, prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o700)
    return path


def _runtime_parent() -> str | None:
    """Short directory for QMP sockets and pid files (AF_UNIX paths are limited to 107 bytes)."""
    return "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else None


def _start_daemon(entry: dict, state: dict) -> None:
    mnt = Path(entry["mountpoint"])
    mnt.touch(mode=0o600)  # FUSE exports need an existing regular file as mountpoint
    argv = qsd_argv(
        kind=entry["kind"],
        backing=entry["backing_file"],
        mountpoint=mnt,
        qmp_socket=entry["daemon"]["qmp_socket"],
        pidfile=entry["daemon"]["pidfile"],
        key_file=entry.get("key_file"),
    )
    log(f"  {entry['stack']}: qemu-storage-daemon FUSE export -> {mnt}")
    _run(argv, f"stack {entry['stack']}: start qemu-storage-daemon", timeout=60)
    try:
        entry["daemon"]["pid"] = int(Path(entry["daemon"]["pidfile"]).read_text().strip())
    except (OSError, ValueError) as exc:
        raise TestboxError(
            f"stack {entry['stack']}: qemu-storage-daemon wrote no pid file: {exc}"
        ) from exc
    if not safety.is_mounted(mnt):
        raise TestboxError(f"stack {entry['stack']}: FUSE export {mnt} is not mounted after start")


def _precondition(entry: dict, ioengine: str, options: dict) -> dict:
    """Discard (where the device allows it), fill, optionally reach steady state: measure.py."""
    log(f"  {entry['stack']}: preconditioning {entry['size_bytes'] / MIB:.0f} MiB")
    record = measure.precondition(entry["device"], entry["size_bytes"], options, ioengine, log=log)
    log(f"  {entry['stack']}: preconditioned in {record['seconds']:.1f} s")
    return record


def _real_devices_used(plan: dict) -> dict[str, dict]:
    """The allowlisted real disks (``devices`` entries with a path) the stacks use."""
    used = device_uses(plan)
    return {
        name: spec
        for name, spec in plan.get("devices", {}).items()
        if "path" in spec and name in used
    }


def build_order(plan: dict) -> list[str]:
    """Stacks in the order they can be built: a linear arm after the stack it covers."""
    order = stack_order(plan)
    late = [
        n
        for n in order
        if isinstance(plan["stacks"][n], dict) and plan["stacks"][n]["kind"] == "linear"
    ]
    return [n for n in order if n not in late] + late


def stack_up(plan: dict, state_path: Path, describe_path: Path) -> dict:
    """Check every device, bring every stack up, precondition, write STATE and DESCRIBE.

    On any failure (or Ctrl-C) everything built so far is torn down before the error propagates.
    Returns the description.
    """
    state_path, describe_path = Path(state_path), Path(describe_path)
    run, host = safety.check_name(plan["run"], "run"), safety.check_name(plan["host"], "host")
    for name in plan["stacks"]:
        safety.check_name(name, "stack")
    if state_path.exists():
        raise TestboxError(
            f"{state_path} exists: stacks may still be up; run `luksbench testbox stack-down --state {state_path}` first"
        )
    backend = resolve_plan_backend(plan)
    if backend["selected"] is None:
        raise TestboxError(f"no usable backend: {backend['reason']}")
    log(f"luksbench testbox stack-up: backend {backend['selected']} ({backend['reason']})")

    scratch = safety.check_scratch_dir(plan["scratch_dir"])
    scratch.mkdir(parents=True, exist_ok=True)
    scratch = scratch.resolve()
    size = int(plan["device_size_mib"]) * MIB
    order = stack_order(plan)
    # Everything the stacks will use, checked before anything is created.
    device_checks: dict[str, dict] = {}
    if backend["selected"] == "kernel":
        device_checks = safety.check_devices(_real_devices_used(plan))
        for name in layers.planned_dm_names(plan, build_order(plan)):
            if os.path.exists(f"/dev/mapper/{name}"):
                raise safety.SafetyError(
                    f"device-mapper name {name} is already in use (/dev/mapper/{name}): another "
                    "run's or tool's device; luksbench leaves it alone (remove it, or choose "
                    "another run name)"
                )
    entries: dict[str, dict] = {}
    for name in order:
        cfg = plan["stacks"][name]
        kind = cfg.get("kind", "plain")
        entry = {
            "stack": name,
            "kind": kind,
            "device": None,
            "device_type": None,
            "size_bytes": None,
            "mountpoint": None,
        }
        if backend["selected"] == "userspace":
            if userspace_compatible({"stacks": {name: cfg}}):
                raise TestboxError(
                    f"stack {name}: the userspace backend builds only plain and luks arms on "
                    f"their own backing file, not {kind}: use the kernel backend"
                )
            backing = safety.check_inside(scratch / f"luksbench-{run}-{name}.img", scratch)
            entry.update(
                backing_file=str(backing),
                backing_size_bytes=size,
                daemon=None,
                key_file=None,
                mountpoint=str(
                    safety.check_inside(scratch / f"luksbench-{run}-{name}.fuse", scratch)
                ),
            )
            safety.check_free(mountpoint=Path(entry["mountpoint"]), backing=backing)
        entries[name] = entry

    state = {
        "version": STATE_VERSION,
        "run": run,
        "host": host,
        "backend": backend["selected"],
        "backend_reason": backend["reason"],
        "scratch_dir": str(scratch),
        "key_dir": None,
        "runtime_dir": None,
        "created": utc_now(),
        "complete": False,
        "order": order,
        "io_size_bytes": None,
        "stacks": entries,
        "objects": [],  # kernel backend: the undo log (layers.KernelBuilder)
    }
    # Before anything is created: one benchmark per test box (the state file is the lock's proof).
    lock.acquire(plan, state_path)
    write_json_atomic(state_path, state, mode=0o600)
    try:
        if state["backend"] == "kernel":
            described = _build_kernel(plan, state, state_path, device_checks)
        else:
            described = _build_userspace(plan, state, state_path, size)
        description = _finish(plan, state, state_path, described)
    except BaseException as exc:
        log(f"luksbench testbox stack-up: failed ({exc!r}); tearing down what was built")
        try:
            stack_down(state_path)
        except Exception as down_exc:
            log(f"luksbench testbox stack-up: teardown after failure also failed: {down_exc}")
        if isinstance(exc, TestboxError | safety.SafetyError):
            raise
        if isinstance(exc, Exception):
            raise TestboxError(f"stack-up failed: {exc}") from exc
        raise
    write_json_atomic(describe_path, description)
    log(
        f"luksbench testbox stack-up: {len(order)} stack(s) up; state {state_path}, description {describe_path}"
    )
    return description


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


def _first_luks(desc: dict) -> dict | None:
    if desc.get("kind") == "luks":
        return desc
    for child in ([desc["over"]] if isinstance(desc.get("over"), dict) else []) + list(
        desc.get("members") or []
    ):
        found = _first_luks(child)
        if found:
            return found
    return None


def _first_loop(desc: dict) -> dict | None:
    if desc.get("kind") == "loop":
        return desc
    for child in ([desc["over"]] if isinstance(desc.get("over"), dict) else []) + list(
        desc.get("members") or []
    ):
        found = _first_loop(child)
        if found:
            return found
    return None


def _build_kernel(plan: dict, state: dict, state_path: Path, device_checks: dict) -> dict:
    if any(
        isinstance(layer, dict) and layer["kind"] == "luks"
        for stack in plan["stacks"].values()
        for _, layer in walk_layers(stack, "")
    ):
        state["key_dir"] = str(_private_dir(Path(state["scratch_dir"]), ".luksbench-keys-"))
    write_json_atomic(state_path, state, mode=0o600)

    def save() -> None:
        write_json_atomic(state_path, state, mode=0o600)

    builder = layers.KernelBuilder(plan, state, save, device_checks)
    described: dict[str, dict] = {}
    for name in build_order(plan):
        entry = state["stacks"][name]
        mark = len(state["objects"])
        try:
            built = builder.build_stack(name)
        except (TestboxError, safety.SafetyError) as exc:
            if not plan["stacks"][name].get("optional") or name == plan["baseline"]:
                raise
            described[name] = _unavailable(name, plan, state, builder, mark, exc)
            save()
            continue
        entry.update(
            device=built["device"],
            device_type=built["device_type"],
            size_bytes=built["size_bytes"],
            mountpoint=built.get("mountpoint"),
        )
        save()
        tree = built["description"]
        luks = _first_luks(tree) or {}
        loop = _first_loop(tree) or {}
        notes = [n for d in (tree, luks, loop) for n in d.get("notes", [])]
        described[name] = {
            "kind": plan["stacks"][name]["kind"],
            "backend": state["backend"],
            "layout": _layer_summary(tree),
            "cipher": luks.get("cipher"),
            "key_bits": luks.get("key_bits"),
            "hash": luks.get("hash"),
            "luks_type": luks.get("luks_type"),
            "sector_size": luks.get("sector_size"),
            "perf_flags": luks.get("perf_flags_applied"),
            "backing_file": loop.get("backing_file"),
            "loop_device": loop.get("loop_device"),
            "loop_direct_io": loop.get("loop_direct_io"),
            "device": built["device"],
            "device_type": built["device_type"],
            "device_size_bytes": built["size_bytes"],
            "layers": tree,
            "notes": sorted(set(notes), key=notes.index),
        }
    return {name: described[name] for name in state["order"]}


def _unavailable(name: str, plan: dict, state: dict, builder, mark: int, exc: Exception) -> dict:
    """An optional stack that cannot be built here: undo its objects, record why."""
    actions: list[str] = []
    errors: list[str] = []
    layers.undo(state["objects"][mark:], actions, errors)
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
        "cipher": (luks_layer(plan, name) or {}).get("cipher"),
        "notes": [f"optional stack not built here: {reason}"],
    }


def _build_userspace(plan: dict, state: dict, state_path: Path, size: int) -> dict:
    scratch = Path(state["scratch_dir"])
    needs_key = any(e["kind"] == "luks" for e in state["stacks"].values())
    if needs_key:
        state["key_dir"] = str(_private_dir(scratch, ".luksbench-keys-"))
    state["runtime_dir"] = str(
        _private_dir(_runtime_parent() or tempfile.gettempdir(), "luksbench-")
    )
    write_json_atomic(state_path, state, mode=0o600)

    described: dict[str, dict] = {}
    for name in state["order"]:
        entry = state["stacks"][name]
        cfg = plan["stacks"][name]
        desc = {
            "kind": entry["kind"],
            "backend": state["backend"],
            "backing_file": entry["backing_file"],
            "backing_size_bytes": size,
            "notes": [],
        }
        backing = Path(entry["backing_file"])
        log(f"  {name}: backing file {backing} ({size // MIB} MiB, fully allocated)")
        _create_backing(backing, size)
        if entry["kind"] == "luks":
            luks_type = cfg.get("luks_type", "luks2")
            sector = int(cfg.get("sector_size", 512))
            if luks_type != "luks1":
                desc["notes"].append(USERSPACE_LUKS_NOTE)
                luks_type = "luks1"
            if sector != 512:
                desc["notes"].append(f"luks1 supports only 512-byte sectors; plan asked {sector}")
                sector = 512
            if cfg.get("perf_flags"):
                desc["notes"].append(
                    f"perf flags {cfg['perf_flags']} skipped: they are dm-crypt options and the "
                    "userspace backend does not use dm-crypt"
                )
            entry["key_file"] = str(_write_key(Path(state["key_dir"]), name))
            write_json_atomic(state_path, state, mode=0o600)
            log(f"  {name}: luksFormat --type {luks_type} {cfg.get('cipher', 'aes-xts-plain64')}")
            _run(
                luks_format_argv(cfg, backing, entry["key_file"], luks_type),
                f"stack {name}: luksFormat",
            )
            desc.update(
                cipher=cfg.get("cipher", "aes-xts-plain64"),
                key_bits=int(cfg.get("key_bits", 512)),
                hash=cfg.get("hash", "sha256"),
                luks_type=luks_type,
                luks_type_requested=cfg.get("luks_type", "luks2"),
                sector_size=sector,
                pbkdf="pbkdf2",
                pbkdf_iterations=int(cfg.get("pbkdf_iterations", 1000)),
            )
            dump = _run(["cryptsetup", "luksDump", str(backing)], f"stack {name}: luksDump").stdout
            if Path(entry["key_file"]).read_text() in dump:  # luksDump prints no key: belt, braces
                raise TestboxError(
                    f"stack {name}: luksDump output contains key material; refusing to keep it"
                )
            desc["luks_dump"] = dump
        else:
            desc.update(cipher=None, key_bits=None, hash=None, luks_type=None, sector_size=None)
        rt = Path(state["runtime_dir"])
        entry["daemon"] = {
            "pid": None,
            "qmp_socket": str(rt / f"{name}.qmp"),
            "pidfile": str(rt / f"{name}.pid"),
        }
        write_json_atomic(state_path, state, mode=0o600)
        _start_daemon(entry, state)
        entry["device"] = entry["mountpoint"]
        entry["device_type"] = "file"
        write_json_atomic(state_path, state, mode=0o600)
        entry["size_bytes"] = device_size(entry["device"])
        write_json_atomic(state_path, state, mode=0o600)
        desc.update(
            layout="plain file (FUSE)" if entry["kind"] == "plain" else "luks1 (qemu, FUSE)",
            device=entry["device"],
            device_type=entry["device_type"],
            device_size_bytes=entry["size_bytes"],
        )
        described[name] = desc
    return described


def _finish(plan: dict, state: dict, state_path: Path, described: dict) -> dict:
    """Common span, preconditioning, and the description every run records."""
    live = {n: e for n, e in state["stacks"].items() if not e.get("unavailable")}
    sizes = [e["size_bytes"] for e in live.values() if e["device_type"] != "rbd"]
    # Every fio run touches the same span on every stack (LUKS headers make luks devices smaller).
    io_size = min(sizes) // MIB * MIB if sizes else 0
    if sizes and io_size <= 0:
        raise TestboxError(
            f"devices are smaller than 1 MiB; raise device_size_mib (now {plan['device_size_mib']})"
        )
    state["io_size_bytes"] = io_size
    write_json_atomic(state_path, state, mode=0o600)

    ioengine = plan["fio"].get("ioengine", "libaio")
    options = precondition_options(plan["precondition"])
    for name in state["order"]:
        entry = state["stacks"][name]
        if entry.get("unavailable"):
            continue
        if options["enabled"] and entry["device_type"] != "rbd":
            described[name]["precondition"] = _precondition(entry, ioengine, options)
        else:
            described[name]["precondition"] = None
    state["complete"] = True
    write_json_atomic(state_path, state, mode=0o600)
    return {
        "run": state["run"],
        "host": state["host"],
        "created": utc_now(),
        "backend": state["backend"],
        "backend_reason": state["backend_reason"],
        "baseline": plan["baseline"],
        "order": state["order"],
        "io_size_bytes": io_size,
        "io_size_note": "every fio run uses --size=io_size_bytes (smallest device, whole MiB) on every stack",
        "tools": tool_versions(),
        "mdstat": layers.mdstat(),
        "stacks": described,
    }


# --- stack-down ----------------------------------------------------------------------------------


def _stop_daemon(entry: dict, actions: list[str]) -> None:
    daemon = entry.get("daemon") or {}
    markers = [entry.get("mountpoint"), entry.get("backing_file")]
    pids = set(find_our_processes(markers, names=("qemu-storage-daemon",)))
    pid = daemon.get("pid")
    if pid and pid_alive(pid) and any(m and m in "\0".join(_cmdline(pid)) for m in markers):
        pids.add(pid)
    for pid in sorted(pids):
        sock = daemon.get("qmp_socket")
        quit_ok = False
        if sock and os.path.exists(sock):
            try:
                qmp_quit(sock)
                quit_ok = _wait_gone(pid, 10)
            except (OSError, ValueError, TestboxError) as exc:
                log(f"  {entry['stack']}: QMP quit failed ({exc}); falling back to SIGTERM")
        if quit_ok:
            actions.append(f"{entry['stack']}: qemu-storage-daemon pid {pid} quit via QMP")
            continue
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if _wait_gone(pid, wait):
                actions.append(
                    f"{entry['stack']}: qemu-storage-daemon pid {pid} stopped by {sig.name}"
                )
                break


def _unmount(path: str, stack: str, actions: list[str]) -> None:
    if not safety.is_mounted(path):
        return
    for argv in (["fusermount3", "-u", path], ["umount", path], ["umount", "-l", path]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, check=False, timeout=30)
        if not safety.is_mounted(path):
            actions.append(f"{stack}: unmounted stale FUSE mount {path} ({argv[0]})")
            return


def _kill_fio(devices: list[str], actions: list[str]) -> None:
    markers = [f"--filename={d}" for d in devices if d]
    for pid in find_our_processes(markers, names=("fio",), exact=True):
        for sig, wait in ((signal.SIGINT, 5), (signal.SIGKILL, 5)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if _wait_gone(pid, wait):
                actions.append(f"stopped leftover fio pid {pid} ({sig.name})")
                break


def _remove_file(path: str | None, what: str, actions: list[str]) -> None:
    if path and os.path.lexists(path):
        os.unlink(path)
        actions.append(f"removed {what} {path}")


def _shred_keys(key_dir: str | None, actions: list[str]) -> None:
    if not key_dir or not os.path.isdir(key_dir):
        return
    for p in Path(key_dir).iterdir():
        with contextlib.suppress(OSError):
            if p.is_file() and not p.is_symlink():
                n = p.stat().st_size
                with open(p, "r+b") as f:
                    f.write(b"\0" * n)
                    f.flush()
                    os.fsync(f.fileno())
    shutil.rmtree(key_dir)
    actions.append(f"removed key directory {key_dir}")


def stack_down(state_path: str | Path, record_path: str | Path | None = None) -> dict:
    """Tear down everything STATE describes, verify nothing of ours is left, delete STATE.

    Idempotent: a missing STATE, or one whose stacks are already (partly) gone, is fine. Returns
    the record (also written to ``record_path`` if given); ``record["ok"]`` is False when a check
    failed, and then STATE is kept.
    """
    state_path = Path(state_path)
    started = utc_now()
    if not state_path.exists():
        log(
            f"luksbench testbox stack-down: {state_path} does not exist; nothing to tear down (already down)"
        )
        record = {
            "state": str(state_path),
            "started": started,
            "ended": utc_now(),
            "already_down": True,
            "state_found": False,
            "actions": [],
            "checks": {},
            "ok": True,
        }
        if record_path:
            write_json_atomic(Path(record_path), record)
        return record
    state = load_state(state_path)
    run = state["run"]
    stacks = [state["stacks"][n] for n in reversed(state.get("order") or list(state["stacks"]))]
    actions: list[str] = []
    errors: list[str] = []

    _kill_fio([e.get("device") for e in stacks], actions)
    # Userspace backend (and states written before the undo log): per-stack daemons and mounts.
    for entry in stacks:
        name = entry["stack"]
        try:
            if entry.get("daemon") is not None or (
                entry.get("mountpoint") and entry.get("device_type") in (None, "file")
            ):
                _stop_daemon(entry, actions)
                _unmount(entry["mountpoint"], name, actions)
                if not safety.is_mounted(entry["mountpoint"]):
                    _remove_file(entry["mountpoint"], f"{name} FUSE mountpoint file", actions)
            mapper = entry.get("mapper_name")
            if (
                mapper
                and mapper.startswith(safety.MAPPER_PREFIX)
                and os.path.exists(f"/dev/mapper/{mapper}")
            ):
                layers.undo([{"type": "crypt", "name": mapper}], actions, errors)
            if entry.get("backing_file"):
                layers.undo([{"type": "loop", "backing": entry["backing_file"]}], actions, errors)
        except Exception as exc:  # keep going: tear down as much as possible
            errors.append(f"{name}: {exc}")
    # Kernel backend: every recorded object, newest first.
    objects = state.get("objects") or []
    layers.undo(objects, actions, errors)

    try:
        _shred_keys(state.get("key_dir"), actions)
    except OSError as exc:
        errors.append(f"key directory: {exc}")
    for entry in stacks:
        try:
            _remove_file(entry.get("backing_file"), f"{entry['stack']} backing file", actions)
        except OSError as exc:
            errors.append(f"{entry['stack']}: backing file: {exc}")
    rt = state.get("runtime_dir")
    if rt and os.path.isdir(rt):
        shutil.rmtree(rt, ignore_errors=True)
        actions.append(f"removed runtime directory {rt}")

    # Verify.
    mounts = set(safety.mountpoints())
    ours_mounts = [
        e["mountpoint"]
        for e in stacks
        if e.get("mountpoint")
        and e.get("device_type") in (None, "file")
        and e["mountpoint"] in mounts
    ]
    markers = [e.get("mountpoint") for e in stacks] + [e.get("backing_file") for e in stacks]
    markers += [o.get("backing") for o in objects if o["type"] == "loop"]
    procs = find_our_processes(markers) + [
        e["daemon"]["pid"]
        for e in stacks
        if (e.get("daemon") or {}).get("pid")
        and pid_alive(e["daemon"]["pid"])
        and any(m and m in "\0".join(_cmdline(e["daemon"]["pid"])) for m in markers)
    ]
    left = layers.leftovers(objects)
    loops = sorted(
        set(
            safety.loop_devices_backed_by(
                [e["backing_file"] for e in stacks if e.get("backing_file")]
            )
        )
        | set(left["loop_devices"])
    )
    # Only mappings this run made count: a foreign device with a similar name is not ours.
    ours = {o["name"] for o in objects if o["type"] in ("crypt", "dm")}
    ours |= {e["mapper_name"] for e in stacks if e.get("mapper_name")}
    mappers = [
        n for n in safety.mapper_names_with_prefix(f"{safety.MAPPER_PREFIX}{run}-") if n in ours
    ]
    files_left = (
        [
            p
            for e in stacks
            for p in (e.get("backing_file"), e.get("key_file"))
            if p and os.path.lexists(p)
        ]
        + [
            e["mountpoint"]
            for e in stacks
            if e.get("mountpoint")
            and e.get("device_type") in (None, "file")
            and os.path.lexists(e["mountpoint"])
        ]
        + left["files"]
    )
    checks = {
        "no_mounts": not ours_mounts and not left["mounts"],
        "no_processes": not procs,
        "no_loop_devices": not loops,
        "no_mapper_devices": not mappers,
        "no_md_devices": not left["md_devices"],
        "no_key_dir": not (state.get("key_dir") and os.path.exists(state["key_dir"])),
        "no_files_left": not files_left,
    }
    details = {
        "mounts": ours_mounts + left["mounts"],
        "pids": sorted(set(procs)),
        "loop_devices": loops,
        "mapper_devices": mappers,
        "md_devices": left["md_devices"],
        "files": files_left,
    }
    ok = all(checks.values()) and not errors
    if ok and lock.release(state_path):
        actions.append("released the test box lock")
    record = {
        "state": str(state_path),
        "state_found": True,
        "run": run,
        "host": state.get("host"),
        "backend": state.get("backend"),
        "started": started,
        "ended": utc_now(),
        "already_down": not actions,
        "actions": actions,
        "errors": errors,
        "checks": checks,
        "leftovers": details,
        "ok": ok,
    }
    if record_path:
        write_json_atomic(Path(record_path), record)
    for a in actions:
        log(f"  {a}")
    if ok:
        state_path.unlink(missing_ok=True)
        log(
            "luksbench testbox stack-down: "
            + ("already down; nothing to do" if not actions else "all stacks down")
            + "; checks passed"
        )
    else:
        log(
            f"luksbench testbox stack-down: NOT clean: errors {errors}, failed checks "
            f"{[k for k, v in checks.items() if not v]}, leftovers {details}; keeping {state_path}"
        )
    return record
