"""``plan.json``: the one input of the test box, written by the workflow from the validated
config. This module checks the document as a whole (required keys, top-level values, which keys
make two plans' measurements incomparable); :mod:`luksbench.testbox.plan` checks what stacks,
patterns and block sizes mean. Standard library only: the test box imports this.

Example (all keys are required; the workflow fills defaults)::

    {
      "run": "default",
      "host": "testbox1",
      "backend": "auto",                 # auto | kernel | userspace
      "scratch_dir": "/abs/path/data/scratch/default/testbox1",
      "device_size_mib": 1024,           # size of each backing file
      "precondition": true,              # fill each stack sequentially once before measuring
      "baseline": "plain",
      "stacks": {
        "plain": {"kind": "plain"},
        "luks": {"kind": "luks", "cipher": "aes-xts-plain64", "key_bits": 512,
                 "hash": "sha256", "luks_type": "luks2", "sector_size": 512,
                 "pbkdf_iterations": 1000}
      },
      "matrix": {"rw": ["read", "write", "randread", "randwrite"],
                 "bs": ["4k", "1m"], "iodepth": [1, 32]},
      "fio": {"ioengine": "libaio", "direct": true, "runtime_s": 3, "ramp_time_s": 1,
              "output_format": "json+"},
      "repetitions": 3,
      "seed": 20231124
    }

Optional: ``"patterns": {"largeblock": {"description": "...", "matrix": {...}, "io_bs": "8k",
"fsync_per_block": true, "fio": {"ioengine": "psync", "direct": false, "sync": false}}}``: families
of cells beside the main matrix with their own fio options (resolved against the top-level
``fio``: no nulls); ``"sessions": k`` (k >= 2): every cell measured in k stack-ups;
``"adaptive": {"enabled": true, "pilot_pairs": 4, "target_half_width_pct": 2, "max_pairs": 12,
"metric": "bw_bytes"}`` (or ``"mode": "sequential"`` with ``min_pairs`` and ``budget_h``; then
``repetitions`` is the pilot's n0): a record of the design, not a measurement setting.
"""

from __future__ import annotations

import json
from pathlib import Path

REQUIRED_KEYS = ("run", "host", "backend", "scratch_dir", "device_size_mib", "precondition")
REQUIRED_KEYS += ("baseline", "stacks", "matrix", "fio", "repetitions", "seed")
BACKENDS = ("auto", "kernel", "userspace")


class PlanError(ValueError):
    """A plan file that is missing a key or holds a wrong value; the message names the key."""


def read_plan_document(path: Path) -> dict:
    """The JSON document of a plan file, unchecked (PlanError when it cannot be read)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: cannot read plan: {exc}") from exc


def write_plan_document(path: Path, plan: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")


def check_document(plan: dict, source: str = "plan") -> None:
    """Every required key is there; backend, baseline, repetitions and matrix are usable."""
    missing = [k for k in REQUIRED_KEYS if k not in plan]
    if missing:
        raise PlanError(f"{source}: missing key(s) {', '.join(missing)}")
    if plan["backend"] not in BACKENDS:
        raise PlanError(
            f"{source}: backend must be one of {', '.join(BACKENDS)}, not {plan['backend']!r}"
        )
    if plan["baseline"] not in plan["stacks"]:
        raise PlanError(
            f"{source}: baseline {plan['baseline']!r} is not one of the stacks {sorted(plan['stacks'])}"
        )
    for key in ("repetitions", "sessions"):  # sessions is optional
        value = plan.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{source}: {key} must be an integer >= 1, not {value!r}")
    if not isinstance(plan["matrix"], dict):
        raise PlanError(f"{source}: matrix must be an object with rw, bs and iodepth lists")
    for key in ("rw", "bs", "iodepth"):
        if not plan["matrix"].get(key):
            raise PlanError(f"{source}: matrix.{key} must be a non-empty list")


def check_run_options(plan: dict, source: str = "plan") -> None:
    """The optional ``fleet`` (fio servers) and ``adaptive`` (two-stage design) sections."""
    fleet = plan.get("fleet")
    if fleet is not None:
        hosts = fleet.get("hosts") or []
        if fleet.get("mode") == "clients" and not hosts:
            raise PlanError(f"{source}: fleet.hosts must list the fio servers for mode clients")
        names = [h.get("name") for h in hosts]
        if len(set(names)) != len(names):
            raise PlanError(f"{source}: fleet.hosts names must be unique, not {names}")
    adaptive = plan.get("adaptive")
    if adaptive is not None:
        if not isinstance(adaptive, dict):
            raise PlanError(f"{source}: adaptive must be an object")
        sequential = adaptive.get("mode") == "sequential"
        first = "min_pairs" if sequential else "pilot_pairs"
        n0 = int(adaptive.get(first, 3 if sequential else 4))
        cap = int(adaptive.get("max_pairs", 12))
        if n0 < 2:
            raise PlanError(f"{source}: adaptive.{first} must be >= 2, not {n0}")
        if cap < n0:
            raise PlanError(
                f"{source}: adaptive.max_pairs ({cap}) must be >= adaptive.{first} ({n0})"
            )
        if sequential and int(plan.get("sessions", 1)) > 1:
            raise PlanError(
                f"{source}: adaptive.mode sequential measures one session (sessions: 1)"
            )


# Keys whose change makes measurements incomparable
_MEASUREMENT_KEYS = ("backend", "device_size_mib", "precondition")
_MEASUREMENT_KEYS += ("stacks", "fio", "devices", "fleet")
# Per pattern: how its cells are measured (its matrix may grow, and a new pattern adds cells).
_PATTERN_MEASUREMENT_KEYS = ("io_bs", "fsync_per_block", "fio")


def plan_changes(measured: dict, new: dict) -> list[str]:
    """Differences that would mix incomparable measurements into one run, as 'key: old -> new'
    (more repetitions or cells, or another seed, resume or extend a run: not listed)."""
    changes: list[str] = []
    for key in _MEASUREMENT_KEYS:
        _diff(key, measured.get(key), new.get(key), changes)
    old_patterns, new_patterns = measured.get("patterns") or {}, new.get("patterns") or {}
    for name in sorted(set(old_patterns) & set(new_patterns)):
        old, new_ = old_patterns[name], new_patterns[name]
        for key in _PATTERN_MEASUREMENT_KEYS:
            _diff(f"patterns.{name}.{key}", old.get(key), new_.get(key), changes)
    return changes


def _diff(key: str, old, new, changes: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for sub in sorted(set(old) | set(new)):
            _diff(f"{key}.{sub}", old.get(sub), new.get(sub), changes)
    elif old != new:
        changes.append(f"{key}: {old!r} -> {new!r}")
