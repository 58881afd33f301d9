"""Faults of a run on the cluster it builds itself (config/ceph-small.yaml): an OSD killed while
fio runs stops the run with an error naming it, the failure handler leaves no Ceph daemon, fio,
admin socket, loop device or cluster folder, and the results measured before stay as they were;
a `kill -9` of snakemake mid-run, then the same command, finishes the run with nothing of the
cluster left and no result counted twice. Real snakemake, real cluster (one to two minutes each,
about 3 GiB for the two OSDs)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from testkit.workflow import copy_workflow, no_step_outlives_its_workflow, processes_of, raw_results

from luksbench.studies import load_config
from luksbench.testbox import lock
from luksbench.testbox.sysutil import cmdline

pytestmark = [pytest.mark.device, pytest.mark.slow]

BIN = Path(sys.executable).parent
TOOLS = ("fio", "cryptsetup", "qemu-storage-daemon", "fusermount3", "ceph-mon", "ceph-osd", "rbd")
RUN = "ceph-small"
ARMS = ("plain", "secure", "luks", "luks-secure")
TARGET = f"data/processed/{RUN}/fio.parquet"


def small_design(work: Path) -> tuple[list[str], int]:
    """The cells of config/ceph-small.yaml and its repetitions (the schema's default, which the
    file leaves out), as the workflow resolves them."""
    config = load_config(work, [work / "config/ceph-small.yaml"])
    m = config["matrix"]
    cells = [f"{rw}-{bs}-qd{qd}" for rw in m["rw"] for bs in m["bs"] for qd in m["iodepth"]]
    return cells, config["repetitions"]


def workflow_argv(*configs: str, run: str = RUN) -> list[str]:
    argv = [str(BIN / "snakemake"), "--cores", "1", f"data/processed/{run}/fio.parquet"]
    return [*argv, "--configfile", "config/ceph-small.yaml", *configs]


def named(work: Path, tool: str) -> list[int]:
    return [p for p in processes_of(work) if os.path.basename(cmdline(p)[0] or "") == tool]


def results(work: Path, run: str = RUN) -> dict[Path, bytes]:
    return raw_results(work, run)


def cluster_record(work: Path, run: str = RUN) -> dict:
    for path in (work / "data" / "scratch" / run).glob("*/ceph/cluster.json"):
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
    return {}


def ceph_leftovers(work: Path) -> dict:
    """Everything of the cluster and of fio that must be gone."""
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    holder = lock.holder() or {}
    return {
        "ceph_processes": {
            p: cmdline(p) for p in named(work, "ceph-mon") + named(work, "ceph-osd")
        },
        "fio": {p: cmdline(p) for p in named(work, "fio")},
        "sockets": [str(p) for p in work.rglob("*.asok")],
        "loop_devices": [line for line in loops.splitlines() if str(work) in line],
        "cluster_folders": [str(p) for p in (work / "data" / "scratch").glob("*/*/ceph")],
        "mounts": [
            m for m in Path("/proc/self/mountinfo").read_text().splitlines() if str(work) in m
        ],
        "lock": holder if str(work) in str(holder.get("state")) else None,
    }


NOTHING_LEFT = {
    "ceph_processes": {},
    "fio": {},
    "sockets": [],
    "loop_devices": [],
    "cluster_folders": [],
    "mounts": [],
    "lock": None,
}


def wait_for_the_box(timeout: float = 900) -> None:
    """Other tests measure on this box (they hold the lock): wait for them."""
    deadline = time.monotonic() + timeout
    while lock.holder() is not None and time.monotonic() < deadline:
        time.sleep(1)


def box_was_busy(work: Path, output: str) -> bool:
    logs = "".join(p.read_text(errors="replace") for p in (work / "logs").rglob("*.log"))
    return "the test box is busy" in output + logs


def clean_up(work: Path) -> None:
    """Whatever a failed test left: processes killed, stacks and cluster down, lock released."""
    for pid in processes_of(work):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    for state in (work / "data" / "scratch").glob("*/*/state.json"):
        luksbench = [sys.executable, "-m", "luksbench.cli", "testbox", "stack-down"]
        subprocess.run([*luksbench, "--state", str(state)], check=False, timeout=300)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if str(work) in line:
            subprocess.run(["umount", "-l", line.split()[4]], check=False)
    holder = lock.holder() or {}
    if str(work) in str(holder.get("state")):
        (lock.LOCK_DIR / lock.LOCK_NAME).unlink(missing_ok=True)


@pytest.fixture
def work():
    """The workflow in a short folder (Ceph's admin sockets must fit AF_UNIX paths)."""
    missing = [t for t in TOOLS if not (shutil.which(t) or os.path.exists(f"/usr/sbin/{t}"))]
    if missing or os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.fail(f"needs root, /dev/fuse and {TOOLS}; missing: {missing}", pytrace=False)
    wait_for_the_box()
    top = Path(tempfile.mkdtemp(prefix="lbcf-", dir="/tmp"))
    work = copy_workflow(top / "w").resolve()
    try:
        yield work
    finally:
        clean_up(work)
        shutil.rmtree(top, ignore_errors=True)


def run_until(
    work: Path, argv: list[str], moment: Callable[[], bool], act: Callable[[int], None]
) -> tuple[int, str]:
    """Start the workflow, call ``act(snakemake pid)`` once ``moment()`` holds, wait for the
    workflow's end: (exit code, output). Started again while another test holds the box."""
    for _attempt in range(3):
        log = work.parent / "workflow.log"
        with log.open("w") as out:
            workflow = subprocess.Popen(
                argv, cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                deadline = time.monotonic() + 400
                while not moment() and workflow.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if workflow.poll() is not None and box_was_busy(work, log.read_text()):
                    wait_for_the_box()
                    continue
                assert workflow.poll() is None, (
                    f"ended before the moment:\n{log.read_text()[-3000:]}"
                )
                act(workflow.pid)
                code = workflow.wait(timeout=400)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(workflow.pid, signal.SIGKILL)
                raise
        return code, log.read_text()
    pytest.fail("the test box stayed busy with other runs")


def fio_on_an_arm_after(work: Path, done: int, run: str = RUN) -> Callable[[], bool]:
    """The moment: ``done`` results written and fio measuring the next one."""
    return lambda: len(results(work, run)) >= done and bool(named(work, "fio"))


def test_an_osd_killed_during_fio_stops_the_run_naming_it(work):
    (work / "osdkill.yaml").write_text("run: cephosd\nfio: {runtime_s: 4, ramp_time_s: 0}\n")
    argv = workflow_argv("osdkill.yaml", run="cephosd")
    killed: dict = {}

    def kill_an_osd(_snakemake: int) -> None:
        osd = next(d for d in cluster_record(work, "cephosd")["daemons"] if d["tool"] == "ceph-osd")
        killed.update(osd, results=results(work, "cephosd"), at=time.monotonic())
        os.kill(osd["pid"], signal.SIGKILL)

    t0 = time.monotonic()
    code, out = run_until(work, argv, fio_on_an_arm_after(work, 2, "cephosd"), kill_an_osd)
    stopped_after = time.monotonic() - killed["at"]
    logs = out + "".join(p.read_text(errors="replace") for p in (work / "logs").rglob("*.log"))
    assert code != 0, out[-3000:]
    name = f"osd.{killed['id']} (pid {killed['pid']})"
    assert f"Ceph daemon(s) {name} of the run's cluster exited during fio's run" in logs, logs[
        -4000:
    ]
    assert "tearing down the stacks" in out and "checks passed" in out, out[-3000:]
    no_step_outlives_its_workflow(work, timeout=120)
    assert ceph_leftovers(work) == NOTHING_LEFT
    after = results(work, "cephosd")
    assert {p: after.get(p) for p in killed["results"]} == killed["results"], "raw data lost"
    assert len(after) == len(killed["results"]), "a result of the failed run was written"
    print(
        f"OSD kill: stopped {stopped_after:.1f} s after the kill; test {time.monotonic() - t0:.0f} s"
    )


def test_snakemake_killed_mid_run_then_resumed_leaves_no_ceph_and_counts_once(work):
    t0 = time.monotonic()
    argv = workflow_argv()
    code, out = run_until(
        work, argv, fio_on_an_arm_after(work, 2), lambda pid: os.kill(pid, signal.SIGKILL)
    )
    assert code == -signal.SIGKILL, out[-3000:]
    no_step_outlives_its_workflow(work, timeout=120)  # run-fio stopped fio, kept no partial result
    cells, repetitions = small_design(work)
    every_result = len(ARMS) * len(cells) * repetitions  # one session
    before = results(work)
    assert 2 <= len(before) < every_result
    assert cluster_record(work).get("daemons"), "the cluster stays up until the next start"

    again = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "ended without tearing them down" in again.stderr
    after = results(work)
    assert {p: after[p] for p in before} == before, "a result measured before was rewritten"
    # A pair the killed session measured in part is never completed in another stack-up (other
    # cluster): its cell gets new pair numbers, so every cell ends with its complete pairs.
    pairs: dict[tuple[str, str], set[str]] = {}
    for path in after:
        stack, cell, rep = path.parts[-3], path.parts[-2], path.stem
        pairs.setdefault((cell, rep), set()).add(stack)
    complete = [key for key, stacks in pairs.items() if len(stacks) == len(ARMS)]
    assert sorted(cell for cell, _ in complete) == sorted(cells * repetitions)
    assert len(after) - len(before) <= every_result
    fio = pd.read_parquet(work / TARGET)
    keys = ["stack", "workload", "rep", "job_slot"]
    assert not fio.duplicated(keys).any(), "a result counted twice"
    assert len(fio) <= len(after)
    manifests = list(work.glob(f"data/raw/{RUN}/*/fio/manifest.json"))
    assert len(manifests) == 1
    runs = json.loads(manifests[0].read_text())["runs"]
    assert len({r["path"] for r in runs}) == len(runs), "a run listed twice in the manifest"
    print(f"before the kill {len(before)} results, after the resume {len(after)}, table {len(fio)}")
    assert ceph_leftovers(work) == NOTHING_LEFT
    print(f"kill -9 and resume: {time.monotonic() - t0:.0f} s")
