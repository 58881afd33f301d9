"""The documented small Ceph config through the whole workflow: snakemake builds the cluster at
stack-up, measures the four arms (crc and secure clients over a plain and a LUKS OSD) with each
run's mode verified and the daemons' CPU recorded in its sidecar, tears the cluster down, and
publishes; nothing of the cluster is left. About two minutes here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from testkit.workflow import copy_workflow

from luksbench.testbox import cephdown

pytestmark = [pytest.mark.device, pytest.mark.slow]

BIN = Path(sys.executable).parent
TOOLS = ("fio", "cryptsetup", "qemu-storage-daemon", "fusermount3", "ceph-mon", "ceph-osd", "rbd")
ARMS = {"plain": ("crc", False), "secure": ("secure", False)}
ARMS |= {"luks": ("crc", True), "luks-secure": ("secure", True)}


@pytest.fixture
def workdir():
    """A copy of the workflow in a short folder: Ceph's admin sockets must fit AF_UNIX paths."""
    missing = [t for t in TOOLS if not (shutil.which(t) or os.path.exists(f"/usr/sbin/{t}"))]
    if missing or os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.fail(f"needs root, /dev/fuse and {TOOLS}; missing: {missing}", pytrace=False)
    path = Path(tempfile.mkdtemp(prefix="lbcw-", dir="/tmp"))
    yield copy_workflow(path)
    shutil.rmtree(path, ignore_errors=True)


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [str(BIN / "snakemake"), "--cores", "1", *args]
    argv += ["--configfile", "config/ceph-small.yaml"]
    return subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=900)


def our_processes(workdir: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if proc.name.isdigit() and str(workdir) in cmd and "pytest" not in cmd:
            found.append(cmd)
    return found


def test_the_small_ceph_config_runs_end_to_end(workdir):
    result = snakemake(workdir, "all")
    assert result.returncode == 0, result.stderr[-4000:]

    fio_dir = next((workdir / "data" / "raw" / "ceph-small").iterdir()) / "fio"
    sidecars = sorted(fio_dir.glob("*/*/rep*.cpu.json"))
    assert len(sidecars) == 4 * 2 * 2  # arms x cells x repetitions
    osd_cpu = 0.0
    for path in sidecars:
        arm = path.parts[-3]
        mode, encrypted = ARMS[arm]
        record = json.loads(path.read_text())["ceph"]
        assert record["messenger_mode"] == mode, path
        assert set(record["mode_probe"]["connections"].values()) == {mode}, path
        assert {"mon.0", "osd.0"} & set(record["mode_probe"]["connections"]), path
        assert all((d["encryption"] is not None) == encrypted for d in record["osd_devices"])
        assert (path.parent / record["mode_probe"]["log"]).stat().st_size > 0
        osd_cpu += sum(v for k, v in record["daemon_cpu_s"].items() if k.startswith("ceph-osd"))
    assert osd_cpu > 0  # the OSDs did the I/O, and their CPU was read over each run

    processed = workdir / "data" / "processed" / "ceph-small"
    assert (processed / "loss.parquet").stat().st_size > 0
    assert (workdir / "paper" / "ceph-small" / "index.md").exists()

    scratch = workdir / "data" / "scratch" / "ceph-small"
    assert not list(scratch.rglob("ceph")), "the cluster's folder was left"
    assert not cephdown.cluster_processes(next(scratch.iterdir()) / "ceph")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    assert str(workdir) not in loops, loops
    assert not our_processes(workdir)
    again = snakemake(workdir, "-n", "all")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
