"""Test-box steps stop with their workflow; stacks whose workflow died are found for recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from luksbench.testbox import lock, orphans

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def session_process():
    """A process standing for a workflow (snakemake): its session, and the process."""
    proc = subprocess.Popen(SLEEPER)
    yield proc, {"pid": proc.pid, "started": lock._started(proc.pid)}
    proc.kill()
    proc.wait()


def watched_step(session_pid: int) -> subprocess.Popen:
    """A test-box step of the session ``session_pid`` that watches it."""
    code = (
        "import time; from luksbench.testbox.orphans import watch_session\n"
        "assert watch_session(0.05) is not None\nprint('watching', flush=True)\ntime.sleep(60)\n"
    )
    env = {**os.environ, lock.SESSION_ENV: str(session_pid)}
    step = subprocess.Popen(
        [sys.executable, "-c", code, "testbox"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert step.stdout.readline().strip() == "watching"
    return step


def test_a_step_stops_when_its_workflow_is_killed(session_process):
    proc, _ = session_process
    step = watched_step(proc.pid)
    try:
        time.sleep(0.3)
        assert step.poll() is None, "stopped while its workflow lives"
        proc.kill()
        proc.wait()
        assert step.wait(timeout=10) == -signal.SIGTERM
    finally:
        step.kill()
        step.wait()
        step.stdout.close()


def test_a_step_run_by_hand_is_not_watched(monkeypatch):
    monkeypatch.delenv(lock.SESSION_ENV, raising=False)
    assert orphans.watch_session() is None


def test_stop_session_steps_stops_only_that_sessions_steps(session_process):
    proc, _ = session_process
    env = {**os.environ, lock.SESSION_ENV: str(proc.pid)}
    step = subprocess.Popen([*SLEEPER, "testbox"], env=env)
    other = subprocess.Popen([*SLEEPER, "testbox"], env={**env, lock.SESSION_ENV: "1"})
    try:
        deadline = time.monotonic() + 5
        while step.pid not in orphans.session_steps(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphans.stop_session_steps(proc.pid, grace_s=5) == [step.pid]
        assert step.wait(timeout=5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for p in (step, other):
            p.kill()
            p.wait()


def test_stacks_of_a_dead_workflow_are_abandoned_those_of_a_live_one_are_not(
    tmp_path, session_process
):
    proc, session = session_process
    lock_dir, state = tmp_path / "lock", tmp_path / "scratch" / "state.json"
    plan = {"run": "r", "host": "h", "scratch_dir": str(state.parent)}
    assert orphans.abandoned(state, lock_dir) is None, "no stacks up"
    state.parent.mkdir()
    state.write_text("{}")
    assert orphans.abandoned(state, lock_dir) == {}, "stacks up, nobody holds the box"
    lock.acquire(plan, state, lock_dir, session=session)
    assert orphans.abandoned(state, lock_dir) is None, "its workflow is alive"
    proc.kill()
    proc.wait()
    assert orphans.abandoned(state, lock_dir)["session"] == session
    other = tmp_path / "other" / "state.json"
    other.parent.mkdir()
    other.write_text("{}")
    assert orphans.abandoned(other, lock_dir) is None, "another run holds the box"


def test_leftovers_of_a_session_are_stopped_but_not_what_it_runs_under(session_process):
    """A job's own snakemake that a stop signal left without its shell is stopped; the
    processes of another session and those this one runs under are not."""
    proc, _ = session_process
    env = {**os.environ, lock.SESSION_ENV: str(proc.pid)}
    job = subprocess.Popen(SLEEPER, env=env)
    other = subprocess.Popen(SLEEPER, env={**env, lock.SESSION_ENV: "1"})
    try:
        deadline = time.monotonic() + 5
        while job.pid not in orphans.session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphans.session_steps(proc.pid) == [], "no test-box step among them"
        assert orphans.stop_session_leftovers(proc.pid, grace_s=5) == [job.pid]
        assert job.wait(timeout=5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for p in (job, other):
            p.kill()
            p.wait()


def test_a_session_spares_the_processes_it_runs_under():
    """Run inside a job of its own workflow (the session's marker in its own environment), the
    leftovers it would stop exclude itself and its parents."""
    code = (
        "import os; from luksbench.testbox import orphans\n"
        "print(orphans.session_processes(int(os.environ['LUKSBENCH_SESSION'])))\n"
    )
    shell = ["sh", "-c", '"$0" -c "$1"; true', sys.executable, code]  # a shell that waits
    env = {**os.environ, lock.SESSION_ENV: str(os.getpid())}
    out = subprocess.run(shell, env=env, capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "[]"
