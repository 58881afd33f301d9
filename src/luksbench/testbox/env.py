"""The test box's environment: what machine this is, which tools it has, which backend we use.

Also holds the small helpers the other test-box modules share (stderr progress, timestamps,
atomic JSON writes). Standard library only.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

TOOLS = ("fio", "cryptsetup", "qemu-storage-daemon", "losetup", "dmsetup", "fusermount3")


class TestboxError(RuntimeError):
    """A test-box step failed; the message says which and why."""

    __test__ = False  # not a pytest test class


# --- shared helpers ------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, fsync, chmod, rename into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj, mode: int = 0o644) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n", mode)


def run_quiet(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess | None:
    """Run a probe command; None when the tool is missing or hangs."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def which(tool: str) -> str | None:
    return shutil.which(tool) or next(
        (p for d in ("/usr/sbin", "/sbin") if os.access(p := f"{d}/{tool}", os.X_OK)), None
    )


# --- tools ---------------------------------------------------------------------------------------


def tool_version(tool: str) -> str | None:
    """First line of ``TOOL --version``. dmsetup is probed only where /dev/mapper/control exists:
    libdevmapper creates that node as a side effect when it is missing."""
    path = which(tool)
    if path is None:
        return None
    if tool == "dmsetup" and not os.path.exists("/dev/mapper/control"):
        # Even `dmsetup --version` mknods /dev/mapper/control; leave machines without DM alone.
        return f"{path} (version not probed: no /dev/mapper/control)"
    proc = run_quiet([path, "--version"])
    if proc is None:
        return None
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if text else None


def tool_versions() -> dict:
    versions = {tool: tool_version(tool) for tool in TOOLS}
    versions["python"] = sys.version.split()[0]
    return versions


# --- backend -------------------------------------------------------------------------------------


def _proc_misc_has(name: str) -> bool:
    try:
        return any(line.split()[-1] == name for line in Path("/proc/misc").read_text().splitlines())
    except (OSError, IndexError):
        return False


def dm_crypt_status(try_modprobe: bool = True) -> dict:
    """Is the kernel's device-mapper with the crypt target usable here?"""
    status: dict = {
        "root": os.geteuid() == 0,
        "dev_mapper_control": os.path.exists("/dev/mapper/control"),
        "proc_misc_device_mapper": _proc_misc_has("device-mapper"),
        "dmsetup_version_ok": False,
        "crypt_target": False,
        "modprobe": None,
    }
    dmsetup = which("dmsetup")

    def probe_dmsetup() -> None:
        # Only when the control node exists: dmsetup would otherwise mknod it as a side effect.
        if dmsetup and os.path.exists("/dev/mapper/control"):
            proc = run_quiet([dmsetup, "version"])
            status["dmsetup_version_ok"] = bool(proc and proc.returncode == 0)

    probe_dmsetup()

    def dm_present() -> bool:
        return status["dev_mapper_control"] and (
            status["dmsetup_version_ok"] or status["proc_misc_device_mapper"]
        )

    def crypt_loaded() -> bool:
        if os.path.isdir("/sys/module/dm_crypt"):
            return True
        if dmsetup and os.path.exists("/dev/mapper/control"):
            proc = run_quiet([dmsetup, "targets"])
            if proc and proc.returncode == 0:
                return any(line.split()[:1] == ["crypt"] for line in proc.stdout.splitlines())
        return False

    if not (dm_present() and crypt_loaded()) and try_modprobe and status["root"]:
        modprobe = which("modprobe")
        if modprobe is None:
            status["modprobe"] = "modprobe not installed"
        else:
            proc = run_quiet([modprobe, "dm_crypt"])
            status["modprobe"] = (
                "modprobe dm_crypt failed"
                if proc is None
                else f"modprobe dm_crypt exit {proc.returncode}"
            )
            status["dev_mapper_control"] = os.path.exists("/dev/mapper/control")
            status["proc_misc_device_mapper"] = _proc_misc_has("device-mapper")
            probe_dmsetup()
    status["crypt_target"] = crypt_loaded() if dm_present() else False
    status["available"] = bool(
        status["root"] and dm_present() and status["crypt_target"] and which("cryptsetup")
    )
    return status


def _dm_reason(dm: dict) -> str:
    if not dm["root"]:
        return "not running as root"
    if not dm["dev_mapper_control"]:
        return "no device-mapper in this kernel (/dev/mapper/control missing" + (
            f"; {dm['modprobe']})" if dm["modprobe"] else ")"
        )
    if not (dm["dmsetup_version_ok"] or dm["proc_misc_device_mapper"]):
        return "device-mapper driver not answering (dmsetup version failed, not in /proc/misc)"
    if not dm["crypt_target"]:
        return "device-mapper has no crypt target (dm_crypt not loaded)"
    if not which("cryptsetup"):
        return "cryptsetup not installed"
    return "device-mapper with dm-crypt available"


def userspace_status() -> dict:
    missing = [t for t in ("qemu-storage-daemon", "fusermount3", "cryptsetup") if not which(t)]
    fuse = os.path.exists("/dev/fuse")
    return {"available": not missing and fuse, "missing_tools": missing, "dev_fuse": fuse}


def resolve_backend(requested: str, try_modprobe: bool = True, needs_dm: bool = True) -> dict:
    """Which backend will be used and why. ``selected`` is None when none can be used.

    ``needs_dm``: the plan has a luks stack (a plain-only plan needs loop devices only).
    """
    dm = dm_crypt_status(try_modprobe=try_modprobe)
    loop = os.path.exists("/dev/loop-control") and which("losetup") is not None
    us = userspace_status()
    kernel_ok = loop and (dm["available"] or not needs_dm)
    if not loop:
        kernel_why = "no loop devices (/dev/loop-control or losetup missing)"
    elif needs_dm and not dm["available"]:
        kernel_why = _dm_reason(dm)
    elif needs_dm:
        kernel_why = "device-mapper with dm-crypt and loop devices available"
    else:
        kernel_why = "loop devices available (no luks stack, so dm-crypt is not needed)"
    us_why = (
        "qemu-storage-daemon with FUSE export available"
        if us["available"]
        else "userspace backend unavailable: "
        + ", ".join(
            [f"missing {t}" for t in us["missing_tools"]]
            + ([] if us["dev_fuse"] else ["no /dev/fuse"])
        )
    )
    selected: str | None
    if requested == "kernel":
        selected = "kernel" if kernel_ok else None
        reason = f"plan requests kernel; {kernel_why}"
    elif requested == "userspace":
        selected = "userspace" if us["available"] else None
        reason = f"plan requests userspace; {us_why}"
    elif kernel_ok:
        selected, reason = "kernel", f"auto: {kernel_why}"
    elif us["available"]:
        selected = "userspace"
        reason = (
            f"auto: kernel backend unavailable ({kernel_why}); using qemu-storage-daemon + FUSE"
        )
    else:
        selected, reason = None, f"auto: kernel backend unavailable ({kernel_why}); {us_why}"
    return {
        "requested": requested,
        "selected": selected,
        "reason": reason,
        "dm_crypt": dm,
        "loop_devices": loop,
        "userspace": us,
    }


def plan_needs_dm(plan: dict) -> bool:
    return any(cfg.get("kind") == "luks" for cfg in plan["stacks"].values())


# --- capture-env ---------------------------------------------------------------------------------


def _cpuinfo() -> dict:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info: dict = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if (
            sep
            and key in ("model name", "flags", "Features", "vendor_id", "microcode")
            and key not in info
        ):
            info[key] = value.strip()
    return info


def _meminfo() -> dict:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("MemTotal", "MemAvailable", "SwapTotal"):
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _kernel_crypto(names: tuple[str, ...] = ("xts(aes)", "aes", "cbc(aes)")) -> list[dict]:
    """Kernel crypto drivers for the ciphers dm-crypt would use, with priorities."""
    text = _read("/proc/crypto")
    if text is None:
        return []
    found = []
    for block in text.split("\n\n"):
        entry = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            entry[key.strip()] = value.strip()
        if entry.get("name") in names:
            found.append(
                {k: entry.get(k) for k in ("name", "driver", "module", "priority", "type")}
            )
    return found


def capture_env(plan: dict) -> dict:
    cpu = _cpuinfo()
    flags = (cpu.get("flags") or cpu.get("Features") or "").split()
    uname = platform.uname()
    vuln_dir = Path("/sys/devices/system/cpu/vulnerabilities")
    mitigations = {}
    if vuln_dir.is_dir():
        for p in sorted(vuln_dir.iterdir()):
            mitigations[p.name] = _read(str(p))
    return {
        "captured": utc_now(),
        "hostname": socket.gethostname(),
        "kernel": {
            "sysname": uname.system,
            "release": uname.release,
            "version": uname.version,
            "machine": uname.machine,
        },
        "cmdline": _read("/proc/cmdline"),
        "cpu": {
            "model": cpu.get("model name"),
            "vendor": cpu.get("vendor_id"),
            "microcode": cpu.get("microcode"),
            "count": os.cpu_count(),
            "aes": "aes" in flags,
            "vaes": "vaes" in flags,
            "avx2": "avx2" in flags,
            "avx512f": "avx512f" in flags,
            "vpclmulqdq": "vpclmulqdq" in flags,
            "flags": flags,
        },
        "memory_bytes": _meminfo(),
        "mitigations": mitigations,
        "kernel_crypto": _kernel_crypto(),
        "tools": tool_versions(),
        "backend": resolve_backend(plan["backend"], needs_dm=plan_needs_dm(plan)),
        "euid": os.geteuid(),
        "plan": plan,
    }


# --- benchmark-ciphers ---------------------------------------------------------------------------


def benchmark_ciphers(out: Path, extra_args: list[str] | None = None) -> int:
    """Run ``cryptsetup benchmark``; its output goes verbatim (stderr interleaved) into ``out``.

    A non-zero exit (e.g. ciphers the kernel crypto API does not offer) is recorded on stderr
    but is not a failure of this step. Returns the tool's exit code.
    """
    cryptsetup = which("cryptsetup")
    if cryptsetup is None:
        raise TestboxError("cryptsetup is not installed; cannot run `cryptsetup benchmark`")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [cryptsetup, "benchmark", *(extra_args or [])]
    log(f"luksbench testbox: running {' '.join(argv[1:])} (takes ~15 s) ...")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, check=False)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log(f"luksbench testbox: cryptsetup benchmark exit code {proc.returncode}; output in {out}")
    return proc.returncode
