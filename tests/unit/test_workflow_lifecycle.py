"""The workflow's lifecycle hooks (orchestrate/lifecycle.py): the test box released at the end,
stacks torn down after a failure, stop signals forwarded to the jobs, a dry run or a look
recovering nothing, a stale Snakemake directory lock removed only when no snakemake runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from testkit.paths import REPO as REPO_DIR
from testkit.plans import validated
from testkit.workflow import copy_workflow

from luksbench.orchestrate import lifecycle
from luksbench.testbox import lock
from luksbench.testbox.planbuild import plan_from_config

BIN = Path(sys.executable).parent
CONFIG = validated(
    {
        "run": "hooks",
        "backend": "auto",
        "device_size_mib": 64,
        "precondition": {"enabled": False},
        "baseline": "plain",
        "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}},
        "matrix": {"rw": ["read"], "bs": ["4k"], "iodepth": [1]},
        "fio": {"ioengine": "libaio", "direct": True, "runtime_s": 1, "ramp_time_s": 0},
        "repetitions": 1,
        "seed": 1,
    }
)


@pytest.fixture
def held_box(tmp_path, monkeypatch):
    """A test box (lock folder) held by this process's session for a run's state file. The
    session is this process, whatever pytest inherited: `onerror` stops the session's leftovers."""
    monkeypatch.setenv(lock.SESSION_ENV, str(os.getpid()))
    locks, state = tmp_path / "locks", tmp_path / "scratch" / "state.json"
    state.parent.mkdir()
    lock.acquire(plan_from_config(CONFIG, "box", state.parent), state, lock_dir=locks)
    assert (locks / lock.LOCK_NAME).exists()
    return locks, state


def test_success_releases_the_box_unless_stacks_are_still_up(held_box):
    locks, state = held_box
    state.write_text("{}")  # stacks up (kept between sessions): the run still holds the box
    assert not lifecycle.on_success(state, locks)
    assert (locks / lock.LOCK_NAME).exists()
    state.unlink()
    assert lifecycle.on_success(state, locks)
    assert not (locks / lock.LOCK_NAME).exists()


def test_error_tears_the_stacks_down_then_releases_the_box(held_box):
    locks, state = held_box
    state.write_text(json.dumps({"run": "hooks", "host": "box", "stacks": {}, "order": []}))
    assert lifecycle.on_error(state, locks, grace_s=1)
    assert not state.exists(), "stack-down ran on the state file"
    assert not (locks / lock.LOCK_NAME).exists()


def test_error_without_stacks_up_releases_the_box(held_box):
    locks, state = held_box
    assert lifecycle.on_error(state, locks, grace_s=1)
    assert not (locks / lock.LOCK_NAME).exists()


def test_error_stops_what_the_workflow_left_running_once_the_stacks_are_down(held_box):
    """A job's own snakemake whose shell a stop signal ended is still winding up when `onerror`
    runs: the workflow does not end before it."""
    locks, state = held_box
    env = {**os.environ, lock.SESSION_ENV: str(os.getpid())}  # this process stands for snakemake
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert lifecycle.on_error(state, locks, grace_s=5)
        assert job.poll() == -signal.SIGTERM
    finally:
        job.kill()
        job.wait()


# The job of the stand-in below: reports the signal it gets.
JOB = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda n, f: (print("job got", n, flush=True), sys.exit(0)))
print("ready", flush=True)
time.sleep(60)
"""
# A stand-in for snakemake: starts the job in its own process group, installs the hook
# (argv[1] == "hooked") and waits for the job; the test signals the stand-in alone.
STAND_IN = """
import subprocess, sys
from luksbench.orchestrate import lifecycle
job = subprocess.Popen([sys.executable, "-c", sys.argv[2]])
if sys.argv[1] == "hooked":
    lifecycle.on_start()
print("started", flush=True)
job.wait(timeout=60)
"""


@pytest.mark.parametrize("hook", ["hooked", "bare"])
def test_a_stop_signal_to_snakemake_alone_reaches_its_jobs(hook):
    proc = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, hook, JOB],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert {proc.stdout.readline().strip() for _ in range(2)} == {"ready", "started"}
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(0.5)  # a forwarded signal has reached the job by now
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a job the signal did not reach
    with proc.stdout:
        assert ("job got 15" in proc.stdout.read()) is (hook == "hooked")


@pytest.mark.parametrize(
    ("settings", "argv", "dry"),
    [
        (SimpleNamespace(dryrun=True), ["snakemake", "all"], True),
        (SimpleNamespace(dryrun=False), ["snakemake", "-n", "all"], False),  # the setting decides
        (SimpleNamespace(), ["snakemake", "-n", "all"], True),  # a Snakemake without the setting
        (SimpleNamespace(), ["snakemake", "all"], False),
    ],
)
def test_dry_run_comes_from_snakemakes_settings_where_it_has_them(settings, argv, dry):
    assert lifecycle.is_dry_run(settings, argv) is dry


def test_only_a_main_invocation_that_runs_the_workflow_recovers():
    runs = SimpleNamespace(dryrun=False)
    assert not lifecycle.only_looks(runs, ["snakemake", "--cores", "1", "all"])
    assert lifecycle.only_looks(runs, ["snakemake", "--lint"])
    assert lifecycle.only_looks(runs, ["snakemake", "--report", "r.html"])
    assert lifecycle.only_looks(SimpleNamespace(dryrun=True), ["snakemake", "all"])
    assert lifecycle.only_looks(runs, ["snakemake", "all"], main_process=False)


def test_a_stale_snakemake_lock_goes_only_when_no_snakemake_runs_here(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    stale = locks / "0.input.lock"
    stale.write_text("x")
    running = subprocess.Popen(["bash", "-c", "exec -a snakemake sleep 60"], cwd=tmp_path)
    try:
        time.sleep(0.3)  # the exec has happened
        assert not lifecycle.clear_stale_snakemake_lock(str(tmp_path))
        assert stale.exists(), "a running snakemake's lock is kept"
    finally:
        running.kill()
        running.wait()
    assert lifecycle.clear_stale_snakemake_lock(str(tmp_path))
    assert not stale.exists()


def test_recovery_drops_the_description_of_stacks_that_are_down(tmp_path):
    state = tmp_path / "state.json"
    (tmp_path / "stacks.json").write_text("{}")
    lifecycle.recover_interrupted_run(state, tmp_path / "locks")
    assert not (tmp_path / "stacks.json").exists()


def run_snakemake(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO_DIR / "src")}
    command = [str(BIN / "snakemake"), "--cores", "1", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_the_workflow_recovers_only_when_it_runs(tmp_path):
    """Through snakemake: a dry run prints the plan and leaves a stale directory lock; an
    invocation that runs (here only the plan's rule) removes it first and prints no plan."""
    work = copy_workflow(tmp_path / "work")
    stale = work / ".snakemake" / "locks" / "0.input.lock"
    stale.parent.mkdir(parents=True)
    stale.write_text("x")
    target = ("--config", "host=pytest", "--", "data/scratch/default/pytest/plan.json")
    dry = run_snakemake("-n", *target, cwd=work)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "luksbench plan:" in dry.stderr and stale.exists()
    ran = run_snakemake(*target, cwd=work)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "luksbench plan:" not in ran.stderr and not stale.exists()
    assert "removed the directory lock" in ran.stderr
