"""The sequential design with sessions, seeded, through the CLI: simulated raw runs written round
by round (rounds cycling three sessions), ``luksbench next`` deciding after whole cycles,
``luksbench loss`` at the end; truth = the ratio put in."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from simulate import BOUNDARIES, covers, sequential_sessions_run, wrong_decision
from testkit.testbox import loop_plan

from luksbench.analysis.sequential import cycle_looks, session_look_levels


def test_looks_after_whole_cycles_at_bonferroni_levels():
    assert cycle_looks(3, 12, 3) == [3, 6, 9, 12]
    assert cycle_looks(4, 11, 3) == [6, 9]
    levels = session_look_levels(0.95, 4, 11, 3)
    assert set(levels) == set(range(4, 12)) and set(levels.values()) == {1 - 0.05 / 2}
    with pytest.raises(ValueError, match=r"no whole cycle of 3 sessions.*max_pairs to >= 6"):
        cycle_looks(4, 5, 3)


@pytest.mark.slow
@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_drift_across_rounds_with_sessions_through_the_cli(tmp_path, rho):
    """300 cells, sessions k = 3 (each shifting d by N(0, sd(d) / 2)), d drifting as AR(1)
    (coefficient rho) across the rounds, sd(d) log-uniform 0.005-0.1, true losses on a region
    boundary or within 3 points of one, through `luksbench next` round by round and `luksbench
    loss`: looks only after whole cycles (3, 6, 9, 12 pairs), coverage >= 93 % and wrong
    decisions <= 5 % at the stopping time."""
    rng = np.random.default_rng(2028)
    cells = 300
    sd_d = np.exp(rng.uniform(math.log(0.005), math.log(0.1), cells))
    near = rng.uniform(-3, 3, cells) * (rng.random(cells) > 0.5)
    true_loss = rng.choice(BOUNDARIES, cells) + near
    loss, doc, rounds = sequential_sessions_run(tmp_path, rng, sd_d, true_loss, rho)
    assert (loss["interval"] == "sequential").all() and (loss["covers"] == "sessions").all()
    assert set(loss["n"]) <= {3, 6, 9, 12} and (loss["sessions"] == 3).all()
    assert doc["boundary"] == "bonferroni" and doc["sessions"] == 3
    hit, wrong = covers(loss, true_loss), wrong_decision(loss["decision"], true_loss)
    why = pd.Series({w: c["why"] for w, c in doc["cells"].items()})
    decided = why.str.startswith("stop: decided").mean()
    widened = (loss["drift_inflation"] > 1).mean()
    print(
        f"rho {rho}, k 3: coverage {hit.mean():.3f}, wrong {wrong.mean():.3f}, decided "
        f"{decided:.3f}, pairs mean {loss['n'].mean():.2f}, drift-widened pairs {widened:.3f}, "
        f"rounds {rounds}"
    )
    assert hit.mean() >= 0.93 and wrong.mean() <= 0.05, (hit.mean(), wrong.mean())
    assert decided > 0.05


def test_the_workflows_rounds_refuse_sessions_until_they_cycle_them(tmp_path):
    import json

    from luksbench.orchestrate.sequential import check_rounds_sessions

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(loop_plan("r", tmp_path, sessions=1)))
    check_rounds_sessions(plan)
    plan.write_text(json.dumps(loop_plan("r", tmp_path, sessions=3)))
    with pytest.raises(RuntimeError, match=r"sessions 3 with adaptive.mode sequential"):
        check_rounds_sessions(plan)
