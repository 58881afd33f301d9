"""Progress on the terminal: the ETA arithmetic, spans as people read them, the heartbeat."""

from __future__ import annotations

import time

import pytest

from luksbench.testbox import sysutil
from luksbench.testbox.sysutil import Progress, duration, eta_seconds, heartbeat


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (42.4, "42s"), (59.6, "1m00s"), (185, "3m05s"), (3599, "59m59s"), (7620, "2h07m")],
)
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_eta_is_remaining_runs_times_runtime_before_anything_ran():
    assert eta_seconds(10, 6.0, 0, 0.0) == 60.0


def test_eta_adds_the_measured_overhead_per_run():
    # 4 runs of 6 s fio took 30 s in all: 1.5 s of start-up each, on every one of the 10 left
    assert eta_seconds(10, 6.0, 4, 30.0) == pytest.approx(10 * 7.5)


def test_eta_never_below_the_nominal_runtime():
    # runs that ended early (a failed fio) do not promise the rest will be quicker than the runtime
    assert eta_seconds(3, 6.0, 2, 1.0) == 18.0


def test_eta_without_a_nominal_length_is_the_measured_mean():
    assert eta_seconds(2, None, 3, 90.0) == 60.0
    assert eta_seconds(2, None, 0, 0.0) is None
    assert eta_seconds(0, 5.0, 7, 70.0) == 0.0


def test_progress_counts_skipped_steps_without_their_time(monkeypatch):
    clock = iter([100.0, 130.0, 131.0])
    monkeypatch.setattr(sysutil.time, "monotonic", lambda: next(clock))
    progress = Progress(4, 10.0)
    # measured: 20 s (10 s nominal + 10 s overhead); 3 left at 20 s each
    assert progress.step(20.0) == "elapsed 30s, ETA 1m00s"
    # a skipped step took no time and does not change the measured mean; 2 left
    assert progress.step(None) == "elapsed 31s, ETA 40s"


def test_progress_without_any_estimate_says_elapsed_only(monkeypatch):
    clock = iter([0.0, 5.0])
    monkeypatch.setattr(sysutil.time, "monotonic", lambda: next(clock))
    assert Progress(3).step(None) == "elapsed 5s"


def test_heartbeat_says_what_runs_while_it_runs():
    lines: list[str] = []
    with heartbeat("sda: filling", 0.02, lines.append):
        time.sleep(0.2)
    count = len(lines)
    time.sleep(0.1)
    assert count >= 2 and len(lines) == count  # it stops with the block
    assert all(line.startswith("  sda: filling: elapsed ") for line in lines)
