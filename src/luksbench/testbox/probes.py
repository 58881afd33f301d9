"""Probes beside each fio run: CPU time from ``/proc/stat`` and energy from RAPL.

CPU: deltas of the aggregate ``cpu`` line of ``/proc/stat`` (busy = user + nice + system + irq +
softirq + steal; iowait counts as idle), over a fio run and over an idle interval (the baseline the
analysis can subtract).

Energy: RAPL counters under ``/sys/class/powercap/intel-rapl:*`` (Intel, and AMD on kernels whose
rapl driver covers it). Since Linux 5.10 ``energy_uj`` is readable by root only; when the counters
are absent or unreadable every reading is ``None`` and nothing fails. Standard library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from luksbench.testbox.sysutil import TestboxError

STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")
POWERCAP_ROOT = "/sys/class/powercap"


def read_proc_stat(path: str | Path = "/proc/stat") -> dict[str, int]:
    """The aggregate ``cpu`` line of /proc/stat in clock ticks, keyed by :data:`STAT_FIELDS`."""
    with open(path) as f:
        for line in f:
            if line.startswith("cpu "):
                values = [int(v) for v in line.split()[1 : len(STAT_FIELDS) + 1]]
                values += [0] * (len(STAT_FIELDS) - len(values))
                return dict(zip(STAT_FIELDS, values, strict=True))
    raise TestboxError(f"{path} has no aggregate cpu line")


def cpu_delta(before: dict, after: dict, interval_s: float) -> dict:
    """CPU time spent between two :func:`read_proc_stat` readings, in seconds (all CPUs summed).

    ``busy_pct`` is busy time over all time counted (100 % = every CPU busy)."""
    clk = os.sysconf("SC_CLK_TCK")
    delta = {k: (after[k] - before[k]) / clk for k in STAT_FIELDS}
    busy = sum(delta[k] for k in BUSY_FIELDS)
    total = sum(delta.values())
    return {
        "interval_s": round(interval_s, 6),
        "clk_tck": clk,
        "cpu_count": os.cpu_count(),
        "delta_s": {k: round(v, 6) for k, v in delta.items()},
        "busy_s": round(busy, 6),
        "busy_pct": round(100.0 * busy / total, 3) if total > 0 else None,
    }


def idle_baseline(seconds: float = 2.0, rapl_root: str | Path = POWERCAP_ROOT) -> dict:
    """CPU (and RAPL energy, when readable) over ``seconds`` of doing nothing: the box's own load.

    Same fields as the per-rep CPU sidecar; taken once per run-fio session, before its first fio
    run, so a busy box (a stray process, writeback after preconditioning) shows up in the record."""
    before, rapl_before, t0 = read_proc_stat(), read_rapl(rapl_root), time.monotonic()
    time.sleep(seconds)
    t1, after, rapl_after = time.monotonic(), read_proc_stat(), read_rapl(rapl_root)
    return {
        **cpu_delta(before, after, t1 - t0),
        "window": (
            f"idle interval of {seconds:g} s before the first fio run of the session; aggregate "
            "cpu line of /proc/stat; iowait counts as idle"
        ),
        "rapl": rapl_delta(rapl_before, rapl_after, t1 - t0),
    }


def read_rapl(root: str | Path = POWERCAP_ROOT) -> list[dict] | None:
    """One reading of every RAPL zone (``intel-rapl:N`` packages and ``intel-rapl:N:M`` subzones).

    Each: zone, name (package-0, core, uncore, dram, psys), energy_uj, max_energy_range_uj.
    None when there are no zones or none is readable (non-root on Linux >= 5.10, VMs)."""
    root = Path(root)
    try:
        zone_dirs = sorted(p for p in root.glob("intel-rapl:*") if p.is_dir())
    except OSError:
        return None
    zones = []
    for d in zone_dirs:
        try:
            zone = {"zone": d.name, "name": (d / "name").read_text().strip()}
            for counter in ("energy_uj", "max_energy_range_uj"):
                zone[counter] = int((d / counter).read_text())
        except (OSError, ValueError):
            continue  # unreadable zone: leave it out rather than guess
        zones.append(zone)
    return zones or None


def rapl_unavailable_reason(root: str | Path = POWERCAP_ROOT) -> str | None:
    """Why :func:`read_rapl` returns None here (None when it does not)."""
    root = Path(root)
    zone_dirs = sorted(root.glob("intel-rapl:*")) if root.is_dir() else []
    if not zone_dirs:
        return f"no RAPL zones under {root} (no intel_rapl/powercap driver, or a VM)"
    if read_rapl(root) is None:
        why = "unreadable"
        try:
            (zone_dirs[0] / "energy_uj").read_text()
        except OSError as exc:
            why = exc.strerror or str(exc)
        return f"RAPL counters under {root} are not readable ({why}; root only since Linux 5.10)"
    return None


def rapl_delta(
    before: list[dict] | None, after: list[dict] | None, interval_s: float
) -> dict | None:
    """Energy per zone between two :func:`read_rapl` readings, in joules and watts.

    A counter that went down wrapped once: ``max_energy_range_uj`` is added (``wrapped: true``).
    More than one wrap within the interval cannot be seen (the range is ~262 kJ on most packages,
    about 45 minutes at 100 W). ``package_joules`` sums the top-level ``package-*`` zones (their
    core/uncore/dram subzones are parts of them, psys is the whole platform); None without any.
    Returns None when either reading is None or they share no zone."""
    if before is None or after is None:
        return None
    previous = {z["zone"]: z for z in before}
    zones = []
    for z in after:
        b = previous.get(z["zone"])
        if b is None:
            continue
        delta_uj = z["energy_uj"] - b["energy_uj"]
        wrapped = delta_uj < 0
        if wrapped:
            delta_uj += z["max_energy_range_uj"]
        joules = delta_uj / 1e6
        watts = round(joules / interval_s, 6) if interval_s > 0 else None
        zone = {"zone": z["zone"], "name": z["name"], "joules": round(joules, 6), "watts": watts}
        zones.append({**zone, "wrapped": wrapped})
    if not zones:
        return None
    packages = [z for z in zones if z["name"].startswith("package") and z["zone"].count(":") == 1]
    joules = sum(z["joules"] for z in packages) if packages else None
    watts = round(joules / interval_s, 6) if joules is not None and interval_s > 0 else None
    return {
        "interval_s": round(interval_s, 6),
        "zones": zones,
        "package_joules": round(joules, 6) if joules is not None else None,
        "package_watts": watts,
        "source": "/sys/class/powercap intel-rapl energy_uj",
    }
