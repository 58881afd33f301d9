"""fio's job options (numjobs, CPU pinning, io_uring extras) and the sysfs facts they rest on.
Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from luksbench.testbox.sysinfo import parse_scheduler
from luksbench.testbox.sysutil import read_text, whole_disk

SYS = Path("/sys")
IO_URING_ONLY = ("fixedbufs", "registerfiles", "hipri")


def block_dir(path: str, sys_root: Path = SYS) -> Path | None:
    """The sysfs directory of the block device ``path`` is (or, for a file, lives on)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = st.st_rdev if Path(path).is_block_device() else st.st_dev
    where = sys_root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}"
    return where.resolve() if where.exists() else None


def numa_node(sysdir: Path | None) -> int | None:
    """The NUMA node of a device's hardware: its own ``device/numa_node`` or, for dm and md, the
    first node found below it (``slaves``); None when sysfs names none (loop, virtual, -1)."""
    if sysdir is None:
        return None
    disk = whole_disk(sysdir)
    node = read_text(disk / "device" / "numa_node")
    if node is None:  # nvme namespaces: the controller's node is one level up
        node = read_text(disk / "device" / "device" / "numa_node")
    if node is not None and node.lstrip("-").isdigit() and int(node) >= 0:
        return int(node)
    slaves = disk / "slaves"
    below = (numa_node(p.resolve()) for p in sorted(slaves.iterdir())) if slaves.is_dir() else ()
    return next((n for n in below if n is not None), None)


def queue_facts(path: str, sys_root: Path = SYS) -> dict:
    """NUMA node, hardware queue count, scheduler and poll queues of the device under ``path``."""
    sysdir = block_dir(path, sys_root)
    if sysdir is None:
        return {"device": path, "block_device": None, "numa_node": None}
    disk = whole_disk(sysdir)
    mq = disk / "mq"
    return {
        "device": path,
        "block_device": disk.name,
        "numa_node": numa_node(sysdir),
        "queues": len(list(mq.iterdir())) if mq.is_dir() else None,
        "scheduler": parse_scheduler(read_text(disk / "queue" / "scheduler") or "")["selected"],
        "io_poll": read_text(disk / "queue" / "io_poll") == "1",
        "nvme_poll_queues": read_text(sys_root / "module" / "nvme" / "parameters" / "poll_queues"),
    }


def job_setup(cell: dict, devices: dict, sys_root: Path = SYS) -> dict:
    """fio arguments for ``cell``'s job options (``args``), decided once for all its stacks
    (``devices``: stack -> device or None) so both arms of a pair run alike (an option one
    device lacks is skipped on all), and the record of what they did (``skipped``: why not)."""
    facts = {s: queue_facts(d, sys_root) if d else {"numa_node": None} for s, d in devices.items()}
    nodes = {s: f["numa_node"] for s, f in facts.items()}
    cpus, skipped = cell["cpus_allowed"], {}
    if cell["numa_pin"] and not cpus:
        lacking = next((s for s, n in nodes.items() if n is None), None)
        if lacking is None and len(set(nodes.values())) == 1:  # the node's CPU list
            node = next(iter(nodes.values()))
            cpus = read_text(sys_root / f"devices/system/node/node{node}/cpulist") or ""
        if not cpus:
            skipped["numa_pin"] = (
                f"stack {lacking}: sysfs names no NUMA node of {devices[lacking]}"
                if lacking is not None
                else f"the stacks' devices share no NUMA node with CPUs ({nodes})"
            )
    args = [f"--cpus_allowed={cpus}", f"--cpus_allowed_policy={cell['cpus_allowed_policy']}"]
    args = args if cpus else []
    unpolled = next((s for s, f in facts.items() if not f.get("io_poll")), None)
    for option in (o for o in IO_URING_ONLY if cell[o]):
        if cell["ioengine"] != "io_uring":
            skipped[option] = f"ioengine {cell['ioengine']} has no {option} (io_uring only)"
        elif option == "hipri" and unpolled is not None:
            skipped[option] = (
                f"stack {unpolled}: {devices[unpolled]} has no poll queues (queue/io_poll is not 1)"
            )
        else:
            args.append(f"--{option}=1")
    return {
        "args": args,
        "numjobs": cell["numjobs"],
        "numa_nodes": nodes,
        "cpus_allowed": cpus,
        "cpus_allowed_policy": cell["cpus_allowed_policy"] if cpus else "",
        "skipped": skipped,
    }


def device_facts(plan: dict, cell: dict, sys_root: Path = SYS) -> list[dict]:
    """:func:`queue_facts` of every disk the plan names (else of the scratch directory's), with
    the CPUs the main matrix's fio jobs run on there (``job_cpus``)."""
    paths = [d["path"] for d in (plan.get("devices") or {}).values() if d.get("path")]
    if not paths and plan.get("scratch_dir"):
        scratch = Path(plan["scratch_dir"])
        paths = [str(next(p for p in (scratch, *scratch.parents) if p.exists()))]
    cpus = job_setup(cell, {p: p for p in paths}, sys_root)["cpus_allowed"]
    return [{**queue_facts(path, sys_root), "job_cpus": cpus} for path in paths]
