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


def run_tool(argv: list[str], what: str, timeout: float = 120) -> subprocess.CompletedProcess:
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


def md_status(try_modprobe: bool = True, levels: tuple[int, ...] = (0, 5)) -> dict:
    """Is the kernel's MD (software RAID) usable here, with the personalities the plan needs?"""
    personalities = {0: "raid0", 5: "raid5"}
    modules = {0: "raid0", 5: "raid456"}

    def active() -> set[str]:
        text = _read("/proc/mdstat") or ""
        for line in text.splitlines():
            if line.startswith("Personalities"):
                return {p.strip("[]") for p in line.split(":", 1)[1].split()}
        return set()

    status: dict = {"root": os.geteuid() == 0, "mdadm": which("mdadm") is not None, "modprobe": []}
    wanted = {personalities[lvl] for lvl in levels if lvl in personalities}
    if (
        (not os.path.exists("/proc/mdstat") or wanted - active())
        and try_modprobe
        and status["root"]
    ):
        modprobe = which("modprobe")
        for lvl in levels:
            if modprobe and personalities.get(lvl) not in active():
                proc = run_quiet([modprobe, modules[lvl]])
                status["modprobe"].append(
                    f"modprobe {modules[lvl]}: "
                    + ("failed to run" if proc is None else f"exit {proc.returncode}")
                )
    status["proc_mdstat"] = os.path.exists("/proc/mdstat")
    status["personalities"] = sorted(active())
    missing = sorted(wanted - set(status["personalities"]))
    status["available"] = bool(
        status["root"] and status["proc_mdstat"] and status["mdadm"] and not missing
    )
    if not status["root"]:
        status["reason"] = "not running as root"
    elif not status["proc_mdstat"]:
        status["reason"] = "no MD (software RAID) in this kernel (/proc/mdstat missing)"
    elif missing:
        status["reason"] = f"MD personalities {missing} not available"
    elif not status["mdadm"]:
        status["reason"] = "mdadm not installed"
    else:
        status["reason"] = "MD available"
    return status


def _plan_layers(plan: dict):
    from luksbench.testbox.plan import walk_layers

    for name, stack in plan["stacks"].items():
        for _, layer in walk_layers(stack, name):
            if isinstance(layer, dict):
                yield layer


def plan_md_levels(plan: dict) -> tuple[int, ...]:
    """RAID levels the plan's md layers use (empty: no MD needed)."""
    return tuple(
        sorted({int(lay.get("level", 0)) for lay in _plan_layers(plan) if lay["kind"] == "md"})
    )


def userspace_compatible(plan: dict) -> list[str]:
    """Why the userspace backend cannot build this plan (empty list: it can).

    It exports whole backing files through FUSE: only ``plain`` and a ``luks`` arm on its own
    backing file are possible; layers on devices, md, filesystems and dm-linear need the kernel."""
    why = []
    for name, stack in plan["stacks"].items():
        kind = stack.get("kind") if isinstance(stack, dict) else None
        if kind not in ("plain", "luks") or "over" in stack:
            why.append(f"stack {name} ({kind}{' on another layer' if 'over' in stack else ''})")
    return why


def resolve_backend(
    requested: str,
    try_modprobe: bool = True,
    needs_dm: bool = True,
    md_levels: tuple[int, ...] = (),
    userspace_blockers: list[str] | None = None,
) -> dict:
    """Which backend will be used and why. ``selected`` is None when none can be used.

    ``needs_dm``: the plan has a luks or linear layer (a plain-only plan needs loop devices only);
    ``md_levels``: RAID levels of its md layers; ``userspace_blockers``: the stacks the userspace
    backend cannot build (:func:`userspace_compatible`).
    """
    dm = dm_crypt_status(try_modprobe=try_modprobe)
    md = md_status(try_modprobe=try_modprobe, levels=md_levels) if md_levels else None
    loop = os.path.exists("/dev/loop-control") and which("losetup") is not None
    us = userspace_status()
    if userspace_blockers:
        us = {
            **us,
            "available": False,
            "blocked_by": list(userspace_blockers),
            "missing_tools": us["missing_tools"],
        }
    kernel_ok = loop and (dm["available"] or not needs_dm) and (md is None or md["available"])
    if not loop:
        kernel_why = "no loop devices (/dev/loop-control or losetup missing)"
    elif needs_dm and not dm["available"]:
        kernel_why = _dm_reason(dm)
    elif md is not None and not md["available"]:
        kernel_why = md["reason"]
    elif needs_dm:
        kernel_why = "device-mapper with dm-crypt and loop devices available" + (
            "; MD available" if md else ""
        )
    else:
        kernel_why = "loop devices available (no luks stack, so dm-crypt is not needed)"
    us_why = (
        "qemu-storage-daemon with FUSE export available"
        if us["available"]
        else "userspace backend unavailable: "
        + ", ".join(
            [f"missing {t}" for t in us["missing_tools"]]
            + ([] if us["dev_fuse"] else ["no /dev/fuse"])
            + (
                [
                    f"it builds only plain and luks-on-its-own-file arms, not {', '.join(us['blocked_by'])}"
                ]
                if us.get("blocked_by")
                else []
            )
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
        "md": md,
        "loop_devices": loop,
        "userspace": us,
    }


def plan_needs_dm(plan: dict) -> bool:
    return any(lay["kind"] in ("luks", "linear") for lay in _plan_layers(plan))


def resolve_plan_backend(plan: dict, try_modprobe: bool = True) -> dict:
    """:func:`resolve_backend` for what this plan's layers need."""
    return resolve_backend(
        plan["backend"],
        try_modprobe=try_modprobe,
        needs_dm=plan_needs_dm(plan),
        md_levels=plan_md_levels(plan),
        userspace_blockers=userspace_compatible(plan),
    )


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
    # Imported here: sysinfo uses this module's helpers.
    from luksbench.testbox.sysinfo import capture_system

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
        "backend": resolve_plan_backend(plan),
        "euid": os.geteuid(),
        # Identify the configured disks; with none (scratch files only) every disk lsblk lists.
        "system": capture_system(
            devices=[
                d["path"]
                for d in (plan.get("devices") or {}).values()
                if isinstance(d, dict) and d.get("path")
            ]
            or None,
            paths=[plan["scratch_dir"]] if plan.get("scratch_dir") else None,
        ),
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
