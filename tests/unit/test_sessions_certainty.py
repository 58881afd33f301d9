"""Intervals that cover sessions: a simulated multi-session run with a session effect on the log
ratio, in the raw layout with its manifest recording each result's session, through
``luksbench loss``. The two-level interval keeps 95 %; the interval over pooled repetitions does
not. Seeded; docs/statistics.md quotes these figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from simulate import covers, loss_csv, luksbench, write_session_run, write_sessions_only_run

SESSIONS, PAIRS = 4, 3  # per session


def multi_session_run(raw, rng, workloads, jobs, sd_session, planned):
    """(loss rows, true loss): every cell measured in SESSIONS sessions of PAIRS pairs, each
    session shifting the cell's log ratio by its own N(0, sd_session) (a fresh LUKS format,
    fresh preconditioning: the variant runs a little better or worse in every stack-up)."""
    true_loss, _ = write_session_run(
        raw, rng, workloads, jobs, sd_session, SESSIONS, PAIRS, planned
    )
    return loss_csv(raw, "--metric", "bw_bytes"), true_loss


@pytest.mark.slow
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
    # interval of repetitions that misses the session-to-session variation, unless the drift
    # check sees it: pairs of one stack-up share its shift, a serial correlation of d that the
    # loss stage finds (pooled over the cells) and widens the intervals for
    pooled, truth = multi_session_run(tmp_path / "k1", rng, 200, 10, 0.02, 1)
    assert (pooled["interval"] == "t").all()
    assert (pooled["covers"] == "repetitions within sessions").all()
    assert (pooled["drift_inflation"] > 1).all()
    factor = np.sqrt(pooled["drift_inflation"].to_numpy(float))
    mean = pooled["mean_log_ratio"].to_numpy(float)
    half = np.log1p(-pooled["ci_low"].to_numpy(float) / 100) - mean  # a loss: low loss, high ratio
    unwidened = pooled.assign(
        ci_low=-np.expm1(mean + half / factor) * 100, ci_high=-np.expm1(mean - half / factor) * 100
    )
    assert covers(unwidened, truth).mean() < 0.8
    assert covers(pooled, truth).mean() >= 0.93


@pytest.mark.slow
def test_without_a_session_effect_the_two_level_interval_still_holds(tmp_path):
    rng = np.random.default_rng(99)
    rows, truth = multi_session_run(tmp_path / "calm", rng, 100, 20, 0.0, SESSIONS)
    coverage = covers(rows, truth).mean()
    assert 0.94 <= coverage <= 0.96, coverage


@pytest.mark.slow
def test_compare_takes_sessions_as_replicates(tmp_path):
    """Two runs of an unchanged system whose sessions differ by 2 % (sd): `luksbench compare`
    calls a cell changed at about the nominal rate; repetitions as replicates would not."""
    rng = np.random.default_rng(31)
    workloads, jobs, sessions, reps = 50, 10, 3, 3
    # no change at all; each session its own level on both stacks, each repetition its own noise
    logs_a = write_sessions_only_run(
        tmp_path / "a", rng, workloads, 0.02, sessions, reps, jobs=jobs
    )
    logs_b = write_sessions_only_run(
        tmp_path / "b", rng, workloads, 0.02, sessions, reps, jobs=jobs
    )
    out = tmp_path / "cmp"
    luksbench("compare", tmp_path / "a", tmp_path / "b", "--metric", "bw_bytes", "--out", out)
    table = pd.read_csv(out / "compare.csv")
    assert len(table) == 2 * workloads * jobs and set(table["design"]) == {"sessions"}
    assert (table["n_a"] == sessions).all()
    false_change = (table["p_value"] < 0.05).mean()
    assert 0.03 <= false_change <= 0.07, false_change
    assert table["outcome"].isin(["better", "worse"]).mean() <= 0.01  # after BH
    # Welch over the repetitions of the same data: far above 5 %
    within = sps.ttest_ind(logs_b["luks"], logs_a["luks"], axis=1, equal_var=False).pvalue
    assert (within < 0.05).mean() > 0.3


def test_a_session_with_its_own_level_is_not_an_outlier():
    """Three sessions of 4 pairs, one session's log ratio 0.05 lower: that is session variation,
    which the two-level interval covers; no pair is flagged or excluded for it."""
    from simulate import fio_frame

    from luksbench.analysis import stats

    shift = np.repeat([0.0, 0.0, -0.05], 4)
    wiggle = np.tile([0.001, -0.002, 0.002, -0.001], 3)
    lb = np.full((1, 12), 18.0)
    fio = fio_frame(lb, lb - 0.05 + shift + wiggle)
    fio["session"] = np.tile(np.repeat(["a", "b", "c"], 4), 2)
    fio["sessions_planned"] = 3
    for exclude in (False, True):
        row = stats.loss_table(fio, metrics=["bw_bytes"], exclude_outliers=exclude).iloc[0]
        assert row["n_outliers"] == 0 and row["sessions"] == 3 and row["n"] == 12
        assert row["interval"] == "sessions" and row["sd_between_sessions"] > 0.02
    # one pair per session: within and between cannot be told apart
    means, within, between = stats.session_components(
        np.array([0, 0.1, 0.2]), np.array(list("abc"))
    )
    assert np.isnan(within) and np.isnan(between) and list(means) == [0, 0.1, 0.2]
