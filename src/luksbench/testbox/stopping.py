"""Stopping a measurement: SIGINT and SIGTERM raised as an exception in the runner (a repeated
signal ignored, so the teardown runs to its end), and fio stopped with its forked jobs. Standard
library only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


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
