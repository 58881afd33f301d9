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
    yield proc, {"pid": proc.pid, "started": lock.started(proc.pid)}
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


# A workflow process (the session): its job and another session's process, then its onerror.
SESSION = """
import os, subprocess, sys, time
from luksbench.testbox import orphans
from luksbench.testbox.sysutil import cmdline
os.environ["LUKSBENCH_SESSION"] = str(os.getpid())
sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
job = subprocess.Popen(sleeper)
other = subprocess.Popen(sleeper, env={**os.environ, "LUKSBENCH_SESSION": "1"})
deadline = time.monotonic() + 10  # both past exec: each environment its own
while time.monotonic() < deadline and not all("time.sleep(60)" in " ".join(cmdline(p.pid)) for p in (job, other)):
    time.sleep(0.05)
stopped = orphans.stop_session_leftovers(grace_s=5)
print(stopped == [job.pid], job.wait(5) == -15, other.poll() is None)
other.kill()
"""


def test_leftovers_of_a_session_are_stopped_but_not_another_sessions():
    """A job's own snakemake that a stop signal left without its shell is stopped by its
    workflow's onerror, each logged with its command line; another session's process is not."""
    out = subprocess.run(
        [sys.executable, "-c", SESSION], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True", "True", "True"], out.stderr
    assert "the workflow left running: " in out.stderr and "time.sleep(60)" in out.stderr


def test_an_inherited_session_is_not_this_processes_to_stop(monkeypatch, session_process):
    """Started under another invocation's session (the marker inherited), a workflow stops none
    of that session's processes."""
    proc, _ = session_process
    job = subprocess.Popen(SLEEPER, env={**os.environ, lock.SESSION_ENV: str(proc.pid)})
    monkeypatch.setenv(lock.SESSION_ENV, str(proc.pid))
    try:
        deadline = time.monotonic() + 5
        while job.pid not in orphans.session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job.pid in orphans.session_processes(proc.pid)
        assert orphans.stop_session_leftovers(grace_s=1) == []
        assert job.poll() is None
    finally:
        job.kill()
        job.wait()


def test_only_processes_started_after_the_session_are_its_own(session_process):
    """A process that began before the session's process did (an earlier holder of a reused pid
    passed its marker on) is not among the session's processes."""
    proc, _ = session_process
    job = subprocess.Popen(SLEEPER, env={**os.environ, lock.SESSION_ENV: str(proc.pid)})
    try:
        deadline = time.monotonic() + 5
        while job.pid not in orphans.session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        began = int(lock.started(job.pid))
        assert job.pid in orphans.session_processes(proc.pid, started_after=began)
        assert job.pid not in orphans.session_processes(proc.pid, started_after=began + 1)
    finally:
        job.kill()
        job.wait()


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
