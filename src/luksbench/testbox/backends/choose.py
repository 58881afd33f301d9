"""Which backend builds the stacks on this machine (kernel or userspace), and why.
Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from luksbench.testbox.cephstack import split_plan
from luksbench.testbox.planbuild import NULL_CIPHERS, plan_layers
from luksbench.testbox.sysutil import read_text, run_quiet, which


def _proc_misc_has(name: str) -> bool:
    try:
        return any(line.split()[-1] == name for line in Path("/proc/misc").read_text().splitlines())
    except (OSError, IndexError):
        return False


def dm_crypt_status(try_modprobe: bool = True) -> dict:
    """Is the kernel's device-mapper with the crypt target usable here?"""
    status: dict = {"root": os.geteuid() == 0}
    dmsetup = which("dmsetup")

    def dm_present() -> bool:
        # dmsetup runs only where the control node exists: it would otherwise mknod it.
        status["dev_mapper_control"] = control = os.path.exists("/dev/mapper/control")
        status["proc_misc_device_mapper"] = _proc_misc_has("device-mapper")
        proc = run_quiet([dmsetup, "version"]) if dmsetup and control else None
        status["dmsetup_version_ok"] = bool(proc and proc.returncode == 0)
        return control and (status["dmsetup_version_ok"] or status["proc_misc_device_mapper"])

    def crypt_loaded() -> bool:
        if os.path.isdir("/sys/module/dm_crypt"):
            return True
        proc = run_quiet([dmsetup, "targets"]) if dmsetup and status["dev_mapper_control"] else None
        lines = proc.stdout.splitlines() if proc and proc.returncode == 0 else []
        return any(line.split()[:1] == ["crypt"] for line in lines)

    present, status["modprobe"] = dm_present(), None
    if not (present and crypt_loaded()) and try_modprobe and status["root"]:
        modprobe = which("modprobe")
        if modprobe is None:
            status["modprobe"] = "modprobe not installed"
        else:
            proc = run_quiet([modprobe, "dm_crypt"])
            exit_code = f"exit {proc.returncode}" if proc is not None else "failed"
            status["modprobe"] = f"modprobe dm_crypt {exit_code}"
            present = dm_present()
    status["crypt_target"] = crypt_loaded() if present else False
    ready = present and status["crypt_target"]
    status["available"] = bool(status["root"] and ready and which("cryptsetup"))
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


def md_status(try_modprobe: bool = True, levels: tuple[int, ...] = (0, 5)) -> dict:
    """Is the kernel's MD (software RAID) usable here, with the personalities the plan needs?"""
    personalities, modules = {0: "raid0", 5: "raid5"}, {0: "raid0", 5: "raid456"}

    def active() -> set[str]:
        lines = (read_text("/proc/mdstat") or "").splitlines()
        found = [line.split(":", 1)[1] for line in lines if line.startswith("Personalities")]
        return {p.strip("[]") for p in (found[0].split() if found else [])}

    status: dict = {"root": os.geteuid() == 0, "mdadm": which("mdadm") is not None, "modprobe": []}
    wanted = {personalities[lvl] for lvl in levels if lvl in personalities}
    lacking = not os.path.exists("/proc/mdstat") or wanted - active()
    if lacking and try_modprobe and status["root"]:
        modprobe = which("modprobe")
        for lvl in levels:
            if modprobe and personalities.get(lvl) not in active():
                proc = run_quiet([modprobe, modules[lvl]])
                ran = "failed to run" if proc is None else f"exit {proc.returncode}"
                status["modprobe"].append(f"modprobe {modules[lvl]}: {ran}")
    status["proc_mdstat"] = os.path.exists("/proc/mdstat")
    status["personalities"] = sorted(active())
    missing = sorted(wanted - set(status["personalities"]))
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
    status["available"] = status["reason"] == "MD available"  # every check above passed
    return status


def userspace_compatible(plan: dict) -> list[str]:
    """Why the userspace backend cannot build this plan (empty: it can): it exports whole backing
    files, plain or through qemu's luks driver (which has neither null cipher nor adiantum)."""
    why = []
    for name, stack in plan["stacks"].items():
        kind = stack.get("kind") if isinstance(stack, dict) else None
        cipher = str(stack.get("cipher", "")) if isinstance(stack, dict) else ""
        if kind not in ("plain", "luks") or "over" in stack:
            why.append(f"stack {name} ({kind}{' on another layer' if 'over' in stack else ''})")
        elif kind == "luks" and (cipher in NULL_CIPHERS or "adiantum" in cipher):
            why.append(
                f"stack {name} (cipher {cipher}: dm-crypt only, qemu's luks driver lacks it)"
            )
    return why


def resolve_backend(
    requested: str,
    try_modprobe: bool = True,
    needs_dm: bool = True,
    md_levels: tuple[int, ...] = (),
    userspace_blockers: list[str] | None = None,
) -> dict:
    """Which backend will be used and why (``selected`` None: none can be)."""
    dm = dm_crypt_status(try_modprobe=try_modprobe)
    md = md_status(try_modprobe=try_modprobe, levels=md_levels) if md_levels else None
    loop = os.path.exists("/dev/loop-control") and which("losetup") is not None
    missing = [t for t in ("qemu-storage-daemon", "fusermount3", "cryptsetup") if not which(t)]
    fuse = os.path.exists("/dev/fuse")
    us = {"available": not missing and fuse, "missing_tools": missing, "dev_fuse": fuse}
    if userspace_blockers:
        us = {**us, "available": False, "blocked_by": list(userspace_blockers)}
    kernel_ok = loop and (dm["available"] or not needs_dm) and (md is None or md["available"])
    if not loop:
        kernel_why = "no loop devices (/dev/loop-control or losetup missing)"
    elif needs_dm and not dm["available"]:
        kernel_why = _dm_reason(dm)
    elif md is not None and not md["available"]:
        kernel_why = md["reason"]
    elif needs_dm:
        md_ok = "; MD available" if md else ""
        kernel_why = f"device-mapper with dm-crypt and loop devices available{md_ok}"
    else:
        kernel_why = "loop devices available (no luks stack, so dm-crypt is not needed)"
    us_problems = [f"missing {tool}" for tool in us["missing_tools"]]
    us_problems += [] if us["dev_fuse"] else ["no /dev/fuse"]
    if us.get("blocked_by"):
        arms = "it builds only plain and luks-on-its-own-file arms"
        us_problems.append(f"{arms}, not {', '.join(us['blocked_by'])}")
    us_why = "qemu-storage-daemon with FUSE export available"
    if not us["available"]:
        us_why = "userspace backend unavailable: " + ", ".join(us_problems)
    if requested == "kernel":
        selected = "kernel" if kernel_ok else None
        reason = f"plan requests kernel; {kernel_why}"
    elif requested == "userspace":
        selected = "userspace" if us["available"] else None
        reason = f"plan requests userspace; {us_why}"
    elif kernel_ok:
        selected, reason = "kernel", f"auto: {kernel_why}"
    elif us["available"]:
        selected, how = "userspace", "using qemu-storage-daemon + FUSE"
        reason = f"auto: kernel backend unavailable ({kernel_why}); {how}"
    else:
        selected, reason = None, f"auto: kernel backend unavailable ({kernel_why}); {us_why}"
    facts = {"dm_crypt": dm, "md": md, "loop_devices": loop, "userspace": us}
    return {"requested": requested, "selected": selected, "reason": reason, **facts}


def resolve_plan_backend(plan: dict, try_modprobe: bool = True) -> dict:
    """:func:`resolve_backend` for what this plan's layers need."""
    plan = split_plan(plan)[0]  # Ceph arms: the backend builds only the layers under the OSDs
    layers = list(plan_layers(plan))
    needs_dm = any(lay["kind"] in ("luks", "linear") for lay in layers)
    levels = tuple(sorted({int(lay["level"]) for lay in layers if lay["kind"] == "md"}))
    return resolve_backend(
        plan["backend"], try_modprobe, needs_dm, levels, userspace_compatible(plan)
    )
