"""The sequential design through the CLI at scale without a budget (seeded; the stopping rule
applied round by round, in process: ~40 s): coverage at the stopping time and wrong decisions
at the region boundaries, and where the cells stop."""

from __future__ import annotations

import math

import numpy as np
import pytest
from simulate import BOUNDARIES, covers, sequential_run, wrong_decision

from luksbench.analysis.boundary import look_levels


def test_sequential_coverage_and_decisions_at_the_stopping_time(tmp_path):
    """600 cells, sd(d) log-uniform from 0.005 to 0.1, true losses on a region boundary (a sixth)
    or within 3 points of one: coverage at the stopping time and wrong decisions."""
    rng = np.random.default_rng(18)
    cells = 600
    sd_d = np.exp(rng.uniform(math.log(0.005), math.log(0.1), cells))
    true_loss = rng.choice(BOUNDARIES, cells) + rng.uniform(-3, 3, cells) * (
        rng.random(cells) > 1 / 6
    )
    loss, doc, rounds = sequential_run(tmp_path, rng, sd_d, true_loss)
    assert (loss["interval"] == "sequential").all()
    assert doc["boundary"] == "pocock"  # the default
    assert doc["look_confidence"] == pytest.approx(look_levels("pocock", 0.95, 3, 12)[12])
    n = loss["n"].to_numpy()
    assert n.min() == 3 and n.max() == 12 and len(set(n)) >= 6  # cells stop at different looks
    assert rounds == 10 and len(doc["looks"]) == 10
    hit = covers(loss, true_loss)
    wrong = wrong_decision(loss["decision"], true_loss)
    decided = ~loss["decision"].str.startswith("undecided").to_numpy()
    print(f"coverage {hit.mean():.3f}, wrong {wrong.mean():.3f}, decided {decided.mean():.3f}")
    assert hit.mean() >= 0.94, hit.mean()
    assert wrong.mean() <= 0.05, wrong.mean()
    assert decided.mean() > 0.3  # the quiet cells and those away from the boundary settle
    # a decided cell stopped at its first decided look, an undecided one at the cap
    why = {w: c["why"] for w, c in doc["cells"].items()}
    stopped = loss.assign(why=loss["workload"].map(why))
    assert stopped.loc[decided, "why"].str.startswith("stop: decided").all()
    assert (stopped.loc[~decided, "n"] == 12).all()


def test_budget_stops_the_rounds(tmp_path):
    """A budget of 12 pairs beyond the first round (12 device-seconds each): the rounds stop
    there, the cells left undecided say so, the spent device time is recorded."""
    rng = np.random.default_rng(5)
    cells = 10
    sd_d, true_loss = np.full(cells, 0.05), np.full(cells, 5.0)  # on a boundary: never decided
    budget_h = (cells * 3 + 12) * 12 / 3600
    _, doc, _ = sequential_run(tmp_path, rng, sd_d, true_loss, "--budget-h", budget_h, cap=6)
    pairs = sum(c["n"] for c in doc["cells"].values())
    assert pairs == cells * 3 + 12 and doc["spent_s"] == pytest.approx(pairs * 12)
    assert doc["done"] and {c["why"] for c in doc["cells"].values()} == {"stop: budget spent"}
