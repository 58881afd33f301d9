"""Intervals that cover sessions: a simulated multi-session run with a session effect on the log
ratio, in the raw layout with its manifest recording each result's session, through
``luksbench loss``. The two-level interval keeps 95 %; the interval over pooled repetitions does
not. Seeded; README ("How sure: the statistics") quotes these figures."""

from __future__ import annotations

import json

import numpy as np
from simulate import SIM_HOST, sim_workload, simulate_logs, write_raw_reps
from test_certainty import covers, loss_csv

SESSIONS, PAIRS = 4, 3  # per session


def multi_session_run(raw, rng, workloads, jobs, sd_session, planned):
    """(loss rows, true loss): every cell measured in SESSIONS sessions of PAIRS pairs, each
    session shifting the cell's log ratio by its own N(0, sd_session) (a fresh LUKS format,
    fresh preconditioning: the variant runs a little better or worse in every stack-up)."""
    cells = workloads * jobs
    true_loss = rng.uniform(-10, 60, cells)
    sigma = rng.uniform(0.002, 0.01, cells)
    n = SESSIONS * PAIRS
    lb, lv = simulate_logs(rng, cells, n, sigma, np.log1p(-true_loss / 100), order_drift=0)
    effect = rng.normal(0, sd_session, (cells, SESSIONS))
    lv = lv + np.repeat(effect, PAIRS, axis=1)
    write_raw_reps(raw, {"plain": lb + 18, "luks": lv + 18}, [range(1, n + 1)] * workloads, jobs)
    runs = [
        {"rep": k, "stack": stack, "workload": sim_workload(w), "session": f"s{(k - 1) // PAIRS}"}
        | {"path": f"fio/{stack}/{sim_workload(w)}/rep{k}.json", "status": "ok"}
        for stack in ("plain", "luks")
        for w in range(workloads)
        for k in range(1, n + 1)
    ]
    manifest = {"run": "sim", "host": SIM_HOST, "sessions": planned, "runs": runs}
    (raw / SIM_HOST / "fio" / "manifest.json").write_text(json.dumps(manifest))
    return loss_csv(raw, "--metric", "bw_bytes"), true_loss


def test_two_level_interval_covers_sessions_where_pooled_repetitions_do_not(tmp_path):
    rng = np.random.default_rng(4242)
    two_level, truth = multi_session_run(tmp_path / "k4", rng, 200, 10, 0.02, SESSIONS)
    assert (two_level["interval"] == "sessions").all() and (two_level["covers"] == "sessions").all()
    assert (two_level["sessions"] == SESSIONS).all() and (two_level["n"] == SESSIONS * PAIRS).all()
    coverage = covers(two_level, truth).mean()
    assert 0.94 <= coverage <= 0.96, coverage
    # the variance components: the session SD is recovered on average, the within one is the
    # pair noise (each arm's sd 0.002-0.01: sd of d about 0.009)
    assert 0.017 < two_level["sd_between_sessions"].mean() < 0.023
    assert 0.005 < two_level["sd_within_session"].mean() < 0.011

    # the same design analysed as if it were one session: pairs pooled over stack-ups, an
    # interval of repetitions that misses the session-to-session variation
    pooled, truth = multi_session_run(tmp_path / "k1", rng, 200, 10, 0.02, 1)
    assert (pooled["interval"] == "t").all()
    assert (pooled["covers"] == "repetitions within sessions").all()
    assert covers(pooled, truth).mean() < 0.8


def test_without_a_session_effect_the_two_level_interval_still_holds(tmp_path):
    rng = np.random.default_rng(99)
    rows, truth = multi_session_run(tmp_path / "calm", rng, 100, 20, 0.0, SESSIONS)
    coverage = covers(rows, truth).mean()
    assert 0.94 <= coverage <= 0.96, coverage
