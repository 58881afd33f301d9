"""kill -9 (the OOM killer) at the worst moments of a measured run: snakemake during stack-up and
during run_fio, the `luksbench testbox stack-up` process itself, run_fio's job shell. The same
command then resumes, counts no result twice, and leaves no FUSE export, daemon, key file, undo
log or test-box lock behind. Real snakemake, real stacks, real fio (seconds of it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from testkit.testbox import small_config
from testkit.testbox import testbox as tb
from testkit.workflow import copy_workflow, no_step_outlives_its_workflow, processes_of, raw_results

from luksbench.testbox import lock
from luksbench.testbox.planbuild import plan_from_config
from luksbench.testbox.sysutil import cmdline

BIN = Path(sys.executable).parent
LUKSBENCH = [sys.executable, "-m", "luksbench.cli", "testbox"]

pytestmark = [pytest.mark.device, pytest.mark.slow]

RUN = "killed"
SMALL = f"""\
run: {RUN}
host: tb
device_size_mib: 64
matrix: {{rw: [randread], bs: [4k], iodepth: [1, 4]}}
fio: {{runtime_s: 1, ramp_time_s: 0}}
repetitions: 2
"""
RESULTS = 2 * 2 * 2  # cells x stacks (plain, luks) x repetitions
TARGET = f"data/processed/{RUN}/fio.parquet"


def workflow_argv() -> list[str]:
    return [str(BIN / "snakemake"), "--cores", "1", TARGET, "--configfile", "small.yaml"]


def scratch(work: Path) -> Path:
    return work / "data" / "scratch" / RUN / "tb"


def steps(work: Path, command: str) -> list[int]:
    """`luksbench testbox <command>` processes working in ``work``."""
    return [pid for pid in processes_of(work) if {"testbox", command} <= set(cmdline(pid))]


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def results(work: Path) -> dict[Path, bytes]:
    return raw_results(work, RUN)


def built_something(work: Path) -> bool:
    """stack-up has started a storage daemon (the userspace backend) or recorded a device."""
    with contextlib.suppress(OSError, ValueError):
        state = json.loads((scratch(work) / "state.json").read_text())
        entries = state["stacks"].values()
        return bool(state.get("objects")) or any(e.get("daemon") for e in entries)
    return False


def measured_some(work: Path) -> bool:
    return len(results(work)) >= 2


def leftovers(work: Path) -> dict:
    """Everything of the run that must be gone once it finished."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    files = [
        p
        for pattern in ("state.json", "stacks.json", "*.img", "*.fuse", "*.key", ".luksbench-*")
        for p in scratch(work).rglob(pattern)
    ]
    holder = lock.holder() or {}
    return {
        "mounts": [m for m in mounts if str(work) in m],
        "processes": {pid: cmdline(pid) for pid in processes_of(work)},
        "files": files,
        "lock": holder if str(work) in str(holder.get("state")) else None,
    }


def clean_up(work: Path) -> None:
    """Whatever a failed test left: processes killed, stacks torn down, the lock released."""
    for pid in processes_of(work):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    state = scratch(work) / "state.json"
    if state.exists():
        subprocess.run([*LUKSBENCH, "stack-down", "--state", str(state)], check=False, timeout=120)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if str(work) in line:
            subprocess.run(["umount", "-l", line.split()[4]], check=False)
    holder = lock.holder() or {}
    if str(work) in str(holder.get("state")):
        (lock.LOCK_DIR / lock.LOCK_NAME).unlink(missing_ok=True)


def wait_for_the_box(timeout: float = 900) -> None:
    """Other runs on this box (other tests) hold the lock while they measure: wait for them."""
    deadline = time.monotonic() + timeout
    while lock.holder() is not None and time.monotonic() < deadline:
        time.sleep(1)


@pytest.fixture
def work(tmp_path):
    wait_for_the_box()
    work = copy_workflow(tmp_path / "work").resolve()
    (work / "small.yaml").write_text(SMALL)
    try:
        yield work
    finally:
        clean_up(work)


def box_was_busy(work: Path, output: str) -> bool:
    """Whether a run failed only because another run (another test) held the test box."""
    logs = "".join(p.read_text() for p in (work / "logs").rglob("*.log"))
    return "the test box is busy" in output + logs


def interrupt(work: Path, moment: Callable[[Path], bool], kill: Callable[[int], int]) -> str:
    """Run the workflow until ``moment``, then SIGKILL the process ``kill(snakemake pid)`` names;
    the workflow's output. Started again while another run holds the box."""
    for _attempt in range(3):
        output = interrupt_once(work, moment, kill)
        if output is not None:
            return output
        wait_for_the_box()
    pytest.fail("the test box stayed busy with other runs")


def interrupt_once(work: Path, moment, kill) -> str | None:
    log = work.parent / "interrupted.log"
    with log.open("w") as out:
        workflow = subprocess.Popen(
            workflow_argv(), cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 300
            while not moment(work) and workflow.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if workflow.poll() is not None and box_was_busy(work, log.read_text()):
                return None
            assert workflow.poll() is None, f"ended before the moment:\n{log.read_text()[-3000:]}"
            os.kill(kill(workflow.pid), signal.SIGKILL)  # that process alone, as the OOM killer
            workflow.wait(timeout=300)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(workflow.pid, signal.SIGKILL)
            raise
    return log.read_text()


def resumes_cleanly(work: Path, before: dict[Path, bytes]) -> str:
    """The same command finishes the run: results measured before are kept as they were, each
    result is counted once, nothing is left behind. Its output."""
    for _attempt in range(3):
        again = subprocess.run(
            workflow_argv(), cwd=work, capture_output=True, text=True, timeout=900
        )
        if again.returncode == 0 or not box_was_busy(work, again.stderr):
            break
        wait_for_the_box()
    assert again.returncode == 0, again.stderr[-4000:]
    after = results(work)
    assert len(after) == RESULTS
    assert {p: after[p] for p in before} == before, "a result measured before was rewritten"
    fio = pd.read_parquet(work / TARGET)
    keys = ["stack", "workload", "rep", "job_slot"]
    assert len(fio) == RESULTS and not fio.duplicated(keys).any(), "a result counted twice"
    assert leftovers(work) == {"mounts": [], "processes": {}, "files": [], "lock": None}
    return again.stderr


def test_snakemake_killed_during_stack_up(work):
    out = interrupt(work, built_something, kill=lambda snakemake: snakemake)
    no_step_outlives_its_workflow(work)  # stack-up unwound: it undoes what it built
    rerun = resumes_cleanly(work, results(work))
    assert "removed the directory lock of a snakemake that is no longer running" in rerun, out


def test_stack_up_itself_killed(work):
    def stack_up(_snakemake: int) -> int:
        (pid,) = steps(work, "stack-up")
        return pid

    out = interrupt(work, built_something, kill=stack_up)
    # Snakemake removed the failed job's outputs; the undo log was none of them.
    assert "tearing down the stacks" in out and "checks passed" in out, out[-3000:]
    assert leftovers(work) == {"mounts": [], "processes": {}, "files": [], "lock": None}
    resumes_cleanly(work, results(work))


def test_snakemake_killed_during_run_fio(work):
    interrupt(work, measured_some, kill=lambda snakemake: snakemake)
    no_step_outlives_its_workflow(work)  # run-fio stopped fio and kept no partial result
    before = results(work)
    assert 2 <= len(before) < RESULTS
    assert not list(work.glob("data/raw/*/*/fio/manifest.json")), "no manifest of a part"
    # Its stacks stay up until the next start of the run tears them down.
    assert (scratch(work) / "state.json").exists()
    rerun = resumes_cleanly(work, before)
    assert "ended without tearing them down" in rerun


def test_run_fio_job_shell_killed(work):
    def job_shell(_snakemake: int) -> int:
        (pid,) = steps(work, "run-fio")
        return parent(pid)

    out = interrupt(work, measured_some, kill=job_shell)
    assert "tearing down the stacks" in out and "checks passed" in out, out[-3000:]
    no_step_outlives_its_workflow(work)
    before = results(work)
    assert not list(work.glob("data/raw/*/*/fio/manifest.json")), "no manifest of a part"
    assert leftovers(work) == {"mounts": [], "processes": {}, "files": [], "lock": None}
    resumes_cleanly(work, before)


def test_stack_down_without_its_state_removes_what_the_scratch_folder_shows(tmp_path):
    """The undo log lost (deleted by hand, or by an older version's failed job): stack-down
    still finds the FUSE exports, their daemons, backing files and key files of the stacks."""
    wait_for_the_box()
    scratch = tmp_path / "scratch"
    matrix = {"rw": ["randread"], "bs": ["4k"], "iodepth": [1]}
    config = small_config("lost", backend="userspace", matrix=matrix)
    plan, state = tmp_path / "plan.json", scratch / "state.json"
    plan.write_text(json.dumps(plan_from_config(config, "tb", scratch)))
    try:
        tb("stack-up", "--plan", plan, "--state", state, "--describe", scratch / "stacks.json")
        built = leftovers(tmp_path)
        assert len(built["mounts"]) == 2 and len(built["processes"]) == 2, built
        assert list(scratch.glob(".luksbench-keys-*/*")), "the luks stack's key file"
        state.unlink()
        down = tb("stack-down", "--state", state)
        assert "is missing; tearing down what" in down.stderr and "checks passed" in down.stderr
        left = leftovers(tmp_path)
        assert not left["mounts"] and not left["processes"] and not left["lock"], left
        assert sorted(p.name for p in scratch.iterdir()) == []
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            if str(tmp_path) in line:
                subprocess.run(["umount", "-l", line.split()[4]], check=False)
        for pid in processes_of(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        holder = lock.holder() or {}
        if str(tmp_path) in str(holder.get("state")):
            (lock.LOCK_DIR / lock.LOCK_NAME).unlink(missing_ok=True)
