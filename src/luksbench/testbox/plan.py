"""The plan: everything the test box needs to know, as one JSON file written by the workflow.

The workflow (Snakemake, with YAML config and JSON-Schema validation) resolves the config into a
plan; the test-box code reads only this JSON, so it runs with the standard library alone.

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

Optional: ``"adaptive": {"enabled": true, "pilot_pairs": 4, "target_half_width_pct": 2,
"max_pairs": 12, "metric": "bw_bytes"}`` (only when the config enables adaptive repetitions; then
``repetitions`` is the pilot's n0 and the second stage gets per-cell targets from ``run-fio
--targets``). It is a record of the design, not a measurement setting: changing it does not make
a run's measurements incomparable.
"""

from __future__ import annotations

import json
from pathlib import Path

from luksbench.layout import Workload, bs_to_bytes

REQUIRED_KEYS = (
    "run",
    "host",
    "backend",
    "scratch_dir",
    "device_size_mib",
    "precondition",
    "baseline",
    "stacks",
    "matrix",
    "fio",
    "repetitions",
    "seed",
)
BACKENDS = ("auto", "kernel", "userspace")


class PlanError(ValueError):
    """A plan file that is missing a key or holds a wrong value; the message names the key."""


def load_plan(path: Path) -> dict:
    try:
        plan = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: cannot read plan: {exc}") from exc
    check_plan(plan, source=str(path))
    return plan


def check_plan(plan: dict, source: str = "plan") -> None:
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
    if int(plan["repetitions"]) < 1:
        raise PlanError(f"{source}: repetitions must be >= 1")
    for key in ("rw", "bs", "iodepth"):
        if not plan["matrix"].get(key):
            raise PlanError(f"{source}: matrix.{key} must be a non-empty list")
    adaptive = plan.get("adaptive")
    if adaptive is not None:
        if not isinstance(adaptive, dict):
            raise PlanError(f"{source}: adaptive must be an object")
        n0, cap = int(adaptive.get("pilot_pairs", 4)), int(adaptive.get("max_pairs", 12))
        if n0 < 2:
            raise PlanError(f"{source}: adaptive.pilot_pairs must be >= 2, not {n0}")
        if cap < n0:
            raise PlanError(
                f"{source}: adaptive.max_pairs ({cap}) must be >= adaptive.pilot_pairs ({n0})"
            )


def workloads(plan: dict) -> list[Workload]:
    """The matrix as a sorted list of cells."""
    m = plan["matrix"]
    return sorted(
        Workload(rw, bs_to_bytes(bs), int(qd))
        for rw in m["rw"]
        for bs in m["bs"]
        for qd in m["iodepth"]
    )


# Keys whose change makes new repetitions incomparable with the ones already measured in a run.
# Not in here on purpose: repetitions, seed, matrix (extending a run) and adaptive (the design of
# how many repetitions, not how each is measured).
_MEASUREMENT_KEYS = ("backend", "device_size_mib", "precondition", "stacks", "fio")
_STACK_DEFAULTS = {
    "luks": {
        "cipher": "aes-xts-plain64",
        "key_bits": 512,
        "hash": "sha256",
        "luks_type": "luks2",
        "sector_size": 512,
        "pbkdf_iterations": 1000,
    },
    "plain": {},
}


def plan_from_config(config: dict, host: str, scratch_dir: Path) -> dict:
    """Resolve a validated workflow config (defaults filled) into the test box's plan."""
    stacks = {}
    for name, stack in config["stacks"].items():
        stacks[name] = {**_STACK_DEFAULTS.get(stack["kind"], {}), **stack}
    plan = {
        "run": config["run"],
        "host": host,
        "backend": config["backend"],
        "scratch_dir": str(Path(scratch_dir).resolve()),
        "device_size_mib": config["device_size_mib"],
        "precondition": config["precondition"],
        "baseline": config["baseline"],
        "stacks": stacks,
        "matrix": {k: list(v) for k, v in config["matrix"].items()},
        "fio": dict(config["fio"]),
        "repetitions": config["repetitions"],
        "seed": config["seed"],
    }
    adaptive = config.get("adaptive") or {}
    if adaptive.get("enabled"):
        # Stage 1 measures the pilot; stage 2 (run-fio --targets) tops each cell up to its target.
        plan["repetitions"] = adaptive["pilot_pairs"]
        plan["adaptive"] = dict(adaptive)
    check_plan(plan, source="config")
    return plan


def plan_changes(measured: dict, new: dict) -> list[str]:
    """Differences that would mix incomparable measurements into one run, as 'key: old -> new'.

    Adding repetitions or cells, or changing the seed, is allowed: that is how a run is resumed or
    extended. Changing how each measurement is taken is not.
    """
    changes: list[str] = []
    for key in _MEASUREMENT_KEYS:
        _diff(key, measured.get(key), new.get(key), changes)
    return changes


def _diff(key: str, old, new, changes: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for sub in sorted(set(old) | set(new)):
            _diff(f"{key}.{sub}", old.get(sub), new.get(sub), changes)
    elif old != new:
        changes.append(f"{key}: {old!r} -> {new!r}")


def write_plan(
    plan: dict, out: Path, measured_env: Path | None = None, log: Path | None = None
) -> None:
    """Write the plan as JSON, after checking it against the plan a run was already measured with.

    ``measured_env`` is the run's env.json (which embeds the plan it was captured with); when it
    exists and the measurement keys differ, the run would mix incomparable data: refuse, naming
    each changed key, and suggest a new run name.
    """
    lines = []
    if measured_env is not None and Path(measured_env).exists():
        measured = json.loads(Path(measured_env).read_text()).get("plan", {})
        changes = plan_changes(measured, plan)
        if changes:
            raise PlanError(
                f"run {plan['run']!r} on {plan['host']!r} was measured with a different plan "
                f"({measured_env}):\n  "
                + "\n  ".join(changes)
                + "\nChoose a new run name (config key 'run') to measure with the new settings."
            )
        lines.append(f"resuming run {plan['run']!r}: plan compatible with {measured_env}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")
    lines.append(f"wrote {out}")
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("\n".join(lines) + "\n")
