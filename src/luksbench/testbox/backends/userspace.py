"""Userspace backend for machines without device-mapper: ``qemu-storage-daemon`` exports each
backing file through FUSE (raw or through qemu's luks driver), so both arms take the same path.
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from luksbench.testbox import safety
from luksbench.testbox.backends.kernel import (
    create_backing,
    device_size,
    luks_dump,
    luks_facts,
    luks_format_argv,
    write_key,
)
from luksbench.testbox.planbuild import MIB
from luksbench.testbox.sysutil import (
    TestboxError,
    find_our_processes,
    log,
    private_dir,
    run_tool,
    runs_with,
    stop_process,
    wait_gone,
    write_json_atomic,
)

USERSPACE_LUKS_NOTE = (
    "userspace backend forces luks1: qemu-storage-daemon 7.2's luks block driver reads LUKS1 "
    "headers only (LUKS2 support arrived in later qemu versions)"
)


def _qemu_escape(value: str) -> str:
    """qemu option values escape ',' as ',,'."""
    return str(value).replace(",", ",,")


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
    qmp = f"socket,id=qmp0,path={_qemu_escape(qmp_socket)},server=on,wait=off"
    argv = ["qemu-storage-daemon", "--chardev", qmp, "--monitor", "chardev=qmp0", "--blockdev"]
    argv += [f"driver=file,node-name=file0,filename={_qemu_escape(backing)},cache.direct=on"]
    if kind == "luks":
        if key_file is None:
            raise ValueError("luks export needs a key file")
        argv += ["--object", f"secret,id=sec0,file={_qemu_escape(key_file)},format=raw"]
        argv += ["--blockdev", "driver=luks,node-name=dev0,file=file0,key-secret=sec0"]
    else:
        argv += ["--blockdev", "driver=raw,node-name=dev0,file=file0"]
    export = f"type=fuse,id=exp0,node-name=dev0,mountpoint={_qemu_escape(mountpoint)},writable=on"
    return [*argv, "--export", export, "--pidfile", str(pidfile), "--daemonize"]


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


def _start_daemon(entry: dict) -> None:
    mnt = Path(entry["mountpoint"])
    # FUSE exports need an existing regular file as mountpoint: a new one, never through a link.
    mnt.unlink(missing_ok=True)
    os.close(os.open(mnt, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    daemon, who = entry["daemon"], f"stack {entry['stack']}"
    files = {"backing": entry["backing_file"], "key_file": entry.get("key_file")}
    sockets = {"qmp_socket": daemon["qmp_socket"], "pidfile": daemon["pidfile"]}
    argv = qsd_argv(kind=entry["kind"], mountpoint=mnt, **files, **sockets)
    identity = entry.get("backing_identity")
    if identity is not None:
        safety.check_same_file(files["backing"], identity, f"export {files['backing']}")
    log(f"  {entry['stack']}: qemu-storage-daemon FUSE export -> {mnt}")
    run_tool(argv, f"{who}: start qemu-storage-daemon", timeout=60)
    try:
        daemon["pid"] = int(Path(daemon["pidfile"]).read_text().strip())
    except (OSError, ValueError) as exc:
        raise TestboxError(f"{who}: qemu-storage-daemon wrote no pid file: {exc}") from exc
    if identity is not None and not safety.process_has_open(daemon["pid"], identity):
        raise safety.SafetyError(
            f"{who}: qemu-storage-daemon pid {daemon['pid']} does not have the backing file "
            f"luksbench created open (device, inode {tuple(identity)}): it was swapped between "
            "the check and the start; refusing to write to the export"
        )
    if not safety.is_mounted(mnt):
        raise TestboxError(f"{who}: FUSE export {mnt} is not mounted after start")


def build_userspace(plan: dict, state: dict, state_path: Path, size: int) -> dict:
    """Every stack as a FUSE export of its own backing file; returns their descriptions."""
    if any(e["kind"] == "luks" for e in state["stacks"].values()):
        state["key_dir"] = str(private_dir(state["scratch_dir"], ".luksbench-keys-"))
    # A short directory for QMP sockets and pid files: AF_UNIX paths are limited to 107 bytes.
    run_dir = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else None
    state["runtime_dir"] = str(private_dir(run_dir or tempfile.gettempdir(), "luksbench-"))
    write_json_atomic(state_path, state, mode=0o600)
    described: dict[str, dict] = {}
    for name in state["order"]:
        entry = state["stacks"][name]
        desc = {"kind": entry["kind"], "backend": state["backend"]}
        desc.update(backing_file=entry["backing_file"], backing_size_bytes=size, notes=[])
        log(f"  {name}: backing file {entry['backing_file']} ({size // MIB} MiB, fully allocated)")
        entry["backing_identity"] = create_backing(Path(entry["backing_file"]), size)
        write_json_atomic(state_path, state, mode=0o600)
        if entry["kind"] == "luks":
            _format_luks1(plan["stacks"][name], entry, desc, state, state_path)
        else:
            desc.update(cipher=None, key_bits=None, hash=None, luks_type=None, sector_size=None)
        _export(entry, state, state_path)
        desc["layout"] = "plain file (FUSE)" if entry["kind"] == "plain" else "luks1 (qemu, FUSE)"
        desc.update(device=entry["device"], device_type=entry["device_type"])
        described[name] = {**desc, "device_size_bytes": entry["size_bytes"]}
    return described


def _format_luks1(cfg: dict, entry: dict, desc: dict, state: dict, state_path: Path) -> None:
    """luksFormat the backing file as qemu reads it (LUKS1, 512-byte sectors); notes say what of
    the plan's luks settings this backend cannot honour."""
    name, sector = entry["stack"], int(cfg["sector_size"])
    if cfg["luks_type"] != "luks1":
        desc["notes"].append(USERSPACE_LUKS_NOTE)
    if sector != 512:
        desc["notes"].append(f"luks1 supports only 512-byte sectors; plan asked {sector}")
    if cfg["perf_flags"]:
        desc["notes"].append(
            f"perf flags {cfg['perf_flags']} skipped: they are dm-crypt options and the "
            "userspace backend does not use dm-crypt"
        )
    if cfg["allow_discards"]:
        desc["notes"].append("allow_discards skipped: a dm-crypt open option (no dm-crypt here)")
    entry["key_file"] = str(write_key(Path(state["key_dir"]), name))
    write_json_atomic(state_path, state, mode=0o600)
    log(f"  {name}: luksFormat --type luks1 {cfg['cipher']}")
    backing, key_file = entry["backing_file"], entry["key_file"]
    with safety.opened_same_file(backing, entry["backing_identity"], f"luksFormat {backing}") as fd:
        argv = luks_format_argv(cfg, f"/dev/fd/{fd}", key_file, "luks1")
        run_tool(argv, f"stack {name}: luksFormat", pass_fds=(fd,))
    desc.update(luks_facts(cfg, "luks1", 512), luks_dump=luks_dump(backing, key_file, name))


def _export(entry: dict, state: dict, state_path: Path) -> None:
    """Start the stack's daemon; its FUSE file becomes the stack's device."""
    rt, name = Path(state["runtime_dir"]), entry["stack"]
    paths = {"qmp_socket": str(rt / f"{name}.qmp"), "pidfile": str(rt / f"{name}.pid")}
    entry["daemon"] = {"pid": None, **paths}
    write_json_atomic(state_path, state, mode=0o600)
    _start_daemon(entry)
    entry.update(device=entry["mountpoint"], device_type="file")
    write_json_atomic(state_path, state, mode=0o600)  # the daemon's pid, before anything can fail
    entry["size_bytes"] = device_size(entry["device"])
    write_json_atomic(state_path, state, mode=0o600)


def stop_daemon(entry: dict, actions: list[str]) -> None:
    daemon = entry.get("daemon") or {}
    markers = [entry.get("mountpoint"), entry.get("backing_file")]
    pids = set(find_our_processes(markers, names=("qemu-storage-daemon",)))
    if runs_with(daemon.get("pid"), markers):
        pids.add(daemon["pid"])
    for pid in sorted(pids):
        who = f"{entry['stack']}: qemu-storage-daemon pid {pid}"
        sock = daemon.get("qmp_socket")
        if sock and os.path.exists(sock):
            try:
                qmp_quit(sock)
                if wait_gone(pid, 10):
                    actions.append(f"{who} quit via QMP")
                    continue
            except (OSError, ValueError, TestboxError) as exc:
                log(f"  {entry['stack']}: QMP quit failed ({exc}); falling back to SIGTERM")
        if stopped_by := stop_process(pid, (signal.SIGTERM, signal.SIGKILL)):
            actions.append(f"{who} stopped by {stopped_by}")


def unmount(path: str, stack: str, actions: list[str]) -> None:
    if not safety.is_mounted(path):
        return
    for argv in (["fusermount3", "-u", path], ["umount", path], ["umount", "-l", path]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, check=False, timeout=30)
        if not safety.is_mounted(path):
            actions.append(f"{stack}: unmounted stale FUSE mount {path} ({argv[0]})")
            return
