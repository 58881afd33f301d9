"""Every study profile on a kernel with device-mapper and MD: the VM test box, one boot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit.plans import EXPECTED, load_study, luks_layers, validated
from testkit.vm import usable_harness

from luksbench.testbox.planbuild import (
    cell_options,
    plan_from_config,
    workloads,
)

# --- the studies on a kernel with device-mapper and MD (the VM test box) -------------------------

VMBOX_DIR = Path(__file__).parent


# Small enough for the guest's root disk (raid5-2012: 15 members), big enough for a LUKS2 header.
VM_DEVICE_MIB = 64


def vm_case(name: str) -> dict:
    """The study's stacks, devices, fio engine and preconditioning as they are; only smaller:
    devices of VM_DEVICE_MIB, the matrix at its smallest block size, 1 s runs, 1 repetition."""
    from luksbench.formats.layout import bs_to_bytes

    config = validated(load_study(name))
    config["devices"] = {device: {"size_mib": VM_DEVICE_MIB} for device in config["devices"]}
    matrix = config["matrix"]
    config["matrix"] = {**matrix, "bs": [min(matrix["bs"], key=bs_to_bytes)]}
    for pattern in config["patterns"].values():
        # Large blocks do not fit the small devices: the smallest block, and with io_bs the
        # smallest block of several I/Os (rw=<rw>:<n>, one seek per block, fsync per block).
        sizes = sorted(pattern["matrix"]["bs"], key=bs_to_bytes)
        io_bs = bs_to_bytes(pattern["io_bs"] or 0)
        several = [bs for bs in sizes if io_bs and bs_to_bytes(bs) > io_bs][:1]
        pattern["matrix"]["bs"] = sizes[:1] + several
    config["fio"] = {**config["fio"], "runtime_s": 1, "ramp_time_s": 0}
    config["repetitions"] = 1
    plan = plan_from_config(config, "unused", Path("/nonexistent"))
    for key in ("run", "host", "scratch_dir"):  # the guest's driver fills these in
        del plan[key]
    return {
        "description": (
            f"study {name}, shrunk to {VM_DEVICE_MIB} MiB devices, the smallest block of each "
            "matrix and 1 s runs"
        ),
        "plan": plan,
        "steps": ["capture-env", "stack-up", "run-fio", "stack-down"],
        "expect": {"stack_up": "ok"},
    }


def _cached_image(harness) -> Path | None:
    """An image already built (the workflow variant holds everything the base one does)."""
    for variant in ("base", "workflow"):
        path = harness.cache_dir() / harness.image_key(variant)
        if (path / "image.json").is_file():
            return path
    return None


@pytest.fixture(scope="module")
def vm_results(tmp_path_factory) -> Path:
    """Boot the guest once; every study is one case. Results per case under results/<name>."""
    harness = usable_harness()
    tmp = tmp_path_factory.mktemp("vm-studies")
    cases = []
    for name in sorted(EXPECTED):
        path = tmp / "cases" / f"study-{name}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(vm_case(name), indent=2))
        cases.append(path)
    out = harness.run_guest(tmp / "out", cases, image=_cached_image(harness), timeout=3600)
    return out / "results"


@pytest.mark.slow
@pytest.mark.vm
@pytest.mark.vm_full
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_study_runs_on_loop_devices_in_the_vm(vm_results, name):
    from luksbench.formats.fio import parse_fio_file

    case_dir = vm_results / f"study-{name}"
    case = json.loads((case_dir / "case.json").read_text())
    assert case["ok"], f"{name}: {case['problems']}"
    plan = json.loads((case_dir / "plan.json").read_text())
    stacks = json.loads((case_dir / "stacks.json").read_text())["stacks"]
    assert set(stacks) == set(EXPECTED[name]["stacks"])
    host_dir = case_dir / "raw" / plan["run"] / plan["host"] / "fio"
    manifest = json.loads((host_dir / "manifest.json").read_text())
    for stack, desc in stacks.items():
        if desc.get("unavailable"):
            # Only an optional arm may be missing, and then with the kernel's reason recorded.
            assert plan["stacks"][stack].get("optional"), f"{name}: {stack}: {desc['unavailable']}"
            assert manifest["unavailable_stacks"][stack] == desc["unavailable"]
            assert not (host_dir / stack).exists()
            continue
        for layer in luks_layers(plan["stacks"][stack])[:1]:
            assert desc["cipher"] == layer["cipher"], (stack, desc["cipher"])
        for w in workloads(plan):
            rep = host_dir / stack / w.id / "rep1.json"
            rows = parse_fio_file(rep)
            assert rows and all(r["error"] == 0 and r["io_bytes"] > 0 for r in rows), (stack, rows)
            # a pattern cell ran with its own fio options on the real stack (dm-crypt, md, ext4)
            options = cell_options(plan, w)
            job = json.loads(rep.read_text())["jobs"][0]["job options"]
            assert job["ioengine"] == options["ioengine"], (stack, w.id, job)
            assert job["direct"] == str(int(options["direct"])), (stack, w.id, job)
            assert job.get("sync", "0") == str(int(options["sync"])), (stack, w.id, job)
            assert job.get("fsync", "0") == str(options["fsync"]), (stack, w.id, job)
            assert job["bs"] == str(options["io_bs_bytes"]), (stack, w.id, job)
    teardown = json.loads((case_dir / "teardown.json").read_text())
    assert teardown["ok"] and all(teardown["checks"].values()), teardown
    assert not any(case["leftovers"].values()), case["leftovers"]
