"""Faults during a run lose nothing and explain themselves: a full disk, an interrupted workflow.

Real stacks, real fio, real (tmpfs) filesystems filling up, real signals.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit.testbox import run_fio_args, small_config
from testkit.workflow import copy_workflow

from luksbench.testbox.planbuild import plan_from_config
from luksbench.testbox.sysutil import MIN_FREE_BYTES

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LUKSBENCH = [sys.executable, "-m", "luksbench.cli", "testbox"]

pytestmark = pytest.mark.device

CONFIG = small_config(
    "faults", matrix={"rw": ["randread"], "bs": ["4k"], "iodepth": [1, 4]}, repetitions=3
)


def run_testbox(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LUKSBENCH, *args], capture_output=True, text=True, timeout=300)


def mounts_under(path: Path) -> list[str]:
    return [
        line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in line
    ]


@pytest.fixture
def small_raw_filesystem(tmp_path):
    """A tmpfs with room for a few fio results above the runner's free-space margin: 64 KiB,
    where a 4k json+ result (8-11 KiB in the sample) and its CPU sidecar take 12-16 KiB in 4 KiB
    pages, so the run stops after a few of its 12 results (at 204 KiB of room all 12 could fit,
    and in CI they did)."""
    mountpoint = tmp_path / "raw"
    mountpoint.mkdir()
    size_kib = MIN_FREE_BYTES // 1024 + 64
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mountpoint)], check=True
    )
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_a_full_raw_disk_stops_the_run_and_keeps_every_finished_result(
    tmp_path, small_raw_filesystem
):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_from_config(CONFIG, "tb1", tmp_path / "scratch")))
    state, describe = tmp_path / "state.json", tmp_path / "stacks.json"
    host_dir = small_raw_filesystem / "faults" / "tb1"
    assert (
        run_testbox(
            "stack-up", "--plan", str(plan), "--state", str(state), "--describe", str(describe)
        ).returncode
        == 0
    )
    try:
        result = run_testbox(
            *run_fio_args(plan, state, host_dir, host_dir / "fio" / "manifest.json"),
        )
    finally:
        down = run_testbox("stack-down", "--state", str(state))
    assert result.returncode == 1
    assert "no space left for raw results" in result.stderr
    assert "finished repetitions are kept" in result.stderr
    kept = [p for p in host_dir.glob("fio/*/*/rep*.json") if not p.name.endswith(".cpu.json")]
    assert 0 < len(kept) < 2 * 2 * 3, "stopped early, after some results"
    for path in kept:
        assert json.loads(path.read_text())["jobs"], f"{path} is complete fio JSON"
    assert not list(host_dir.rglob("*.tmp")), "no partial file left"
    assert down.returncode == 0 and "checks passed" in down.stderr
    assert mounts_under(tmp_path / "scratch") == []


@pytest.mark.slow
@pytest.mark.parametrize("to", ["group", "process"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_workflow_tears_down_keeps_what_it_measured_and_resumes(
    tmp_path, signum, to
):
    """Ctrl-C (SIGINT to the process group), a service stop (SIGTERM) or `kill PID` (to the
    snakemake process alone) mid-run: fio stops at once, the stacks come down, and running the
    same command again measures the rest."""
    work = copy_workflow(tmp_path / "work")
    (work / "small.yaml").write_text(
        "run: interrupted\ndevice_size_mib: 64\nmatrix: {rw: [randread, write], bs: [4k], iodepth: [4]}\n"
        "fio: {runtime_s: 1, ramp_time_s: 0}\nrepetitions: 3\n"
    )
    # Ctrl-C resumes to the paper as a user would; the other three stop at the ingested table
    # (the interruption and the resumed measuring are what they test, the publishing is the same)
    published = signum == signal.SIGINT and to == "group"
    target = "all" if published else "data/processed/interrupted/fio.parquet"
    command = [str(BIN / "snakemake"), "--cores", "1", target, "--configfile", "small.yaml"]
    raw = work / "data" / "raw" / "interrupted"
    log = tmp_path / "snakemake.log"
    with log.open("w") as out:
        workflow = subprocess.Popen(
            command,
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal or service manager has
        )
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and workflow.poll() is None:
                if len(list(raw.glob("*/fio/*/*/rep*.cpu.json"))) >= 2:
                    break
                time.sleep(0.2)
            running = workflow.poll() is None
            if running and to == "group":
                os.killpg(workflow.pid, signum)
            elif running:
                os.kill(workflow.pid, signum)
        finally:
            workflow.wait(timeout=240)
    output = log.read_text()
    assert running, f"the workflow ended before it could be interrupted:\n{output[-3000:]}"

    assert workflow.returncode != 0
    assert "tearing down the stacks" in output and "checks passed" in output
    assert mounts_under(work) == []
    assert not list((work / "data" / "scratch" / "interrupted").glob("*/state.json"))
    kept = {
        p: p.read_bytes()
        for p in raw.glob("*/fio/*/*/rep*.json")
        if not p.name.endswith(".cpu.json")
    }
    assert kept, "results finished before the signal are kept"
    assert len(kept) < 2 * 2 * 3, "fio went on measuring after the signal"
    for content in kept.values():
        assert json.loads(content)["jobs"]
    assert not list(raw.rglob("*.tmp"))
    leftover = subprocess.run(["pgrep", "-af", str(work)], capture_output=True, text=True)
    assert leftover.stdout == "", leftover.stdout
    (run_fio_log,) = (work / "logs" / "interrupted").glob("*/run_fio.log")
    assert "interrupted by SIG" in run_fio_log.read_text(), "how run-fio stopped is in its log"

    again = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    reps = [p for p in raw.glob("*/fio/*/*/rep*.json") if not p.name.endswith(".cpu.json")]
    assert len(reps) == 2 * 2 * 3
    assert {p: kept[p] == p.read_bytes() for p in kept} == dict.fromkeys(kept, True)
    assert (work / "data" / "processed" / "interrupted" / "fio.parquet").exists()
    assert (work / "paper" / "interrupted" / "index.md").exists() == published


@pytest.mark.slow
def test_the_key_never_leaves_its_file_during_a_workflow_run(tmp_path):
    """Logs, raw data, processed tables, figures, paper and every process's argv: no key material."""
    work = copy_workflow(tmp_path / "work")
    (work / "small.yaml").write_text(
        "run: secrets\ndevice_size_mib: 64\nmatrix: {rw: [randwrite], bs: [4k], iodepth: [4]}\n"
        "fio: {runtime_s: 1, ramp_time_s: 0}\nrepetitions: 2\n"
    )
    log = tmp_path / "snakemake.log"
    keys: set[str] = set()
    argv_seen: list[str] = []
    with log.open("w") as out:
        workflow = subprocess.Popen(
            [str(BIN / "snakemake"), "--cores", "1", "all", "--configfile", "small.yaml"],
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        while workflow.poll() is None:
            for key_file in (work / "data" / "scratch").rglob("*.key"):
                # (a key file may be removed at teardown between listing and reading)
                with contextlib.suppress(OSError):
                    keys.add(key_file.read_text())
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):
                    argv_seen.append(cmdline.read_bytes().decode(errors="replace"))
            time.sleep(0.1)
    assert workflow.returncode == 0, log.read_text()[-3000:]
    assert keys, "the run's key file was never seen: the test did not look at the right place"
    assert not list((work / "data" / "scratch").rglob("*.key")), "key files are removed"
    for key in keys:
        assert len(key) >= 32
        assert not [argv for argv in argv_seen if key in argv], "key on a command line"
        for path in work.rglob("*"):
            if path.is_file():
                assert key.encode() not in path.read_bytes(), f"key material in {path}"
        assert key not in log.read_text()
