"""Probes beside each fio run: CPU time from ``/proc/stat`` (iowait counts as idle) and energy
from RAPL (root only since Linux 5.10; absent or unreadable counters read as None). Standard
library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from luksbench.testbox.sysutil import TestboxError, utc_now

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
    """CPU seconds (all CPUs summed) between two readings; ``busy_pct`` 100 = every CPU busy."""
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


#: seconds of each idle sample (one per round of a session: the cost of the design)
IDLE_SECONDS = 2.0


def idle_baseline(
    seconds: float = IDLE_SECONDS,
    rapl_root: str | Path = POWERCAP_ROOT,
    when: str = "before the first fio run of the session",
) -> dict:
    """CPU and RAPL energy over ``seconds`` of doing nothing (the box's own load), with the fields
    of the per-rep CPU sidecar, and ``started`` (UTC) naming the sample; ``when`` says where in the
    session it was taken."""
    started = utc_now()
    before, rapl_before, t0 = read_proc_stat(), read_rapl(rapl_root), time.monotonic()
    time.sleep(seconds)
    t1, after, rapl_after = time.monotonic(), read_proc_stat(), read_rapl(rapl_root)
    return {
        **cpu_delta(before, after, t1 - t0),
        "started": started,
        "window": (
            f"idle interval of {seconds:g} s {when}; aggregate cpu line of /proc/stat; iowait "
            "counts as idle"
        ),
        "rapl": rapl_delta(rapl_before, rapl_after, t1 - t0),
    }


def read_rapl(root: str | Path = POWERCAP_ROOT) -> list[dict] | None:
    """One reading of every RAPL zone and subzone: zone, name, energy_uj, max_energy_range_uj.
    None when no zone is readable."""
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
    """Energy per zone between two readings, in joules and watts; None without a common zone.
    A counter that went down wrapped once (a second wrap, ~45 min at 100 W, cannot be seen).
    ``package_joules`` sums the top-level package zones (subzones are parts of them)."""
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
