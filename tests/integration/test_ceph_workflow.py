"""The documented small Ceph config through the whole workflow: snakemake builds the cluster at
stack-up, measures the four arms (crc and secure clients over a plain and a LUKS OSD) with each
run's mode verified and the daemons' CPU recorded in its sidecar, tears the cluster down, and
publishes, the paper's Ceph section from the processed tables; nothing of the cluster is left.
About three minutes here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from testkit.workflow import copy_workflow, failure_report

from luksbench.analysis.ceph_tables import PROCESS_TREE
from luksbench.publish.text import decision_kind, effect_ci
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
    assert result.returncode == 0, failure_report(result, workdir)

    fio_dir = next((workdir / "data" / "raw" / "ceph-small").iterdir()) / "fio"
    sidecars = sorted(fio_dir.glob("*/*/rep*.cpu.json"))
    config = yaml.safe_load((workdir / "config" / "ceph-small.yaml").read_text())
    # the repetitions the run measured (the schema's default: ceph-small.yaml leaves it out)
    config["repetitions"] = json.loads((fio_dir.parent / "env.json").read_text())["plan"][
        "repetitions"
    ]
    cells = len(config["matrix"]["rw"]) * len(config["matrix"]["bs"])
    assert (
        len(sidecars)
        == len(ARMS) * cells * len(config["matrix"]["iodepth"]) * config["repetitions"]
    )
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
    assert_ceph_tables_are_the_sidecars(processed, fio_dir.parent.parent)
    assert_the_ceph_section_prints_the_tables(processed, workdir / "paper" / "ceph-small")

    scratch = workdir / "data" / "scratch" / "ceph-small"
    assert not list(scratch.rglob("ceph")), "the cluster's folder was left"
    assert not cephdown.cluster_processes(next(scratch.iterdir()) / "ceph")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    assert str(workdir) not in loops, loops
    assert not our_processes(workdir)
    again = snakemake(workdir, "-n", "all")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]


def assert_ceph_tables_are_the_sidecars(processed: Path, raw: Path) -> None:
    """Every run's row of the ceph table holds what its sidecar recorded: the arm's OSDs' CPU,
    fio's process tree, the mode its connections used."""
    ceph = pd.read_parquet(processed / "ceph.parquet")
    assert len(ceph) == len(list(raw.glob("*/fio/*/*/rep*.cpu.json")))
    for row in ceph.to_dict("records"):
        record = json.loads((raw / row["file"].replace(".json", ".cpu.json")).read_text())["ceph"]
        osds = [f"ceph-osd.{d['osd']}" for d in record["osd_devices"]]
        assert row["osd_cpu_s"] == pytest.approx(sum(record["daemon_cpu_s"][n] for n in osds))
        assert row["client_cpu_s"] == record["client_cpu_s"] > 0
        assert row["client_cpu_basis"] == PROCESS_TREE
        assert row["messenger_mode_seen"] == ARMS[row["stack"]][0]
        assert bool(row["osd_encrypted"]) == ARMS[row["stack"]][1]


def assert_the_ceph_section_prints_the_tables(processed: Path, paper: Path) -> None:
    """The paper's Ceph section quotes the loss stage's Ceph rows and the Reef rows it matched."""
    text = (paper / "index.md").read_text()
    section = text.split("## Ceph: on-disk and on-the-wire encryption", 1)[1]
    section = section.split("\n## ", 1)[0]
    cpu = pd.read_parquet(processed / "ceph_loss.parquet")
    rows = cpu[cpu["metric"].isin(["osd_cpu_us_per_io", "client_cpu_us_per_io"])]
    assert len(rows) == 3 * 2 * 2  # three arms against plain, two cells, client and OSD
    for r in rows.to_dict("records"):
        quoted = f"{effect_ci(r)} {decision_kind(r['decision'])}"
        assert quoted in section, quoted
    reef = pd.read_parquet(processed / "ceph_reef.parquet")
    assert len(reef) > 0  # 4k random reads and writes at QD128: the Reef 4 KB tables' shape
    for published in reef["pct_of_unencrypted_as_published"]:
        assert f"| {published} |" in section
