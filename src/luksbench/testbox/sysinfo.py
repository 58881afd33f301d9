"""The storage and system facts a result depends on (block devices and queues, disk identity,
CPU frequency and mitigations, MD and device-mapper state), captured into env.json.

A missing tool or file is recorded with the reason, never an error. Nothing here writes to a
device or puts key material into env.json. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from luksbench.testbox.probes import POWERCAP_ROOT, rapl_unavailable_reason, read_rapl
from luksbench.testbox.sysutil import QUIET, read_text, tool_env, which, whole_disk

KEY_STRIPPED = "<key stripped>"
TOOL_TIMEOUT_S = 30
PROBE_TOOLS = ("lsblk", "nvme", "smartctl", "dmsetup", "cryptsetup")
# Queue attributes that change how a device performs (the scheduler is parsed separately).
QUEUE_ATTRS = ("rotational", "logical_block_size", "physical_block_size", "nr_requests")
QUEUE_ATTRS += ("max_sectors_kb", "read_ahead_kb", "discard_max_bytes", "write_cache", "nomerges")
QUEUE_ATTRS += ("rq_affinity", "add_random")
# dm-integrity optional arguments that carry a key: "<name>:<algorithm>:<key>".
_INTEGRITY_KEY_ARG = re.compile(r"^((?:internal_hash|journal_crypt|journal_mac):[^:]+):.+$")
_NUMBER = re.compile(r"^\d+\Z")
VULNERABILITIES = "/sys/devices/system/cpu/vulnerabilities"


def _target_index(tokens: list[str]) -> int | None:
    """Index of ``<start>`` in a table line: 0, or 1 after dmsetup's ``<name>:`` prefix."""
    for i in (0, 1):
        numbers = len(tokens) >= i + 3 and _NUMBER.match(tokens[i]) and _NUMBER.match(tokens[i + 1])
        if numbers and (i == 0 or tokens[0].endswith(":")):
            return i
    return None


def _strip_line(line: str) -> str:
    tokens = line.split()
    i = _target_index(tokens)
    target = tokens[i + 2] if i is not None else None
    if target == "crypt":
        if len(tokens) < i + 5:
            return " ".join(tokens[: i + 3]) + " <crypt arguments withheld: unparsed>"
        tokens[i + 4] = KEY_STRIPPED
        return " ".join(tokens)
    if target == "integrity":
        return " ".join(_INTEGRITY_KEY_ARG.sub(rf"\1:{KEY_STRIPPED}", t) for t in tokens)
    if target is None and "crypt" in line:
        # A line we cannot parse that mentions crypt could hold a key: keep only that it existed.
        return "<line withheld: mentions crypt but is not a parsable table line>"
    return line


def strip_dm_table_keys(text: str) -> str:
    """``dmsetup table`` output with every key removed: a crypt line's key field whatever its form
    (hex, ``-``, or a keyring reference, which names where the key lives), the key part of
    integrity's hash/journal arguments; a line mentioning crypt that does not parse is withheld."""
    stripped = "\n".join(_strip_line(line) for line in text.splitlines())
    return stripped + ("\n" if text.endswith("\n") else "")


def _absent(reason: str) -> dict:
    return {"status": "absent", "reason": reason}


def _tool(argv: list[str], parse_json: bool = False, ok_codes: tuple[int, ...] = (0,)) -> dict:
    """Run a read-only probe; the record says what ran and what came back (never raises)."""
    path = which(argv[0])
    if path is None:
        return _absent(f"{argv[0]} not installed")
    try:
        proc = subprocess.run([path, *argv[1:]], timeout=TOOL_TIMEOUT_S, env=tool_env(), **QUIET)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"status": "failed", "argv": argv, "error": str(exc)}
    rec: dict = {"status": "ok", "argv": argv, "exit": proc.returncode}
    if proc.returncode not in ok_codes:
        rec.update(status="failed", stderr=proc.stderr.strip())
    if parse_json:
        try:
            rec["data"] = json.loads(proc.stdout)
        except json.JSONDecodeError as exc:
            rec.update(status="failed", error=f"output is not JSON: {exc}")
            rec["stdout"] = proc.stdout[:4000]
    else:
        rec["text"] = proc.stdout
    return rec


def parse_scheduler(text: str) -> dict:
    """``/sys/block/X/queue/scheduler`` -> selected (the one in brackets) and available."""
    names = text.split()
    selected = next((n[1:-1] for n in names if n.startswith("[") and n.endswith("]")), None)
    return {"selected": selected, "available": [n.strip("[]") for n in names]}


def block_queues(sys_block: str | Path = "/sys/block") -> dict:
    """Every block device's scheduler and queue limits, keyed by kernel name."""
    out = {}
    root = Path(sys_block)
    for dev in sorted(root.iterdir()) if root.is_dir() else []:
        queue = dev / "queue"
        sched = read_text(queue / "scheduler")
        entry: dict = {"scheduler": parse_scheduler(sched) if sched is not None else None}
        entry.update({attr: read_text(queue / attr) for attr in QUEUE_ATTRS})
        slaves = dev / "slaves"
        if slaves.is_dir():
            entry["slaves"] = sorted(p.name for p in slaves.iterdir())
        out[dev.name] = entry
    return out


def disk_of_path(path: str | Path) -> dict:
    """The block device holding the file system of ``path`` (its nearest existing ancestor)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    st_dev = os.stat(p).st_dev
    majmin = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    sys_dir = Path(f"/sys/dev/block/{majmin}")
    if not sys_dir.exists():
        return {"path": str(path), "dev": majmin, "block_device": None, "disk": None}
    real = sys_dir.resolve()
    disk = whole_disk(real).name
    return {"path": str(path), "dev": majmin, "block_device": real.name, "disk": disk}


def _disks_from_lsblk(lsblk: dict) -> list[str]:
    """Whole physical-looking disks lsblk lists (not zram/ram, which say nothing about storage)."""
    devices = (lsblk.get("data") or {}).get("blockdevices") or []
    disks = [d for d in devices if d.get("type") == "disk" and d.get("path")]
    return [d["path"] for d in disks if not str(d.get("name", "")).startswith(("zram", "ram"))]


def identify_devices(devices: list[str]) -> dict:
    """``nvme id-ctrl -o json`` (nvme devices) and ``smartctl -i -j`` per device."""
    out = {}
    for dev in devices:
        real = os.path.realpath(dev)
        entry: dict = {"resolved": real}
        if not os.path.exists(real):
            out[dev] = {**entry, "error": f"{dev} does not exist"}
            continue
        if os.path.basename(real).startswith("nvme"):
            entry["nvme_id_ctrl"] = _tool(["nvme", "id-ctrl", "-o", "json", real], parse_json=True)
        # smartctl's exit status is a bit mask; bits 0-1 are command-line/open failures.
        ok = tuple(c for c in range(256) if not c & 0b11)
        entry["smartctl"] = _tool(["smartctl", "-i", "-j", real], parse_json=True, ok_codes=ok)
        out[dev] = entry
    return out


def cpufreq(sys_cpu: str | Path = "/sys/devices/system/cpu") -> dict:
    """Frequency governor and driver of each CPU, plus turbo/boost switches where the driver has them."""
    root = Path(sys_cpu)
    governors, drivers = {}, set()
    for cpu in sorted(root.glob("cpu[0-9]*"), key=lambda p: int(p.name[3:])):
        gov = read_text(cpu / "cpufreq" / "scaling_governor")
        if gov is not None:
            governors[cpu.name] = gov
            drivers.add(read_text(cpu / "cpufreq" / "scaling_driver"))
    if not governors:
        return _absent(f"no cpufreq under {root} (no frequency scaling driver, or a VM)")
    return {
        "status": "ok",
        "governors": governors,
        "governors_in_use": sorted(set(governors.values())),
        "drivers": sorted(d for d in drivers if d),
        "intel_pstate_status": read_text(root / "intel_pstate" / "status"),
        "intel_pstate_no_turbo": read_text(root / "intel_pstate" / "no_turbo"),
        "cpufreq_boost": read_text(root / "cpufreq" / "boost"),
    }


def cpu_vulnerabilities(vuln_dir: str | Path = VULNERABILITIES) -> dict:
    root = Path(vuln_dir)
    if not root.is_dir():
        return _absent(f"{root} not present")
    return {p.name: read_text(p) for p in sorted(root.iterdir())}


def dm_table() -> dict:
    """``dmsetup table`` with keys stripped (only where /dev/mapper/control exists: dmsetup would
    create it)."""
    if not os.path.exists("/dev/mapper/control"):
        return _absent("no /dev/mapper/control (no device-mapper in this kernel)")
    rec = _tool(["dmsetup", "table"])
    if "text" in rec:
        rec["text"] = strip_dm_table_keys(rec["text"])
        rec["keys"] = "every crypt/integrity key field replaced by " + KEY_STRIPPED
    if "stderr" in rec:
        rec["stderr"] = strip_dm_table_keys(rec["stderr"])
    return rec


def luksbench_mappings(mapper_dir: str | Path = "/dev/mapper") -> dict:
    """``cryptsetup status`` of every /dev/mapper/luksbench-* mapping (it prints no key)."""
    root = Path(mapper_dir)
    names = sorted(p.name for p in root.glob("luksbench-*")) if root.is_dir() else []
    return {name: _tool(["cryptsetup", "status", name]) for name in names}


def capture_system(
    devices: list[str] | None = None,
    paths: list[str] | None = None,
    powercap_root: str | Path = POWERCAP_ROOT,
) -> dict:
    """Storage and system facts of this machine. ``devices``: the disks to identify (None: every
    disk lsblk lists); ``paths``: directories whose underlying disk is recorded."""
    lsblk = _tool(["lsblk", "-J", "-O"], parse_json=True)
    if devices is None:
        devices = _disks_from_lsblk(lsblk)
    rapl = read_rapl(powercap_root)
    md = _absent("no /proc/mdstat (no MD RAID in this kernel)")
    if (mdstat := read_text("/proc/mdstat")) is not None:
        md = {"status": "ok", "text": mdstat}
    return {
        "tools": {t: which(t) for t in PROBE_TOOLS},
        "lsblk": lsblk,
        "block_queues": block_queues(),
        "paths": [disk_of_path(p) for p in paths or []],
        "identify": identify_devices(devices),
        "cpufreq": cpufreq(),
        "cmdline": read_text("/proc/cmdline"),
        "cpu_vulnerabilities": cpu_vulnerabilities(),
        "mdstat": md,
        "dm_table": dm_table(),
        "cryptsetup_status": luksbench_mappings(),
        "rapl": (
            {"status": "ok", "zones": [{"zone": z["zone"], "name": z["name"]} for z in rapl]}
            if rapl
            else _absent(rapl_unavailable_reason(powercap_root) or "no RAPL reading")
        ),
    }
