"""Ceph arms in the plan without a cluster: an arm on an existing cluster (``conf``) cannot sit
on osd layers (refused at plan time, saying why), arms sharing an OSD count its device once (and
an OSD's device is its own), the plan printout lists a shared OSD under its first arm only, and
a daemon of the run's cluster that exits stops fio at once, naming it."""

from __future__ import annotations

import copy
import subprocess
import time
from pathlib import Path

import pytest
from testkit.plans import plan_stacks

from luksbench.formats.plan import PlanError
from luksbench.studies import load_config
from luksbench.testbox import ceph, cephrun, cephstack
from luksbench.testbox.cephdown import start_time
from luksbench.testbox.planbuild import check_plan, check_stacks, device_uses, plan_from_config
from luksbench.testbox.planview import describe_plan
from luksbench.testbox.sysutil import TestboxError

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "config" / "ceph-small.yaml"
ON_LUKS = {"kind": "osd", "over": {"kind": "luks", "over": "d1"}}
ON_DISK = {"kind": "osd", "over": "d2"}


@pytest.fixture
def small_plan(tmp_path) -> dict:
    return plan_from_config(load_config(REPO, [SMALL]), "tb1", tmp_path)


def existing(**keys) -> dict:
    arm = {"kind": "rbd", "mode": "secure", "conf": "/etc/ceph/ceph.conf", "pool": "rbd"}
    return {**arm, "image": "lbx", **keys}


def test_an_existing_cluster_arm_over_an_osd_layer_is_refused_at_plan_time(small_plan):
    small_plan["stacks"]["secure"] = existing(over={"kind": "osd", "over": {"kind": "luks"}})
    with pytest.raises(PlanError, match=r"secure\.conf: an arm on an existing cluster sits on no"):
        check_plan(small_plan, "config")


def test_existing_cluster_arms_leave_the_backend_nothing_to_build(small_plan):
    small_plan["stacks"] = plan_stacks({"crc": existing(mode="crc"), "secure": existing()})
    small_plan["baseline"] = "crc"
    check_plan(small_plan, "config")
    backend_plan, part = cephstack.split_plan(small_plan)
    assert backend_plan["stacks"] == {} and sorted(part["existing"]) == ["crc", "secure"]
    text = "\n".join(describe_plan(small_plan))
    assert "use the existing cluster of /etc/ceph/ceph.conf" in text
    assert "creates and prefills image(s) rbd/lbx (refused if one exists)" in text


def test_existing_and_built_cluster_arms_in_one_run_are_refused(small_plan):
    small_plan["stacks"]["other"] = existing()
    with pytest.raises(TestboxError, match="measure them in separate runs"):
        cephstack.split_plan(small_plan)


def plan_with(stacks: dict) -> dict:
    devices = {"d1": {"size_mib": 512}, "d2": {"size_mib": 512}}
    return {"devices": devices, "stacks": plan_stacks(stacks)}


def test_arms_sharing_an_osd_count_its_device_once():
    plan = plan_with(
        {
            "a": {"kind": "rbd", "mode": "crc", "over": ON_LUKS},
            "b": {"kind": "rbd", "mode": "secure", "over": copy.deepcopy(ON_LUKS)},
            "c": {"kind": "rbd", "mode": "crc", "over": ON_DISK},
            "d": {"kind": "rbd", "mode": "secure", "over": ON_DISK},
        }
    )
    assert device_uses(plan) == {
        "d1": [("stacks.a.over.over.over", "osd")],
        "d2": [("stacks.c.over.over", "osd")],
    }
    check_stacks(plan)  # one luks header on d1, not two


def test_an_osd_device_is_not_shared_with_another_stack():
    plan = plan_with(
        {"a": {"kind": "rbd", "mode": "crc", "over": ON_DISK}, "r": {"kind": "raw", "device": "d2"}}
    )
    with pytest.raises(PlanError, match=r"devices\.d2 is used by .*claim\(s\) it exclusively"):
        check_stacks(plan)


def test_the_printout_lists_a_shared_osd_under_its_first_arm_only(small_plan):
    text = "\n".join(describe_plan(small_plan))
    assert text.count("ceph-osd --mkfs BlueStore") == 2
    assert (
        "secure: nothing more: it measures the OSD(s), pool and image built for stack plain" in text
    )
    assert ceph.shared_osd_arm(small_plan, "luks-secure") == "luks"
    assert ceph.shared_osd_arm(small_plan, "plain") is None


def test_a_daemon_that_exits_during_fio_stops_it_naming_the_daemon(tmp_path):
    """A dead OSD of a size-1 pool makes librados wait forever: the watch ends fio at once."""
    osd = subprocess.Popen(["sleep", "60"])
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "osd.3.log").write_text("heartbeat\nabort: disk gone\n")
    daemon = {"tool": "ceph-osd", "id": "3", "pid": osd.pid, "started": start_time(osd.pid)}
    cluster = {"dir": str(tmp_path), "daemons": [daemon]}
    cephrun.check_daemons(cluster, "before the run")  # alive: fine
    fio = subprocess.Popen(["sleep", "60"], start_new_session=True, text=True)
    run = {"timeout": 60.0, "env": {}, "cluster": cluster}
    osd.kill()
    osd.wait()
    t0 = time.monotonic()
    with pytest.raises(TestboxError, match=r"osd\.3 \(pid \d+\) of the run's cluster exited"):
        cephrun.communicate(fio, run)
    assert time.monotonic() - t0 < 5 and fio.poll() is not None
    with pytest.raises(TestboxError, match=r"osd\.3 log: heartbeat \| abort: disk gone"):
        cephrun.check_daemons(cluster, "before the run")
