"""The box lock for real: a second stack-up on the test box is refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from testkit.testbox import luksbench_testbox_argv, small_config

from luksbench.testbox import lock
from luksbench.testbox.planbuild import plan_from_config

CONFIG = small_config("holder")
LUKSBENCH = luksbench_testbox_argv()


@pytest.mark.device
def test_a_second_stack_up_on_the_box_is_refused(tmp_path):
    def stack_up(name: str) -> tuple[subprocess.CompletedProcess, Path]:
        work = tmp_path / name
        work.mkdir()
        plan = work / "plan.json"
        plan.write_text(
            json.dumps(plan_from_config({**CONFIG, "run": name}, "box", work / "scratch"))
        )
        result = subprocess.run(
            [
                *LUKSBENCH,
                "stack-up",
                "--plan",
                str(plan),
                "--state",
                str(work / "state.json"),
                "--describe",
                str(work / "stacks.json"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return result, work

    def stack_down(work: Path) -> None:
        subprocess.run(
            [*LUKSBENCH, "stack-down", "--state", str(work / "state.json")],
            check=True,
            capture_output=True,
            timeout=120,
        )

    first, first_work = stack_up("first")
    assert first.returncode == 0, first.stderr
    try:
        second, second_work = stack_up("second")
        assert second.returncode != 0
        assert "the test box is busy: run 'first'" in second.stderr
        assert not list((second_work / "scratch").glob("*.img")), "refused before creating anything"
    finally:
        stack_down(first_work)
    third, third_work = stack_up("third")
    assert third.returncode == 0, third.stderr
    stack_down(third_work)
    assert not (lock.LOCK_DIR / lock.LOCK_NAME).exists()


@pytest.mark.device
def test_env_capture_and_cipher_benchmark_wait_for_the_run_that_holds_the_box(tmp_path):
    """A run holds the box from its first step on (its workflow session lives): another run's
    steps that load the machine are refused before they start, and write nothing."""
    holder = plan_from_config({**CONFIG, "run": "holder"}, "box", tmp_path / "holder")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_from_config({**CONFIG, "run": "second"}, "box", tmp_path)))
    workflow = subprocess.Popen(["sleep", "120"])  # stands in for the holder's snakemake
    try:
        lock.acquire(holder, session={"pid": workflow.pid, "started": lock.started(workflow.pid)})
        for step, out in (("capture-env", "env.json"), ("benchmark-ciphers", "ciphers.txt")):
            result = subprocess.run(
                [*LUKSBENCH, step, "--plan", str(plan), "--out", str(tmp_path / out)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 1, result.stderr
            assert "the test box is busy: run 'holder'" in result.stderr
            assert "is measuring" in result.stderr
            assert not (tmp_path / out).exists()
    finally:
        workflow.kill()
        workflow.wait()
        lock.release(tmp_path / "holder" / "state.json")
    assert not (lock.LOCK_DIR / lock.LOCK_NAME).exists()
