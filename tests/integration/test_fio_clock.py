"""fio's clock source: probed once per run-fio session and passed to every fio run, so each run
skips fio's own start-up check of the TSC but uses the clock fio would have picked."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from testkit.testbox import loop_plan

from luksbench.testbox.planbuild import check_plan, workloads
from luksbench.testbox.runner import _CLOCKSOURCES, _one_run, fio_clocksource

pytestmark = pytest.mark.device


def fio_clock_number(*options: str) -> str:
    """The clock source number fio's --debug=time start-up line reports with ``options``."""
    probe = ["fio", "--debug=time", "--parse-only", "--name=x", "--filename=/dev/null"]
    proc = subprocess.run(
        [*probe, "--size=1m", *options],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    return re.findall(r"gettime: clocksource=(\d+)", proc.stdout + proc.stderr)[-1]


def test_the_probe_names_a_clock_fio_picks_here_and_passing_it_keeps_that_clock():
    # fio's own pick can change from one start-up to the next (its cross-CPU TSC test), so the
    # probe's answer must be among the clocks fio picks over up to 20 start-ups.
    chosen = fio_clocksource()
    assert chosen in _CLOCKSOURCES.values()
    picks = set()
    for _ in range(20):
        picks.add(_CLOCKSOURCES[fio_clock_number()])
        if chosen in picks:
            break
    assert chosen in picks, (chosen, picks)
    assert _CLOCKSOURCES[fio_clock_number(f"--clocksource={chosen}")] == chosen


def test_a_run_records_the_clock_it_was_given(tmp_path):
    plan = loop_plan("clock", tmp_path / "scratch")
    check_plan(plan)
    target = tmp_path / "target.img"
    with open(target, "wb") as f:
        f.truncate(16 * 2**20)
    rep = tmp_path / "raw" / "rep1.json"
    chosen = fio_clocksource()
    w = workloads(plan)[0]
    ok, msg = _one_run(plan, {"device": str(target)}, "plain", w, rep, 16 * 2**20, chosen)
    assert ok, msg
    job = json.loads(rep.read_text())["jobs"][0]
    assert job["job options"]["clocksource"] == chosen
    assert job["read"]["iops"] > 0
