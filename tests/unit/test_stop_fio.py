"""Stopping fio: a fio that does not stop on SIGINT in time is killed with its job processes (fio
forks one per job; a job left running would write the output after the cleanup)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from luksbench.testbox import stopping


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a killed orphan stays a zombie until something reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_fio_deaf_to_sigint_is_killed_with_its_job_processes(monkeypatch):
    monkeypatch.setattr(stopping, "STOP_GRACE_S", 0.5)
    # a stand-in with fio's shape: a leader that ignores SIGINT and a forked job process
    proc = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; sleep 300 & echo $!; wait'],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    job = int(proc.stdout.readline())
    try:
        stopping.stop_fio(proc)
        assert proc.poll() is not None
        deadline = time.monotonic() + 5
        while _running(job) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(job), "a job process of the stopped fio runs on"
    finally:
        if _running(job):
            os.kill(job, signal.SIGKILL)
        proc.stdout.close()
        proc.wait()
