"""The plan's sessions advice: k = 2 warned against; from an earlier run's variance components,
the Kalibera-Jones pairs per session and the sessions for the target half-width."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from simulate import write_session_run
from testkit.plans import PLAN_CONFIG

from luksbench.testbox import planview
from luksbench.testbox.planbuild import plan_from_config, workloads

CONFIG = PLAN_CONFIG


def _warnings(plan) -> list[str]:
    return [line for line in planview.describe_plan(plan) if "sessions: 2" in line]


def test_two_sessions_are_warned_against(tmp_path):
    assert _warnings(plan_from_config({**CONFIG, "sessions": 2}, "box", tmp_path))
    for k in (1, 3):
        assert not _warnings(plan_from_config({**CONFIG, "sessions": k}, "box", tmp_path))


def test_kalibera_jones_allocation():
    # a session costs 10 pairs and its variance is a quarter of a pair's: sqrt(10 x 4) pairs
    assert planview.pairs_per_session(600, 60, 1e-4, 4e-4) == pytest.approx(math.sqrt(40))
    assert planview.pairs_per_session(60, 600, 4e-4, 1e-4) == 1.0  # never below one pair
    assert math.isinf(planview.pairs_per_session(600, 60, 0.0, 1e-4))
    # more session variance: more sessions for the same half-width
    calm = planview.sessions_needed(1e-5, 1e-4, 6, 2.0)
    assert planview.sessions_needed(1e-4, 1e-4, 6, 2.0) > calm >= 3
    assert planview._t975(4) == pytest.approx(2.776, abs=0.01)


@pytest.mark.slow
def test_plan_advises_from_an_earlier_runs_loss_table(tmp_path):
    write_session_run(tmp_path / "raw", np.random.default_rng(8), 40, 1, 0.02, 4, 3)
    done = subprocess.run(
        [sys.executable, "-m", "luksbench.cli", "loss", tmp_path / "raw", "--metric", "bw_bytes"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    (tmp_path / "loss.csv").write_text(done.stdout)
    between, within = planview.read_components(tmp_path / "loss.csv")
    assert 0.01 < math.sqrt(between) < 0.03 and 0.003 < math.sqrt(within) < 0.012
    plan = plan_from_config({**CONFIG, "sessions": 2}, "box", tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    command = [sys.executable, "-m", "luksbench.cli", "plan", "--plan", tmp_path / "plan.json"]
    command += ["--components", tmp_path / "loss.csv", "--session-cost-s", "900"]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    advice = [line for line in out.stdout.splitlines() if "Kalibera-Jones" in line]
    cost_pair = 2 * len(workloads(plan)) * 3
    n = math.sqrt(900 / cost_pair * within / between)
    assert len(advice) == 1 and f"= {n:.1f} -> {round(n)} pairs per session" in advice[0]
    assert "WARNING: sessions: 2" in out.stdout
    bad = subprocess.run(
        [*command[:6], "--components", tmp_path / "plan.json"], capture_output=True
    )
    assert bad.returncode != 0 and b"plan.json" in bad.stderr


def test_the_sessions_advice_aims_at_the_adaptive_designs_target_half_width(tmp_path):
    adaptive = {"enabled": True, "mode": "two-stage", "pilot_pairs": 3, "max_pairs": 12}
    plan = plan_from_config({**CONFIG, "adaptive": adaptive}, "box", tmp_path)
    components = (0.02**2, 0.01**2)

    def advice(target_pct: float) -> str:
        plan["adaptive"]["target_half_width_pct"] = target_pct
        return planview.sessions_advice(plan, components)[-1]

    assert "for +-5 %" in advice(5.0) and "for +-1 %" in advice(1.0)
