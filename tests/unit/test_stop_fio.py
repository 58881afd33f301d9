"""Stopping fio: a fio that does not stop on SIGINT in time is killed with its job processes (fio
forks one per job; a job left running would write the output after the cleanup)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from luksbench.testbox import lock, stopping


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


# A process with a helper thread holds stop signals off in its main thread (as the runner does to
# start fio), is sent SIGTERM and runs Python code: where does the handler raise?
HOLD_OFF = """
import os, signal, sys, threading, time
from luksbench.testbox import stopping
stopping.raise_on_stop_signals(stopping.Interrupted)
if sys.argv[1] == "background_thread":
    stopping.background_thread(lambda: time.sleep(30), "helper")
else:
    threading.Thread(target=lambda: time.sleep(30), daemon=True).start()
held = signal.pthread_sigmask(signal.SIG_BLOCK, stopping.STOP_SIGNALS)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 1  # ample time for a thread to take it, under load too
    while time.monotonic() < deadline:
        time.sleep(0.01)  # the Python a Popen runs after its fork, waiting for exec
except stopping.Interrupted:
    sys.exit("raised while held off")
try:
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
except stopping.Interrupted:
    print("raised once released")
"""


def test_a_helper_thread_never_takes_the_stop_signal_the_main_thread_holds_off():
    """A plain thread takes it, and Python raises in the main thread as soon as that runs Python
    again (inside Popen, fio would be orphaned); a background_thread leaves it pending until the
    main thread lets it in."""
    runs = {
        kind: subprocess.run(
            [sys.executable, "-c", HOLD_OFF, kind], capture_output=True, text=True, timeout=60
        )
        for kind in ("background_thread", "plain")
    }
    assert runs["background_thread"].stdout.strip() == "raised once released"
    assert runs["background_thread"].returncode == 0, runs["background_thread"].stderr
    assert "raised while held off" in runs["plain"].stderr


# A test-box step's helper threads: the session watch and stack-up's heartbeat.
HELPERS = """
import signal, threading
from luksbench.testbox import orphans, sysutil

def blocks_stop_signals(thread):
    with open(f"/proc/self/task/{thread.native_id}/status") as status:
        line = next(line for line in status if line.startswith("SigBlk:"))
    mask = int(line.split()[1], 16)
    return all(mask >> (signum - 1) & 1 for signum in (signal.SIGINT, signal.SIGTERM))

watch = orphans.watch_session(60)
with sysutil.heartbeat("waiting", 60, say=print):
    beat = next(t for t in threading.enumerate() if t.name == "luksbench-heartbeat")
    print(blocks_stop_signals(watch), blocks_stop_signals(beat), blocks_stop_signals(threading.main_thread()))
"""


def test_the_session_watch_and_the_heartbeat_never_take_a_stop_signal():
    """Both helper threads of a test-box step block SIGINT and SIGTERM (the kernel's SigBlk of
    the thread); the main thread, which stops the step, does not."""
    env = {**os.environ, lock.SESSION_ENV: str(os.getpid())}  # a step of this process's session
    out = subprocess.run(
        [sys.executable, "-c", HELPERS], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["True", "True", "False"], out.stderr
