"""The test box as the tests drive it: `luksbench testbox` commands, small plans and configs, and
the check that a torn-down run left nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from luksbench.formats.plan import migrated_plan_document
from testkit.plans import fio_settings, validated


def luksbench_testbox_argv(*args) -> list[str]:
    """The command line of `luksbench testbox <args>` (for a Popen that a test interrupts)."""
    return [sys.executable, "-m", "luksbench.cli", "testbox", *map(str, args)]


def run_fio_args(plan, state, host_dir, manifest, *extra) -> list:
    """Arguments of `testbox run-fio` for a plan, its stacks' state and a raw host folder."""
    return [
        "run-fio",
        "--plan",
        plan,
        "--state",
        state,
        "--raw-host-dir",
        host_dir,
        "--manifest",
        manifest,
        *extra,
    ]


def testbox(*args, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `luksbench testbox <args>` as the workflow does; fail with its stderr unless ``check``
    is false."""
    proc = subprocess.run(
        luksbench_testbox_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"testbox {args[0]} exited {proc.returncode}\n{proc.stderr}")
    return proc


def loop_plan(run: str, scratch_dir: Path, **overrides) -> dict:
    """A small valid kernel-backend plan as the test box reads it (a version 1 document,
    migrated): two loop stacks (plain baseline, other), one randread 4k cell, 1 s runs without
    ramp; ``overrides`` replace top-level keys."""
    document = {
        "run": run,
        "host": "h",
        "backend": "kernel",
        "scratch_dir": str(scratch_dir),
        "device_size_mib": 64,
        "precondition": False,
        "baseline": "plain",
        "stacks": {"plain": {"kind": "loop"}, "other": {"kind": "loop"}},
        "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1]},
        "fio": fio_settings(),
        "repetitions": 1,
        "seed": 1,
        **overrides,
    }
    return migrated_plan_document(document)


def small_config(run: str, **overrides) -> dict:
    """A small valid config as the workflow sees it (the schema's defaults filled): plain and luks
    stacks, one read 4k qd1 cell, 1 s runs without ramp or preconditioning; ``overrides`` replace
    top-level keys (``precondition`` true/false: whether to precondition)."""
    config = {
        "run": run,
        "backend": "auto",
        "device_size_mib": 64,
        "precondition": False,
        "baseline": "plain",
        "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}},
        "matrix": {"rw": ["read"], "bs": ["4k"], "iodepth": [1]},
        "fio": fio_settings(),
        "repetitions": 1,
        "seed": 1,
        **overrides,
    }
    if isinstance(config["precondition"], bool):
        config["precondition"] = {"enabled": config["precondition"]}
    return validated(config)


def make_plan(
    tmp: Path,
    run: str,
    *,
    cells=(("randread", "4k", 1), ("randread", "4k", 32)),
    reps=2,
    runtime_s=1,
    ioengine="libaio",
    backend="userspace",
    plain_only=False,
) -> Path:
    """A userspace-backend plan file (plain and a LUKS2 stack) of ``cells`` (rw, bs, iodepth)."""
    plan = {
        "run": run,
        "host": "tb1",
        "backend": backend,
        "scratch_dir": str(tmp / "scratch"),
        "device_size_mib": 64,
        "precondition": {"enabled": True, "fill_passes": 1},
        "baseline": "plain",
        "stacks": {
            "plain": {"kind": "plain"},
            "luks": {
                "kind": "luks",
                "cipher": "aes-xts-plain64",
                "key_bits": 512,
                "hash": "sha256",
                "luks_type": "luks2",
                "sector_size": 512,
                "pbkdf_iterations": 1000,
            },
        },
        "matrix": {
            "rw": sorted({c[0] for c in cells}),
            "bs": sorted({c[1] for c in cells}),
            "iodepth": sorted({c[2] for c in cells}),
        },
        "fio": fio_settings(runtime_s=runtime_s, ioengine=ioengine),
        "repetitions": reps,
        "seed": 20231124,
    }
    if plain_only:
        del plan["stacks"]["luks"]
    path = tmp / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def assert_clean(state: dict) -> None:
    """Nothing of a torn-down run's stacks is left: files, loop devices, mounts, daemons."""
    from luksbench.testbox import safety
    from luksbench.testbox.sysutil import find_our_processes, pid_alive

    stacks = state["stacks"].values()
    mounts = safety.mountpoints()
    for obj in state.get("objects", []):
        if obj["type"] in ("backing_file", "file"):
            assert not os.path.exists(obj["path"])
        if obj["type"] == "loop":
            assert not safety.loop_devices_backed_by([obj["backing"]])
        if obj["type"] == "mount":
            assert obj["path"] not in mounts
    for e in stacks:
        if e["mountpoint"]:
            assert e["mountpoint"] not in mounts
            assert not os.path.exists(e["mountpoint"])
        if e.get("backing_file"):  # userspace: one per stack; kernel: in the undo log
            assert not os.path.exists(e["backing_file"])
            assert not safety.loop_devices_backed_by([e["backing_file"]])
        if e.get("key_file"):
            assert not os.path.exists(e["key_file"])
        pid = (e.get("daemon") or {}).get("pid")
        assert (
            pid is None
            or not pid_alive(pid)
            or "qemu-storage-daemon"
            not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        )
    assert not find_our_processes(
        [e["mountpoint"] for e in stacks if e["mountpoint"]]
        + [e["backing_file"] for e in stacks if e.get("backing_file")]
    )
    if state.get("key_dir"):
        assert not os.path.exists(state["key_dir"])
    if state.get("runtime_dir"):
        assert not os.path.exists(state["runtime_dir"])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (just now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
