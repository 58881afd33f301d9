"""A Ceph cluster luksbench does not build (an rbd arm naming its ``conf``): the test builds a
one-OSD cluster with the project's own builder to stand in for someone else's, then stack-up's
arms on it create only their image, each run's client mode (crc, secure) is verified from the
probe's connections, stack-down removes the image, and the cluster's daemons, pool and other
image are untouched throughout. The test then tears its cluster down."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from luksbench.formats.plan import migrated_plan_document
from luksbench.testbox import ceph, cephdown, cephrun, lock
from luksbench.testbox.cephexisting import EXISTING_DIR_NAME
from luksbench.testbox.stacks import stack_down, stack_up
from luksbench.testbox.sysutil import TestboxError, run_tool

pytestmark = [pytest.mark.device, pytest.mark.slow]

TOOLS = ("fio", "ceph-mon", "ceph-osd", "rbd", "losetup")
OSD_FILE_MIB = 1024
IMAGE_MIB = 64


@pytest.fixture
def short_tmp():
    """A short folder: Ceph's admin sockets must fit AF_UNIX's 107 bytes."""
    missing = [t for t in TOOLS if not (shutil.which(t) or os.path.exists(f"/usr/sbin/{t}"))]
    if missing or os.geteuid() != 0:
        pytest.fail(f"needs root and {TOOLS}; missing: {missing}", pytrace=False)
    path = Path(tempfile.mkdtemp(prefix="lbce-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def take_the_box(plan: dict, state_path: Path, timeout: float = 900) -> None:
    """The test-box lock for this test's state (other tests measure meanwhile: wait for them)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lock.acquire(plan, state_path)
            return
        except lock.Locked:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def their_cluster(top: Path) -> dict:
    """Someone else's cluster: one OSD on a loop device over a sparse file, a pool with an
    image of theirs in it."""
    top.mkdir()
    block = top / "osd.img"
    with open(block, "wb") as f:
        f.truncate(OSD_FILE_MIB * 2**20)
    spec = {"block": str(block), "group": "theirs", "loop": True}
    return ceph.cluster_up(
        top, [spec], image_mib=IMAGE_MIB, image="their-image", daemon_modes="crc secure"
    )


def images(cluster: dict, pool: str) -> list[str]:
    out = run_tool(["rbd", "-c", cluster["conf"], "ls", "-p", pool, "--format", "json"], "rbd ls")
    return sorted(json.loads(out.stdout))


def daemons_now(cluster: dict) -> dict[str, tuple]:
    """Each daemon of the cluster: (pid, start time) as running now."""
    return {
        f"{d['tool']}.{d['id']}": (d["pid"], cephdown.start_time(d["pid"]))
        for d in cluster["daemons"]
    }


def existing_plan(tmp: Path, cluster: dict, pool: str, **arm) -> dict:
    base = {"kind": "rbd", "conf": cluster["conf"], "pool": pool, "image": "lbx", **arm}
    base.setdefault("keyring", str(Path(cluster["dir"]) / "admin.keyring"))
    return migrated_plan_document(
        {
            "run": "cephe",
            "host": "tb1",
            "backend": "userspace",
            "scratch_dir": str(tmp / "s"),
            "device_size_mib": 128,
            "precondition": False,
            "baseline": "crc",
            "stacks": {
                "crc": {**base, "mode": "crc", "image_mib": IMAGE_MIB},
                "secure": {**base, "mode": "secure", "image_mib": IMAGE_MIB},
            },
            "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [4]},
            "fio": {
                "ioengine": "libaio",
                "direct": True,
                "runtime_s": 1,
                "ramp_time_s": 0,
                "output_format": "json+",
            },
            "repetitions": 1,
            "seed": 1,
        }
    )


def run_arm(entry: dict, tmp: Path) -> dict:
    out = tmp / f"{entry['stack']}.json"
    argv = ["fio", f"--name={entry['stack']}", *cephrun.fio_target_for(entry), "--rw=randread"]
    argv += ["--bs=4k", "--iodepth=4", "--time_based", "--runtime=1s"]
    argv += ["--output-format=json", f"--output={out}"]
    proc, record = cephrun.run_entry_fio(
        entry,
        argv,
        cephrun.fio_timeout(1),
        tmp / f"{entry['stack']}.probe.log",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["jobs"][0]["read"]["total_ios"] > 0
    return record


def test_arms_on_an_existing_cluster_create_and_remove_only_their_image(short_tmp):
    tmp = short_tmp
    state_path = tmp / "s" / "state.json"
    holder_plan = {"run": "cephe", "host": "tb1", "scratch_dir": str(tmp / "s")}
    take_the_box(holder_plan, state_path)
    t0 = time.monotonic()
    cluster = their_cluster(tmp / "theirs")
    try:
        pool = cluster["pools"][0]["name"]
        before = daemons_now(cluster)
        assert images(cluster, pool) == ["their-image"]
        pools_before = ceph.ceph_cli(cluster, "osd", "pool", "ls")

        plan = existing_plan(tmp, cluster, pool)
        described = stack_up(plan, state_path, tmp / "stacks.json")
        try:
            state = json.loads(state_path.read_text())
            assert images(cluster, pool) == ["lbx", "their-image"]  # one image for both arms
            assert state["ceph"]["existing"] and state["order"] == ["crc", "secure"]
            assert (Path(state["scratch_dir"]) / EXISTING_DIR_NAME).is_dir()
            assert described["stacks"]["secure"]["osd_devices"][0]["encryption_known"] is False
            for name, mode in (("crc", "crc"), ("secure", "secure")):
                record = run_arm(state["stacks"][name], tmp)
                assert record["existing_cluster"] is True
                assert set(record["mode_probe"]["connections"].values()) == {mode}, record
                assert {"mon.0", "osd.0"} <= set(record["mode_probe"]["connections"])
            assert daemons_now(cluster) == before  # no daemon started, stopped or restarted
        finally:
            down = stack_down(state_path)
        assert down["ok"], down
        assert any("removed RBD image" in a for a in down["actions"]), down["actions"]
        assert images(cluster, pool) == ["their-image"]
        assert ceph.ceph_cli(cluster, "osd", "pool", "ls") == pools_before
        assert daemons_now(cluster) == before
        assert not (Path(plan["scratch_dir"]) / EXISTING_DIR_NAME).exists()

        # An image of theirs under an arm's name is refused, and left as it was.
        plan = existing_plan(tmp, cluster, pool, image="their-image")
        with pytest.raises(TestboxError, match=r"their-image already exists .* refused"):
            stack_up(plan, state_path, tmp / "stacks.json")
        assert images(cluster, pool) == ["their-image"]
        assert not state_path.exists()
        assert daemons_now(cluster) == before
    finally:
        if state_path.exists():  # a failure above left the arms' stacks up
            stack_down(state_path)
        take_the_box(holder_plan, state_path)  # stack-down gave it back; our cluster goes too
        result = cephdown.cluster_down(cluster["dir"])
        lock.release(state_path)
    assert not result["errors"], result
    print(f"existing-cluster test: {time.monotonic() - t0:.0f} s")
