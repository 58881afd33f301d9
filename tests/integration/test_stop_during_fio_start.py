"""A stop signal that arrives while fio is being started: the runner still knows its fio, stops
it and keeps no partial output (an orphaned fio would write its temp file after the cleanup).
One that arrives while a fio run it waits for (a pilot) is going stops fio with its jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from testkit.testbox import loop_plan

from luksbench.testbox import runner, stopping
from luksbench.testbox.planbuild import check_plan, workloads
from luksbench.testbox.sysutil import find_our_processes

pytestmark = pytest.mark.device


def test_a_signal_during_fio_start_stops_that_fio_and_leaves_no_temp_file(tmp_path, monkeypatch):
    plan = loop_plan("startsignal", tmp_path / "scratch")
    plan["fio"]["runtime_s"] = 2
    check_plan(plan)
    target = tmp_path / "target.img"
    with open(target, "wb") as f:
        f.truncate(16 * 2**20)
    rep = tmp_path / "raw" / "rep1.json"
    real_popen = subprocess.Popen

    def popen_then_signal(argv, *args, **kwargs):
        proc = real_popen(argv, *args, **kwargs)
        if os.path.basename(argv[0]) == "fio":
            os.kill(os.getpid(), signal.SIGTERM)  # the stop arrives before Popen has returned
        return proc

    monkeypatch.setattr(runner.subprocess, "Popen", popen_then_signal)
    old = stopping.raise_on_stop_signals(stopping.Interrupted)
    try:
        with pytest.raises(stopping.Interrupted):
            runner._one_run(plan, {"device": str(target)}, "plain", workloads(plan)[0], rep, 2**24)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    orphans = find_our_processes([str(rep.parent)], names=("fio",))
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    time.sleep(3)  # an orphaned fio would write its output by now
    assert orphans == []
    assert list(rep.parent.iterdir()) == []


# A runner's fio (two jobs, time-based) cut short by SIGTERM: a pilot of a fixed-rate cell.
INTERRUPTED_FIO = """
import os, signal, sys, threading
from luksbench.testbox import stopping
stopping.raise_on_stop_signals(stopping.Interrupted)
name, target = sys.argv[1], sys.argv[2]
threading.Timer(2, os.kill, (os.getpid(), signal.SIGTERM)).start()
argv = ["fio", f"--name={name}", f"--filename={target}", "--size=1m", "--rw=randread",
        "--ioengine=psync", "--numjobs=2", "--time_based", "--runtime=60"]
try:
    stopping.run_fio_or_stop(argv)
except stopping.Interrupted:
    print("interrupted")
"""


def test_a_fio_run_cut_short_is_stopped_with_its_job_processes(tmp_path):
    name = f"luksbench-stop-{os.getpid()}"
    out = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_FIO, name, str(tmp_path / "target")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "interrupted", out.stderr
    left = subprocess.run(["pgrep", "-af", name], capture_output=True, text=True)
    assert left.stdout == "", f"fio processes run on: {left.stdout}"
