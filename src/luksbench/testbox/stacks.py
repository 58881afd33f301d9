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
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from luksbench.testbox import lock, safety
from luksbench.testbox.env import (
    TestboxError,
    log,
    plan_needs_dm,
    resolve_backend,
    tool_versions,
    utc_now,
    write_json_atomic,
)

STATE_VERSION = 1
MIB = 1024 * 1024
BLKGETSIZE64 = 0x80081272
USERSPACE_LUKS_NOTE = (
    "userspace backend forces luks1: qemu-storage-daemon 7.2's luks block driver reads LUKS1 "
    "headers only (LUKS2 support arrived in later qemu versions)"
)


# --- small helpers -------------------------------------------------------------------------------


def _run(argv: list[str], what: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a tool; raise TestboxError with its stderr on failure. Never logs key material:
    keys only ever travel in files, so argv is safe to print."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise TestboxError(f"{what}: {argv[0]} not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise TestboxError(f"{what}: `{' '.join(argv)}` timed out after {timeout} s") from exc
    if proc.returncode != 0:
        raise TestboxError(
            f"{what}: `{' '.join(argv)}` exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
        )
    return proc


def _qemu_escape(value: str) -> str:
    """qemu option values escape ',' as ',,'."""
    return str(value).replace(",", ",,")


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
    try:
        proc = subprocess.run(
            ["losetup", "-J", "-l", loop], capture_output=True, text=True, check=False, timeout=30
        )
        dev = json.loads(proc.stdout)["loopdevices"][0]
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError, IndexError):
        return None
    dio = dev.get("dio")
    return dio if isinstance(dio, bool) else (str(dio) == "1" if dio is not None else None)


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


def losetup_argv(backing: str | Path) -> list[str]:
    return ["losetup", "--direct-io=on", "--show", "-f", str(backing)]


def luks_format_argv(
    cfg: dict, target: str | Path, key_file: str | Path, luks_type: str
) -> list[str]:
    argv = [
        "cryptsetup",
        "luksFormat",
        "--batch-mode",
        "--type",
        luks_type,
        "--cipher",
        str(cfg.get("cipher", "aes-xts-plain64")),
        "--key-size",
        str(int(cfg.get("key_bits", 512))),
        "--hash",
        str(cfg.get("hash", "sha256")),
    ]
    if luks_type == "luks2":
        argv += ["--sector-size", str(int(cfg.get("sector_size", 512)))]
    argv += [
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        str(int(cfg.get("pbkdf_iterations", 1000))),
        "--key-file",
        str(key_file),
        str(target),
    ]
    return argv


def luks_open_argv(device: str | Path, name: str, key_file: str | Path) -> list[str]:
    return ["cryptsetup", "open", "--type", "luks", "--key-file", str(key_file), str(device), name]


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


def precondition_argv(device: str | Path, size: int, ioengine: str, name: str) -> list[str]:
    return [
        "fio",
        "--output-format=json",
        f"--name={name}",
        f"--filename={device}",
        "--rw=write",
        "--bs=1m",
        "--iodepth=8",
        f"--ioengine={ioengine}",
        "--direct=1",
        f"--size={size}",
        "--numjobs=1",
        "--group_reporting",
    ]


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


def _write_key(key_dir: Path, stack: str) -> Path:
    """A random 64-character hex passphrase (qemu secrets must be UTF-8), mode 0600, no newline."""
    path = key_dir / f"{stack}.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
        f.flush()
        os.fsync(f.fileno())
    return path


def _create_backing(path: Path, size: int) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _precondition(entry: dict, ioengine: str) -> dict:
    dev, size = entry["device"], entry["size_bytes"]
    log(
        f"  {entry['stack']}: preconditioning {size / MIB:.0f} MiB (sequential 1 MiB direct writes)"
    )
    t0 = time.monotonic()
    proc = _run(
        precondition_argv(dev, size, ioengine, f"precondition-{entry['stack']}"),
        f"stack {entry['stack']}: precondition",
        timeout=24 * 3600,
    )
    seconds = time.monotonic() - t0
    result = {"bytes": size, "bs": "1m", "seconds": round(seconds, 3)}
    with contextlib.suppress(ValueError, KeyError, IndexError):
        job = json.loads(proc.stdout[proc.stdout.index("{") :])["jobs"][0]
        result["io_bytes"] = job["write"]["io_bytes"]
        result["bw_bytes"] = job["write"]["bw_bytes"]
        if job.get("error"):
            raise TestboxError(f"stack {entry['stack']}: precondition fio error {job['error']}")
    log(f"  {entry['stack']}: preconditioned in {seconds:.1f} s")
    return result


def stack_up(plan: dict, state_path: Path, describe_path: Path) -> dict:
    """Create backing files, bring every stack up, precondition, write STATE and DESCRIBE.

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
    backend = resolve_backend(plan["backend"], needs_dm=plan_needs_dm(plan))
    if backend["selected"] is None:
        raise TestboxError(f"no usable backend: {backend['reason']}")
    log(f"luksbench testbox stack-up: backend {backend['selected']} ({backend['reason']})")

    scratch = safety.check_scratch_dir(plan["scratch_dir"])
    scratch.mkdir(parents=True, exist_ok=True)
    scratch = scratch.resolve()
    size = int(plan["device_size_mib"]) * MIB
    order = stack_order(plan)
    # Everything the stacks will use, checked before anything is created.
    entries: dict[str, dict] = {}
    for name in order:
        cfg = plan["stacks"][name]
        kind = cfg.get("kind", "plain")
        if kind not in ("plain", "luks"):
            raise TestboxError(f"stack {name}: kind must be plain or luks, not {kind!r}")
        backing = safety.check_inside(scratch / f"luksbench-{run}-{name}.img", scratch)
        entry = {
            "stack": name,
            "kind": kind,
            "backing_file": str(backing),
            "backing_size_bytes": size,
            "device": None,
            "device_type": None,
            "size_bytes": None,
            "loop_device": None,
            "mapper_name": None,
            "mountpoint": None,
            "daemon": None,
            "key_file": None,
        }
        if backend["selected"] == "kernel":
            if kind == "luks":
                entry["mapper_name"] = safety.mapper_name(run, name)
        else:
            entry["mountpoint"] = str(
                safety.check_inside(scratch / f"luksbench-{run}-{name}.fuse", scratch)
            )
        safety.check_free(
            mapper=entry["mapper_name"],
            mountpoint=Path(entry["mountpoint"]) if entry["mountpoint"] else None,
            backing=backing,
        )
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
    }
    # Before anything is created: one benchmark per test box (the state file is the lock's proof).
    lock.acquire(plan, state_path)
    write_json_atomic(state_path, state, mode=0o600)
    try:
        description = _build(plan, state, state_path, size)
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


def _build(plan: dict, state: dict, state_path: Path, size: int) -> dict:
    scratch = Path(state["scratch_dir"])
    needs_key = any(e["kind"] == "luks" for e in state["stacks"].values())
    if needs_key:
        state["key_dir"] = str(_private_dir(scratch, ".luksbench-keys-"))
    if state["backend"] == "userspace":
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
            if state["backend"] == "userspace" and luks_type != "luks1":
                desc["notes"].append(USERSPACE_LUKS_NOTE)
                luks_type = "luks1"
            if luks_type == "luks1" and sector != 512:
                desc["notes"].append(f"luks1 supports only 512-byte sectors; plan asked {sector}")
                sector = 512
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
        else:
            desc.update(cipher=None, key_bits=None, hash=None, luks_type=None, sector_size=None)

        if state["backend"] == "kernel":
            loop = _run(losetup_argv(backing), f"stack {name}: losetup").stdout.strip()
            entry["loop_device"] = loop
            write_json_atomic(state_path, state, mode=0o600)
            dio = loop_direct_io(loop)
            desc["loop_device"], desc["loop_direct_io"] = loop, dio
            if dio is not True:
                desc["notes"].append(
                    f"{loop}: direct I/O to the backing file is {'off' if dio is False else 'unknown'} "
                    "(filesystem without O_DIRECT?); the page cache sits under this stack"
                )
            log(f"  {name}: {backing.name} -> {loop} (direct I/O {'on' if dio else 'NOT on'})")
            if entry["kind"] == "luks":
                _run(
                    luks_open_argv(loop, entry["mapper_name"], entry["key_file"]),
                    f"stack {name}: cryptsetup open",
                )
                entry["device"] = f"/dev/mapper/{entry['mapper_name']}"
                log(f"  {name}: {loop} -> {entry['device']} (dm-crypt)")
            else:
                entry["device"] = loop
            entry["device_type"] = "block"
        else:
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
            device=entry["device"],
            device_type=entry["device_type"],
            device_size_bytes=entry["size_bytes"],
        )
        described[name] = desc

    # Every fio run touches the same span on every stack (LUKS headers make luks devices smaller).
    io_size = min(e["size_bytes"] for e in state["stacks"].values()) // MIB * MIB
    if io_size <= 0:
        raise TestboxError(
            f"devices are smaller than 1 MiB; raise device_size_mib (now {plan['device_size_mib']})"
        )
    state["io_size_bytes"] = io_size
    write_json_atomic(state_path, state, mode=0o600)

    ioengine = plan["fio"].get("ioengine", "libaio")
    for name in state["order"]:
        entry = state["stacks"][name]
        if plan["precondition"]:
            described[name]["precondition"] = _precondition(entry, ioengine)
        else:
            described[name]["precondition"] = None
        if entry["kind"] == "luks":
            dump = _run(
                ["cryptsetup", "luksDump", entry["backing_file"]], f"stack {name}: luksDump"
            ).stdout
            key = Path(entry["key_file"]).read_text()
            if key in dump:  # belt and braces: luksDump without --dump-*-key prints no key
                raise TestboxError(
                    f"stack {name}: luksDump output contains key material; refusing to keep it"
                )
            described[name]["luks_dump"] = dump
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
    for entry in stacks:
        name = entry["stack"]
        try:
            if entry.get("mountpoint"):
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
                for attempt in range(10):
                    proc = subprocess.run(
                        ["cryptsetup", "close", mapper], capture_output=True, text=True, check=False
                    )
                    if proc.returncode == 0 or not os.path.exists(f"/dev/mapper/{mapper}"):
                        actions.append(f"{name}: cryptsetup close {mapper}")
                        break
                    time.sleep(0.2 * (attempt + 1))
                else:
                    errors.append(
                        f"{name}: cryptsetup close {mapper} failed: {proc.stderr.strip()}"
                    )
            for loop in safety.loop_devices_backed_by([entry["backing_file"]]):
                proc = subprocess.run(
                    ["losetup", "-d", loop], capture_output=True, text=True, check=False
                )
                if proc.returncode == 0:
                    actions.append(f"{name}: losetup -d {loop}")
                else:
                    errors.append(f"{name}: losetup -d {loop} failed: {proc.stderr.strip()}")
        except Exception as exc:  # keep going: tear down as much as possible
            errors.append(f"{name}: {exc}")

    try:
        _shred_keys(state.get("key_dir"), actions)
    except OSError as exc:
        errors.append(f"key directory: {exc}")
    for entry in stacks:
        try:
            _remove_file(entry["backing_file"], f"{entry['stack']} backing file", actions)
        except OSError as exc:
            errors.append(f"{entry['stack']}: backing file: {exc}")
    rt = state.get("runtime_dir")
    if rt and os.path.isdir(rt):
        shutil.rmtree(rt, ignore_errors=True)
        actions.append(f"removed runtime directory {rt}")

    # Verify.
    mounts = set(safety.mountpoints())
    ours_mounts = [
        e["mountpoint"] for e in stacks if e.get("mountpoint") and e["mountpoint"] in mounts
    ]
    markers = [e.get("mountpoint") for e in stacks] + [e.get("backing_file") for e in stacks]
    procs = find_our_processes(markers) + [
        e["daemon"]["pid"]
        for e in stacks
        if (e.get("daemon") or {}).get("pid")
        and pid_alive(e["daemon"]["pid"])
        and any(m and m in "\0".join(_cmdline(e["daemon"]["pid"])) for m in markers)
    ]
    loops = safety.loop_devices_backed_by([e["backing_file"] for e in stacks])
    mappers = safety.mapper_names_with_prefix(f"{safety.MAPPER_PREFIX}{run}-")
    leftovers = [
        p
        for e in stacks
        for p in (e["backing_file"], e.get("mountpoint"), e.get("key_file"))
        if p and os.path.lexists(p)
    ]
    checks = {
        "no_mounts": not ours_mounts,
        "no_processes": not procs,
        "no_loop_devices": not loops,
        "no_mapper_devices": not mappers,
        "no_key_dir": not (state.get("key_dir") and os.path.exists(state["key_dir"])),
        "no_files_left": not leftovers,
    }
    details = {
        "mounts": ours_mounts,
        "pids": sorted(set(procs)),
        "loop_devices": loops,
        "mapper_devices": mappers,
        "files": leftovers,
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
