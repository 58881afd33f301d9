"""The plan: resolved from config, checked, and never allowed to mix incomparable measurements."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from testkit.plans import PLAN_CONFIG, validated

from luksbench.formats.layout import LayoutError, Workload, bs_label, bs_to_bytes
from luksbench.testbox.planbuild import (
    PlanError,
    check_plan,
    plan_changes,
    plan_from_config,
    workloads,
    write_plan,
)

CONFIG = PLAN_CONFIG


def test_plan_fills_stack_defaults_and_keeps_choices(tmp_path):
    plan = plan_from_config(CONFIG, "box1", tmp_path)
    assert plan["host"] == "box1"
    assert plan["scratch_dir"] == str(tmp_path.resolve())
    assert plan["stacks"]["luks"]["key_bits"] == 256
    assert plan["stacks"]["luks"]["cipher"] == "aes-xts-plain64"
    # every setting of the layer's kind, none of another kind's
    assert plan["stacks"]["plain"] == {"kind": "plain", "size_mib": 0, "optional": False}
    assert len(workloads(plan)) == 8
    assert Workload("randread", 4096, 32) in workloads(plan)


def test_check_plan_names_the_missing_key():
    plan = plan_from_config(CONFIG, "box1", "/tmp")
    del plan["fio"]
    with pytest.raises(PlanError, match="fio"):
        check_plan(plan)


def test_check_plan_refuses_a_baseline_that_is_not_a_stack():
    plan = plan_from_config(CONFIG, "box1", "/tmp")
    plan["baseline"] = "raw"
    with pytest.raises(PlanError, match="baseline 'raw'"):
        check_plan(plan)


@pytest.mark.parametrize(
    ("key", "value"),
    [("repetitions", "three"), ("repetitions", 0), ("repetitions", None), ("sessions", [2])],
)
def test_check_plan_names_a_count_that_is_not_a_positive_integer(key, value):
    plan = plan_from_config(CONFIG, "box1", "/tmp")
    plan[key] = value
    with pytest.raises(
        PlanError, match=f"{key} must be an integer >= 1, not {re.escape(repr(value))}"
    ):
        check_plan(plan)


def test_check_plan_names_a_matrix_that_is_not_an_object():
    plan = plan_from_config(CONFIG, "box1", "/tmp")
    plan["matrix"] = ["randread"]
    with pytest.raises(PlanError, match="matrix must be an object"):
        check_plan(plan)


def test_resuming_with_more_repetitions_is_allowed(tmp_path):
    measured = plan_from_config(CONFIG, "box1", tmp_path)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"plan": measured}))
    more = plan_from_config({**CONFIG, "repetitions": 6, "seed": 8}, "box1", tmp_path)
    write_plan(more, tmp_path / "plan.json", measured_env=env, log=tmp_path / "log")
    assert json.loads((tmp_path / "plan.json").read_text())["repetitions"] == 6
    assert "resuming" in (tmp_path / "log").read_text()


def test_changing_how_a_run_measures_is_refused_naming_the_key(tmp_path):
    measured = plan_from_config(CONFIG, "box1", tmp_path)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"plan": measured}))
    other_fio = {**CONFIG["fio"], "runtime_s": 60}
    changed = plan_from_config({**CONFIG, "fio": other_fio}, "box1", tmp_path)
    with pytest.raises(PlanError, match=r"(?s)fio.runtime_s: 2 -> 60\n.*new run name"):
        write_plan(changed, tmp_path / "plan.json", measured_env=env)
    assert not (tmp_path / "plan.json").exists()


ADAPTIVE = {
    "enabled": True,
    "pilot_pairs": 4,
    "target_half_width_pct": 2,
    "max_pairs": 12,
    "metric": "bw_bytes",
}


def test_adaptive_plan_measures_the_pilot_first(tmp_path):
    fixed = plan_from_config(CONFIG, "box1", tmp_path)
    assert fixed["adaptive"] is None  # disabled: the plan is exactly the fixed design's
    plan = plan_from_config({**CONFIG, "adaptive": ADAPTIVE}, "box1", tmp_path)
    assert plan["repetitions"] == 4 and plan["adaptive"] == ADAPTIVE
    disabled = plan_from_config({**CONFIG, "adaptive": {**ADAPTIVE, "enabled": False}}, "b", "/t")
    assert disabled["repetitions"] == 3 and disabled["adaptive"] is None
    with pytest.raises(PlanError, match="max_pairs"):
        plan_from_config({**CONFIG, "adaptive": {**ADAPTIVE, "max_pairs": 3}}, "box1", tmp_path)


def test_switching_to_adaptive_is_not_a_measurement_change(tmp_path):
    """A fixed-design run may be extended adaptively (and the adaptive settings changed): how many
    repetitions is a design choice, how each one is measured is not touched."""
    measured = plan_from_config(CONFIG, "box1", tmp_path)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"plan": measured}))
    for adaptive in (ADAPTIVE, {**ADAPTIVE, "max_pairs": 20, "target_half_width_pct": 1}):
        plan = plan_from_config({**CONFIG, "adaptive": adaptive}, "box1", tmp_path)
        assert plan_changes(measured, plan) == []
        write_plan(plan, tmp_path / "plan.json", measured_env=env)


@pytest.mark.parametrize(
    ("label", "size"),
    [("4k", 4096), ("64k", 65536), ("1m", 1048576), ("4096", 4096), ("64KiB", 65536)],
)
def test_block_sizes(label, size):
    assert bs_to_bytes(label) == size
    assert bs_to_bytes(bs_label(size)) == size


def test_workload_ids_round_trip():
    workload = Workload.from_id("randwrite-64k-qd32")
    assert workload == Workload("randwrite", 65536, 32)
    assert workload.id == "randwrite-64k-qd32"
    with pytest.raises(LayoutError, match="not a workload id"):
        Workload.from_id("randwrite-64k")


VMBOX_DIR = Path(__file__).parents[1] / "vm"
VMBOX_PLANS = sorted((VMBOX_DIR / "plans").glob("*.json"))


@pytest.mark.parametrize("path", VMBOX_PLANS, ids=[p.stem for p in VMBOX_PLANS])
def test_every_vm_case_plan_passes_the_plan_checks(path):
    """The VM cases test what stack-up does on real devices, so their plans, as the guest driver
    writes them, must pass the plan checks, or fail them with the very refusal the case expects:
    a case refused by another plan check would not test what it says."""
    spec = importlib.util.spec_from_file_location("vm_driver", VMBOX_DIR / "guest" / "driver.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    disks = [{"dev": f"/dev/vd{c}", "by_id": f"/dev/disk/by-id/virtio-scratch{c}"} for c in "bcde"]
    case = json.loads(path.read_text())
    plan = driver.make_plan(path.stem, case, disks)
    stack_up = case.get("expect", {}).get("stack_up", "ok")  # "ok" or {"refused": regex}
    try:
        check_plan(plan, source=path.name)
    except PlanError as exc:
        assert stack_up != "ok" and re.search(stack_up["refused"], str(exc)), (
            f"{path.name}: refused by a plan check the case is not about: {exc}"
        )


def test_plan_check_devices_exits_nonzero_when_a_device_is_refused(tmp_path, capsys):
    from luksbench import cli

    config = validated(
        {
            **CONFIG,
            "devices": {"disk": {"path": "/dev/disk/by-id/luksbench-no-such-disk"}},
            "stacks": {"plain": {"kind": "raw", "device": "disk"}, "luks": {"kind": "luks"}},
        }
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_from_config(config, "box", tmp_path)))
    command = ["plan", "--plan", str(plan)]
    assert cli.main([*command, "--check-devices"]) == 1
    assert "REFUSED devices.disk" in capsys.readouterr().out
    assert cli.main(command) == 0
