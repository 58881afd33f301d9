"""Before any device is touched (the workflow's first rule): are the tools the plan needs
installed, and does the scratch directory hold its backing files? Standard library only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from luksbench.testbox.backends.choose import resolve_plan_backend, userspace_compatible
from luksbench.testbox.planbuild import plan_layers, precondition_options
from luksbench.testbox.sysutil import which

# tool -> (Debian/Ubuntu package, Fedora package)
PACKAGES = {
    "fio": ("fio", "fio"),
    "cryptsetup": ("cryptsetup-bin", "cryptsetup"),
    "qemu-storage-daemon": ("qemu-system-common", "qemu-storage-daemon"),
    "fusermount3": ("fuse3", "fuse3"),
    "losetup": ("mount", "util-linux"),
    "mdadm": ("mdadm", "mdadm"),
    "dmsetup": ("dmsetup", "device-mapper"),
    "mkfs.ext4": ("e2fsprogs", "e2fsprogs"),
    "mkfs.xfs": ("xfsprogs", "xfsprogs"),
    "wipefs": ("util-linux", "util-linux"),
    "blkdiscard": ("util-linux", "util-linux"),
    "blkid": ("util-linux", "util-linux"),
}


class MissingTools(RuntimeError):
    """Tools the plan needs are not installed; the message lists each with install hints."""


def required_tools(plan: dict, backend: str | None) -> dict[str, str]:
    """Tool -> why this plan needs it, for the backend that will build its stacks."""
    tools = {
        "fio": "runs every measurement",
        "cryptsetup": "runs `cryptsetup benchmark` and formats the luks stacks",
    }
    layers = list(plan_layers(plan))
    kinds = {layer["kind"] for layer in layers}
    if backend == "kernel":
        tools["losetup"] = "attaches the backing files as loop devices"
        if "md" in kinds:
            tools["mdadm"] = "creates and stops the md (software RAID) layers"
        if "linear" in kinds:
            tools["dmsetup"] = "creates the dm-linear arm"
        for fstype in sorted({lay["fstype"] for lay in layers if lay["kind"] == "fs"}):
            tools[f"mkfs.{fstype}"] = f"makes the {fstype} filesystem of the fs layers"
        if any("path" in dev for dev in plan.get("devices", {}).values()):
            tools["blkid"] = "checks real disks for signatures before anything is written"
            tools["wipefs"] = "checks real disks for signatures and wipes ours at teardown"
        if precondition_options(plan["precondition"]).get("discard"):
            tools["blkdiscard"] = "discards every device before the preconditioning fill"
    elif backend == "userspace":
        tools["qemu-storage-daemon"] = "exports the backing files (and decrypts luks) over FUSE"
        tools["fusermount3"] = "unmounts the FUSE exports at teardown"
    return tools


def missing_tools(plan: dict, backend: str | None, path: str | None = None) -> dict[str, str]:
    locate = which if path is None else lambda tool: shutil.which(tool, path=path)
    return {tool: why for tool, why in required_tools(plan, backend).items() if not locate(tool)}


def install_hint(tools) -> str:
    debian = " ".join(sorted({PACKAGES[t][0] for t in tools}))
    fedora = " ".join(sorted({PACKAGES[t][1] for t in tools}))
    return f"  Debian/Ubuntu: sudo apt-get install {debian}\n  Fedora:        sudo dnf install {fedora}"


def check_tools(plan: dict, path: str | None = None) -> dict:
    """Resolve the backend and check every tool it needs; :class:`MissingTools` names each
    missing one, why it is needed and how to install it."""
    resolution = resolve_plan_backend(plan)
    backend = resolution["selected"]
    # With no usable backend: the tools of the one asked for (auto: userspace, if it can).
    auto = "kernel" if userspace_compatible(plan) else "userspace"
    wanted = backend or (plan["backend"] if plan["backend"] != "auto" else auto)
    if missing := missing_tools(plan, wanted, path=path):
        lines = [f"missing tools for run {plan['run']!r} (backend {wanted}):"]
        lines += [f"  {tool}: {why}" for tool, why in missing.items()]
        lines += ["Install them with:", install_hint(missing)]
        raise MissingTools("\n".join(lines))
    if backend is None:
        raise MissingTools(f"no backend can build the stacks here: {resolution['reason']}")
    return resolution


class NoSpace(RuntimeError):
    """The scratch directory cannot hold the plan's backing files."""


def scratch_space_needed(plan: dict) -> int:
    """Bytes of the (fully allocated) backing files of the plan's stacks and scratch devices."""
    mib = sum(
        int(lay.get("size_mib") or plan["device_size_mib"])
        for lay in plan_layers(plan)
        if lay["kind"] in ("plain", "loop") or (lay["kind"] == "luks" and "over" not in lay)
    )
    mib += sum(int(d["size_mib"]) for d in plan.get("devices", {}).values() if "size_mib" in d)
    return mib * 1024 * 1024


def check_scratch_space(plan: dict) -> None:
    """Refuse a plan whose backing files would not fit, naming the directory and the numbers."""
    directory = Path(plan["scratch_dir"])
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    fs = os.statvfs(existing)
    free = fs.f_bavail * fs.f_frsize
    needed = scratch_space_needed(plan)
    if free < needed:
        raise NoSpace(
            f"scratch_dir {directory} has {free // 2**20} MiB free, but the backing files of "
            f"{len(plan['stacks'])} stacks (device_size_mib {plan['device_size_mib']}, devices' "
            f"size_mib) need {needed // 2**20} MiB: lower device_size_mib / size_mib or point "
            "scratch_dir at a larger filesystem"
        )
