"""Stopping fio: a fio that does not stop on SIGINT in time is killed with its job processes (fio
forks one per job; a job left running would write the output after the cleanup)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from luksbench.testbox import runner


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_fio_deaf_to_sigint_is_killed_with_its_job_processes(monkeypatch):
    monkeypatch.setattr(runner, "STOP_GRACE_S", 0.5)
    # a stand-in with fio's shape: a leader that ignores SIGINT and a forked job process
    proc = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; sleep 300 & echo started; wait'],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "started"
        runner._stop(proc)
        assert proc.poll() is not None
        deadline = time.monotonic() + 5
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _group_alive(proc.pid), "a job process of the stopped fio runs on"
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
        proc.wait()
