"""Stopping a measurement: SIGINT and SIGTERM raised as an exception in the runner (a repeated
signal ignored, so the teardown runs to its end); fio and the cluster's tools started so that a
stop signal never leaves one running unknown, and fio stopped with its forked jobs; helper
threads that never take a stop signal. Standard library only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived while running the matrix."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def raise_on_stop_signals(interrupt) -> dict:
    """Make SIGINT and SIGTERM raise ``interrupt(signum)``; returns the old handlers. A repeated
    signal (the workflow forwards them) is ignored: it must not cut the teardown short."""

    def on_signal(signum, _frame):
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise interrupt(signum)

    return {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}


STOP_GRACE_S = 10


def stop_fio(proc: subprocess.Popen) -> None:
    """SIGINT to fio (it stops its jobs), then SIGKILL to its process group (its own session):
    a killed fio's forked job processes would run on and write its output."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if sig == signal.SIGKILL:  # fio not reaped yet: its pid still names its group
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_GRACE_S)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group of ``proc`` (a session of its own), then reap it and close
    its pipes (what it wrote is not wanted)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    close_pipes(proc)


def close_pipes(proc: subprocess.Popen) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _held_off() -> set[signal.Signals]:
    """Block SIGINT and SIGTERM in this thread; the mask before. A signal that arrives just
    before the block raises from this call with the mask unchanged."""
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    except BaseException:  # the handler raised as the block took effect: undo it
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        raise
    return unblocked


def start_in_own_session(
    argv: list[str], stop: Callable[[subprocess.Popen], None] = stop_fio, **popen_kw
) -> subprocess.Popen:
    """Start ``argv`` in a session of its own (a terminal's Ctrl-C reaches only us, and we stop
    it), with SIGINT and SIGTERM held off while Popen runs: a handler raising inside Popen, after
    the fork but before the handle is returned, would leave the child running unknown (for fio:
    writing its output after the cleanup). A stop signal that came meanwhile is let in once the
    child is known: it is stopped (``stop``) before the signal's exception goes on. The child
    starts with the signals let in again."""
    unblocked = _held_off()
    try:
        proc = subprocess.Popen(
            argv,
            start_new_session=True,
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, unblocked),
            **popen_kw,
        )
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)  # a pending handler raises here
    except BaseException:
        stop(proc)
        close_pipes(proc)
        raise
    return proc


def run_fio_or_stop(argv: list[str]) -> subprocess.CompletedProcess:
    """Run fio to its end (started as :func:`start_in_own_session` starts it); when anything (a
    stop signal) cuts the wait short, fio is stopped with its job processes first."""
    proc = start_in_own_session(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate()
    except BaseException:
        stop_fio(proc)
        close_pipes(proc)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def background_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A started daemon thread that never takes SIGINT or SIGTERM. Python runs a handler in the
    main thread whichever thread the kernel gave the signal to, even while the main thread holds
    stop signals off to start fio (:func:`start_in_own_session`): had a helper thread taken one,
    the handler would raise inside Popen, after fio was forked but before its handle was
    returned, and that fio would run on unstopped. The new thread inherits the blocked mask it
    is started under."""
    held = _held_off()
    try:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return thread
