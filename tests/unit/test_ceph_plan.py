"""Ceph arms in the plan and the runner, without a cluster: the documented small config resolves
into a checked plan, its printout names the cluster, the backend is chosen for the layers under
the OSDs, fio's target and environment come from the arm, and fio past its hard timeout is
killed with its process group."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from luksbench.formats.layout import Workload
from luksbench.formats.plan import PlanError
from luksbench.studies import load_config
from luksbench.testbox import ceph, cephrun
from luksbench.testbox.backends.choose import userspace_compatible
from luksbench.testbox.cephstack import split_plan
from luksbench.testbox.planbuild import check_plan, plan_from_config
from luksbench.testbox.planview import describe_plan
from luksbench.testbox.runner import fio_argv
from luksbench.testbox.sysutil import TestboxError, pid_alive

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "config" / "ceph-small.yaml"


@pytest.fixture
def small_plan(tmp_path) -> dict:
    return plan_from_config(load_config(REPO, [SMALL]), "tb1", tmp_path)


def test_the_small_ceph_config_is_four_checked_arms_over_two_osds(small_plan):
    stacks = small_plan["stacks"]
    assert list(stacks) == ["plain", "luks", "secure", "luks-secure"]
    assert {n: (s["kind"], s["mode"]) for n, s in stacks.items()} == {
        "plain": ("rbd", "crc"),
        "luks": ("rbd", "crc"),
        "secure": ("rbd", "secure"),
        "luks-secure": ("rbd", "secure"),
    }
    # the default config's luks keys merged into the luks arm hold the defaults: dropped
    assert "cipher" not in stacks["luks"] and stacks["luks"]["over"]["over"]["kind"] == "luks"
    assert len(ceph.osd_groups(small_plan)) == 2
    backend_plan = split_plan(small_plan)[0]
    assert userspace_compatible(backend_plan) == []  # plain and luks on their own files
    assert userspace_compatible(small_plan) != []  # as the arms themselves would be judged


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mode": "tls"}, r"stacks\.plain\.mode: 'tls' is not one of"),
        ({"over": {"kind": "plain"}}, "an rbd layer sits on osd layers only"),
        ({"over": {"kind": "osd"}}, r"an osd layer sits on exactly one layer"),
    ],
)
def test_a_bad_ceph_arm_is_refused_naming_the_key(small_plan, change, message):
    small_plan["stacks"]["plain"] = {**small_plan["stacks"]["plain"], **change}
    with pytest.raises(PlanError, match=message):
        check_plan(small_plan, "config")


def test_an_rbd_layer_on_an_existing_cluster_still_needs_pool_and_image(small_plan):
    small_plan["stacks"]["plain"] = {"kind": "rbd", "mode": "crc"}
    with pytest.raises(PlanError, match=r"stacks\.plain\.pool is required"):
        check_plan(small_plan, "config")


def test_the_plan_printout_names_the_cluster_its_memory_and_its_actions(small_plan):
    text = "\n".join(describe_plan(small_plan))
    need = (2 * ceph.OSD_MEMORY_NEED_BYTES + ceph.MON_MEMORY_NEED_BYTES) / 2**30
    assert "one monitor, 2 BlueStore OSD(s) in 2 group(s)" in text
    assert f"memory needed about {need:.1f} GiB" in text
    assert "stack secure: rbd arm, client mode secure, 256 MiB image" in text
    assert "luks: ceph-osd --mkfs BlueStore on the luks layer (destroys its data" in text
    assert "luks: luksFormat its scratch file" in text


def test_fio_targets_the_arms_pool_and_image(small_plan):
    entry = {"stack": "secure", "device": None, "device_type": "rbd"}
    entry["ceph"] = {"pool": "lb-osd0", "image": "bench", "mode": "secure"}
    argv = fio_argv(small_plan, entry, "secure", Workload("randread", 4096, 16), Path("/o"), 0)
    assert "--ioengine=rbd" in argv and "--pool=lb-osd0" in argv and "--rbdname=bench" in argv
    assert not any(a.startswith("--filename") for a in argv)
    assert cephrun.prepare_entry_run({"device": "/dev/x"}, Path("/r/rep1.json"), {}) is None


def test_the_probe_log_sits_beside_the_rep_under_a_name_ingest_does_not_read():
    assert cephrun.probe_log_path(Path("/raw/h/fio/s/c/rep3.json")) == Path(
        "/raw/h/fio/s/c/rep3.ceph-probe.log"
    )


def test_fio_past_its_hard_timeout_is_killed_with_its_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    # a child that ignores SIGTERM, as librados does while it retries a refused connection
    script = f"trap '' TERM; sleep 60 & echo $! > {pidfile}; wait"
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True, text=True)
    run = {"timeout": 1.0, "env": {"CEPH_ARGS": "--ms_client_mode=secure"}}
    with pytest.raises(TestboxError, match=r"within 1 s \(CEPH_ARGS '--ms_client_mode=secure'\)"):
        cephrun.communicate(proc, run)
    assert proc.returncode is not None
    child = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # the SIGKILLed child is reaped by init shortly
            os.kill(child, 0)
            subprocess.run(["sleep", "0.1"], check=True)
        raise AssertionError(f"child {child} outlived the timeout")
    assert not pid_alive(proc.pid)


def test_without_a_ceph_run_communicate_is_popens():
    proc = subprocess.Popen(["echo", "hi"], stdout=subprocess.PIPE, text=True)
    assert cephrun.communicate(proc, None) == ("hi\n", None)
