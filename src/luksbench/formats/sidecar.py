"""``rep<k>.cpu.json``: the CPU sidecar beside each fio result.

Written by the runner (after fio, before the result appears); read by ingest into the
``busy_cpu_s``, ``busy_cpu_pct``, ``sys_cpu_s`` and ``cpu_interval_s`` columns. The document::

    {"version": 2, "interval_s": 6.02, "clk_tck": 100, "cpu_count": 2,
     "delta_s": {"user": ..., "nice": ..., "system": ..., "idle": ..., "iowait": ...,
                 "irq": ..., "softirq": ..., "steal": ...},   # /proc/stat deltas, seconds
     "busy_s": ..., "busy_pct": ...,                           # busy: all but idle and iowait
     "window": "<what the interval covers>",
     "rapl": {...} | null,                                     # energy, when RAPL is readable
     "idle": {...}}                                            # the idle sample it is netted with

``idle`` (runs measured since idle samples are taken each round; absent before): the idle CPU
sample of the run's round, taken just before the round's first fio run, with the fields above and
``started`` (UTC) and ``round``. The session's manifest lists the same samples
(``cpu_idle_samples``; each run names its own by ``cpu_idle_sample``), which the analysis reads.

An RBD arm's run adds ``ceph`` (written by the runner from testbox/cephrun.finish_entry_run).

Version 1 (no ``version``) is the same document; keys the reader does not use are kept.
Standard library only: the test box imports this.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from luksbench.formats.layout import read_raw_file
from luksbench.formats.record import record_version, write_record

SIDECAR_VERSION = 2
SIDECAR_VERSIONS = (1, 2)

FIO_WINDOW = (
    "fio process lifetime (startup, ramp_time and runtime); aggregate cpu line of /proc/stat; "
    "iowait counts as idle"
)


def cpu_sidecar_document(cpu: dict, rapl: dict | None = None, idle: dict | None = None) -> dict:
    """The sidecar of one fio run: ``cpu`` (/proc/stat deltas over the run), its RAPL energy and
    the idle sample it is netted with (left out when None)."""
    doc = {"version": SIDECAR_VERSION, **cpu, "window": FIO_WINDOW, "rapl": rapl}
    return doc if idle is None else {**doc, "idle": idle}


def write_cpu_sidecar(path: Path, doc: dict) -> None:
    """The one writer of a CPU sidecar (written once: read-only)."""
    write_record(path, doc, SIDECAR_VERSION, mode=0o444)


def _number(value, *name: str) -> float:
    if type(value) in (int, float):  # JSON's numbers (not bool)
        return float(value)
    if value is None:
        return math.nan
    raise ValueError(f"CPU sidecar: {'.'.join(name)} is not a number: {value!r}")


def read_cpu_sidecar(
    path: Path, loads: Callable[[bytes], object] = json.loads, stats: list | None = None
) -> dict:
    """``rep<k>.cpu.json`` -> busy_cpu_s, busy_cpu_pct, sys_cpu_s, cpu_interval_s (NaN: not
    recorded); ValueError if malformed or implausible (negative times, busy over 100 %, an
    empty interval). ``loads``: a faster decoder with json's values; what it refuses (NaN) goes
    to json. ``stats``: as for :func:`read_raw_file`."""
    try:
        raw = read_raw_file(path, stats)
        try:
            data = loads(raw)
        except ValueError:
            data = json.loads(raw.decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"CPU sidecar is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("CPU sidecar must be a JSON object")
    record_version(data, str(path), "CPU sidecar", SIDECAR_VERSIONS)  # 1: 2 without the field
    delta = data.get("delta_s") or {}
    if not isinstance(delta, dict):
        raise ValueError("CPU sidecar: delta_s must be an object")
    delta = {k: _number(v, "delta_s", k) for k, v in delta.items()}
    busy_s = _number(data.get("busy_s"), "busy_s")
    if math.isnan(busy_s) and delta:
        busy_s = sum(v for k, v in delta.items() if k not in ("idle", "iowait"))
    values = {
        "busy_cpu_s": busy_s,
        "busy_cpu_pct": _number(data.get("busy_pct"), "busy_pct"),
        "sys_cpu_s": _number(delta.get("system"), "delta_s.system"),
        "cpu_interval_s": _number(data.get("interval_s"), "interval_s"),
    }
    _check_plausible(values, delta)
    _check_idle(data.get("idle"))
    return values


def _check_idle(idle) -> None:
    """ValueError naming ``idle``'s first implausible value (None: a sidecar without one)."""
    if idle is None:
        return
    if not isinstance(idle, dict):
        raise ValueError("CPU sidecar: idle must be an object")
    for key, ok, allowed in (
        ("interval_s", lambda x: x > 0, "> 0"),
        ("busy_s", lambda x: x >= 0, ">= 0"),
    ):
        value = _number(idle.get(key), "idle", key)
        if not ok(value):
            raise ValueError(f"CPU sidecar: idle.{key} is {value}, must be {allowed}")


def _check_plausible(values: dict, delta: dict) -> None:
    """ValueError naming the first value no /proc/stat reading can give (NaN: not recorded)."""
    busy, pct, interval = values["busy_cpu_s"], values["busy_cpu_pct"], values["cpu_interval_s"]
    if min(delta.values(), default=0) >= 0 and busy >= 0 and 0 <= pct <= 100 and interval > 0:
        return  # the common sidecar: every value recorded and plausible
    checks = [(f"delta_s.{k}", v, v >= 0, ">= 0") for k, v in delta.items()]
    checks += [
        ("busy_s", busy, busy >= 0, ">= 0"),
        ("busy_pct", pct, 0 <= pct <= 100, "in 0..100"),
        ("interval_s", interval, interval > 0, "> 0"),
    ]
    for name, value, ok, allowed in checks:
        if not ok and not math.isnan(value):
            raise ValueError(f"CPU sidecar: {name} is {value}, must be {allowed}")
