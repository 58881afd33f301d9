"""``ceph.daemon_modes``: the messenger modes the run's cluster's daemons accept, a setting of the
run (daemons take it only at start). The plan carries it from the config, the cluster's conf is
written with it, an arm whose client the daemons would refuse is refused when the plan is built
(naming the key, not by a fio that retries forever), and older plans mean what their clusters
ran with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from luksbench.formats.plan import PlanError, read_plan, write_plan_file
from luksbench.studies import load_config
from luksbench.testbox import ceph, cephstack
from luksbench.testbox.planbuild import check_plan, load_plan, plan_changes, plan_from_config
from luksbench.testbox.planview import describe_plan
from luksbench.testbox.sysutil import TestboxError

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "config" / "ceph-small.yaml"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def schema_daemon_modes() -> dict:
    return yaml.safe_load(SCHEMA.read_text())["properties"]["ceph"]["properties"]["daemon_modes"]


@pytest.fixture
def small_config() -> dict:
    return load_config(REPO, [SMALL])


def secure_cluster(config: dict) -> dict:
    """The small config's secure arms only, on daemons that accept secure only."""
    stacks = {n: s for n, s in config["stacks"].items() if s.get("mode") == "secure"}
    return {**config, "stacks": stacks, "baseline": "secure", "ceph": {"daemon_modes": "secure"}}


def test_the_schema_lists_the_mode_lists_the_test_box_accepts():
    spec = schema_daemon_modes()
    assert tuple(spec["enum"]) == ceph.DAEMON_MODE_LISTS
    assert spec["default"] in ceph.DAEMON_MODE_LISTS


def test_the_plan_carries_the_configs_daemon_modes(small_config, tmp_path):
    default = plan_from_config(small_config, "tb1", tmp_path)
    default_modes = schema_daemon_modes()["default"]
    assert default["ceph"] == {"daemon_modes": default_modes}
    plan = plan_from_config(secure_cluster(small_config), "tb1", tmp_path)
    assert plan["ceph"] == {"daemon_modes": "secure"}
    write_plan_file(tmp_path / "plan.json", plan)
    assert json.loads((tmp_path / "plan.json").read_text())["ceph"] == {"daemon_modes": "secure"}
    assert read_plan(tmp_path / "plan.json").ceph == {"daemon_modes": "secure"}
    # another measurement: a run measured with the default's daemons does not take it
    assert f"ceph.daemon_modes: {default_modes!r} -> 'secure'" in plan_changes(default, plan)
    text = "\n".join(describe_plan(plan))
    assert "accepting messenger modes 'secure' (ceph.daemon_modes)" in text
    assert "cluster-side secure mode: the daemons accept only secure" in text


@pytest.mark.parametrize("modes", ceph.DAEMON_MODE_LISTS)
def test_the_conf_starts_every_daemon_in_the_given_modes(tmp_path, modes):
    text = ceph.conf_text(tmp_path / "ceph", "fsid", 4567, modes)
    for key in ("ms_cluster_mode", "ms_service_mode", "ms_mon_cluster_mode", "ms_mon_service_mode"):
        assert f"\t{key} = {modes}\n" in text, key


def test_stack_up_builds_the_cluster_with_the_plans_daemon_modes(small_config, tmp_path):
    """attach_cluster hands the plan's value to the cluster's builder: a value the builder
    refuses stops it before any file or daemon of the cluster exists (the scratch folder is too
    deep for admin sockets besides, so a builder given another value stops there instead)."""
    plan = plan_from_config(small_config, "tb1", tmp_path)
    plan["ceph"] = {"daemon_modes": "crc crc"}
    ceph_part = cephstack.split_plan(plan)[1]
    helpers = [h for g in ceph_part["groups"] for h in g["layers"]]
    scratch = tmp_path / ("x" * 90)
    state = {"scratch_dir": str(scratch), "backend": "kernel"}
    state["stacks"] = {h: {"device": f"/dev/loop-{h}"} for h in helpers}
    with pytest.raises(TestboxError, match=r"ceph\.daemon_modes 'crc crc' is not one of"):
        cephstack.attach_cluster(ceph_part, state, tmp_path / "state.json", dict.fromkeys(helpers))
    assert not ceph.cluster_dir(scratch).exists()


@pytest.mark.parametrize(
    ("modes", "refused"),
    [
        ("secure", ["plain", "luks"]),  # the crc arms
        ("crc", ["secure", "luks-secure"]),  # the secure arms
    ],
)
def test_an_arm_the_daemons_would_refuse_is_refused_at_plan_time(
    small_config, tmp_path, modes, refused
):
    config = {**small_config, "ceph": {"daemon_modes": modes}}
    with pytest.raises(PlanError) as caught:
        plan_from_config(config, "tb1", tmp_path)
    message = str(caught.value)
    assert message.startswith("config: ") and f"ceph.daemon_modes {modes!r}" in message
    named = {n for n in small_config["stacks"] if f"stacks.{n}.mode:" in message}
    assert named == set(refused), message
    assert "separate run" in message


def test_a_hand_written_plan_with_another_mode_list_is_refused_naming_the_file(
    small_config, tmp_path
):
    plan = plan_from_config(small_config, "tb1", tmp_path)
    check_plan(plan, "config")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan, "ceph": {"daemon_modes": "secure, crc"}}))
    with pytest.raises(PlanError, match=rf"{path}: ceph\.daemon_modes: 'secure, crc' is not one"):
        load_plan(path)
    path.write_text(json.dumps({**plan, "ceph": {}}))
    with pytest.raises(PlanError, match=r"missing key\(s\) ceph\.daemon_modes"):
        load_plan(path)


@pytest.mark.parametrize("version", [None, 2])
def test_an_older_plan_means_daemons_that_accepted_both_modes(small_config, tmp_path, version):
    """Plans before version 3 had no ``ceph`` section: their clusters' daemons were started
    accepting "crc secure"; resuming such a run with daemons in secure only is refused."""
    plan = plan_from_config(small_config, "tb1", tmp_path)
    old = {k: v for k, v in plan.items() if k not in ("ceph", "version")}
    if version is not None:
        old["version"] = version
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(old))
    assert load_plan(path).ceph == {"daemon_modes": "crc secure"}
    assert plan_changes(old, plan) == []
    secure = plan_from_config(secure_cluster(small_config), "tb1", tmp_path)
    assert "ceph.daemon_modes: 'crc secure' -> 'secure'" in plan_changes(old, secure)
