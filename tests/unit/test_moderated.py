"""Moderated intervals for few sessions (empirical Bayes, Smyth 2004): the prior is recovered
from simulated variances; through ``luksbench loss`` and ``luksbench compare`` on seeded simulated
raw runs, k = 2 sessions give intervals several times narrower with coverage kept, and compare at
k = 3 finds a 3 % change it missed without a false change. README quotes these figures."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import special
from scipy import stats as sps
from simulate import write_session_run, write_sessions_only_run

from luksbench.analysis import moderated, stats


def luksbench(*args) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "luksbench.cli", *map(str, args)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_prior_is_recovered_from_the_cells_variances():
    rng = np.random.default_rng(5)
    d0, s0, d = 8.0, 0.01, 2
    true_var = d0 * s0 / rng.chisquare(d0, 4000)  # scaled inverse chi-square prior
    sample = true_var * rng.chisquare(d, 4000) / d
    prior = moderated.fit_prior(sample, np.full(4000, d))
    assert prior.df == pytest.approx(d0, rel=0.25) and prior.var == pytest.approx(s0, rel=0.1)
    # variances that differ only by sampling: a large prior df, the common variance
    common = moderated.fit_prior(s0 * rng.chisquare(d, 4000) / d, np.full(4000, d))
    assert common.df > 20 and common.var == pytest.approx(s0, rel=0.1)
    # less spread than sampling gives: an infinite prior df
    same = moderated.fit_prior(np.full(10, s0), np.full(10, d))
    assert math.isinf(same.df)
    assert moderated.posterior(0.04, 2, same) == (same.var, math.inf)
    var, df = moderated.posterior(0.04, 2, prior)
    assert df == prior.df + 2 and var == pytest.approx((prior.df * prior.var + 0.08) / df)
    # too few cells: no prior; zero variances are not used
    assert moderated.fit_prior([0.1, 0.2, 0.3, 0.4, 0.0], [2] * 5) is None
    for x in (1e-3, 0.5, 3.0, 50.0):
        assert float(special.polygamma(1, moderated.trigamma_inverse(x))) == pytest.approx(x)


def _loss(raw) -> pd.DataFrame:
    table = pd.read_csv(io.StringIO(luksbench("loss", raw, "--metric", "bw_bytes")))
    return table.sort_values(["iodepth", "job_slot"]).reset_index(drop=True)


def _own_half_width(d: np.ndarray, sessions: int) -> np.ndarray:
    """Half-width (points) of each cell's unmoderated t-interval over its session means."""
    means = d.reshape(d.shape[0], sessions, -1).mean(axis=2)
    half = sps.t.ppf(0.975, sessions - 1) * means.std(axis=1, ddof=1) / math.sqrt(sessions)
    return 100 * np.expm1(half)


@pytest.mark.slow
def test_two_sessions_moderated_are_narrow_and_still_cover(tmp_path):
    rng = np.random.default_rng(2028)
    truth, d = write_session_run(tmp_path / "k2", rng, 100, 10, 0.02, 2, 3)
    rows = _loss(tmp_path / "k2")
    assert rows["moderated"].all() and (rows["sessions"] == 2).all()
    assert (rows["prior_df"] > 0).all() and (rows["interval_df"] > 1).all()
    coverage = ((rows["ci_low"] <= truth) & (truth <= rows["ci_high"])).mean()
    half = ((rows["ci_high"] - rows["ci_low"]) / 2).median()
    own = np.median(_own_half_width(d, 2))
    assert 0.935 <= coverage <= 0.965, coverage
    assert half < own / 3, (half, own)
    print(f"k=2: coverage {coverage:.3f}, median half-width {half:.2f} (own t {own:.2f}) points")
    # four sessions: each cell's own t-interval, exact without a prior
    truth, _ = write_session_run(tmp_path / "k4", rng, 30, 10, 0.02, 4, 3)
    rows = _loss(tmp_path / "k4")
    assert not rows["moderated"].any() and rows["prior_df"].isna().all()
    assert (rows["interval_df"] == 3).all()


def _compare(tmp_path, rng, sessions, shift, cells=200):
    a = write_sessions_only_run(tmp_path / "a", rng, cells, 0.01, sessions, 3)
    b = write_sessions_only_run(tmp_path / "b", rng, cells, 0.01, sessions, 3, shift)
    luksbench("compare", tmp_path / "a", tmp_path / "b", "--metric", "bw_bytes", "--out", tmp_path)
    table = pd.read_csv(tmp_path / "compare.csv")
    assert (table["design"] == "sessions").all() and table["moderated"].all()
    # the same rows by Welch over session means, BH over the comparison: the unmoderated test
    welch = []
    for stack in ("plain", "luks"):
        la, lb = (x[stack].reshape(cells, sessions, -1).mean(axis=2) for x in (a, b))
        welch += list(sps.ttest_ind(lb, la, axis=1, equal_var=False).pvalue)
    unmoderated = (stats.benjamini_hochberg(np.array(welch)) <= 0.05).mean()
    return table["outcome"].isin(["better", "worse"]).mean(), unmoderated


@pytest.mark.slow
def test_compare_at_three_sessions_finds_a_three_percent_change_without_false_ones(tmp_path):
    rng = np.random.default_rng(303)
    (tmp_path / "null").mkdir(), (tmp_path / "shift").mkdir()
    false_change, _ = _compare(tmp_path / "null", rng, 3, 0.0)
    power, power_welch = _compare(tmp_path / "shift", rng, 3, math.log(0.97))
    assert false_change <= 0.01, false_change
    assert power >= 0.8 and power >= power_welch + 0.3, (power, power_welch)
    print(
        f"k=3: false change {false_change:.3f}; power at -3 % {power:.3f} (Welch {power_welch:.3f})"
    )
