"""Drift of d across pairs: the pooled AR(1) fit, the variance inflation, and the loss table's
intervals widened by it (never narrowed), seeded."""

from __future__ import annotations

import math

import numpy as np
import pytest
from simulate import drifting_logs, fio_frame, simulate_logs

from luksbench.analysis import drift, stats


def ar1(rng, cells, n, rho):
    lb, lv = drifting_logs(rng, cells, n, np.exp(rng.uniform(-5, -2, cells)), np.zeros(cells), rho)
    return lv - lb


@pytest.mark.parametrize(("rho", "n"), [(0.5, 3), (0.5, 12), (0.8, 6), (0.3, 12)])
def test_the_pooled_fit_finds_the_drift_despite_short_centred_series(rho, n):
    """400 cells of n pairs with sd(d) spread over 20x: the fit is near the truth (the centring
    of a 3-pair series alone would put r1 near -1/3) and the drift is detected."""
    fitted, detected = drift.pooled_rho(list(ar1(np.random.default_rng(n), 400, n, rho)))
    assert detected and fitted == pytest.approx(rho, abs=0.12)


def test_independent_pairs_are_rarely_taken_for_drift():
    rng = np.random.default_rng(7)
    found = [drift.pooled_rho(list(ar1(rng, 16, 3, 0.0)))[1] for _ in range(200)]
    found += [drift.pooled_rho(list(ar1(rng, 16, 12, 0.0)))[1] for _ in range(200)]
    assert np.mean(found) <= 0.03  # detection at 1 %; Monte Carlo SE 0.5 points
    assert drift.pooled_rho([np.array([0.1, 0.2])]) == (pytest.approx(math.nan, nan_ok=True), False)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_the_inflation_is_what_drift_does_to_the_t_interval(rho):
    """The variance of the mean over the t-interval's s^2 / n, simulated (seeded)."""
    for n in (3, 6, 12):
        cells = 200_000
        lb, lv = drifting_logs(np.random.default_rng(n), cells, n, np.ones(cells), 0, rho)
        d = lv - lb
        simulated = d.mean(axis=1).var() / (d.var(axis=1, ddof=1).mean() / n)
        assert drift.variance_inflation(rho, n) == pytest.approx(simulated, rel=0.03)
    assert drift.variance_inflation(-0.4, 6) == 1.0 == drift.variance_inflation(math.nan, 6)


def test_the_loss_table_widens_t_intervals_by_the_drift_and_says_so():
    """Cells with AR(1) drift rho 0.6 get a wider t-interval (the widening in drift_widening_pct,
    the p-value on the wider scale); independent pairs keep the plain interval."""
    rng = np.random.default_rng(11)
    cells, n = 60, 8
    lb, lv = drifting_logs(rng, cells, n, np.full(cells, 0.03), np.log(np.full(cells, 0.9)), 0.6)
    fio = fio_frame(lb, lv)
    table = stats.loss_table(fio, metrics=["bw_bytes"])
    d = (lv - lb)[0]
    plain = stats.paired_log_ratio_ci(d)
    row = table.iloc[0]
    assert row["interval"] == "t" and row["drift_rho"] == pytest.approx(0.6, abs=0.2)
    f = drift.variance_inflation(row["drift_rho"], n)
    assert row["drift_inflation"] == pytest.approx(f) and f > 2
    assert row["drift_widening_pct"] == pytest.approx(100 * (math.sqrt(f) - 1))
    low, high = np.log1p(-np.array([row["ci_high"], row["ci_low"]]) / 100)
    assert (high - low) / (plain.high - plain.low) == pytest.approx(math.sqrt(f))
    assert table["p_value"].iloc[0] > stats.paired_t_pvalue(d)
    lb, lv = simulate_logs(rng, cells, n, np.full(cells, 0.02), np.log(np.full(cells, 0.9)))
    quiet = stats.loss_table(fio_frame(lb, lv), metrics=["bw_bytes"])
    assert (quiet["drift_inflation"] == 1).all() and (quiet["drift_widening_pct"] == 0).all()
    ci = stats.paired_log_ratio_ci((lv - lb)[0])
    assert quiet["ci_high"].iloc[0] == pytest.approx(100 * -np.expm1(ci.low))
