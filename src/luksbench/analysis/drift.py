"""Drift the pairing does not cancel: serial correlation of d across a cell's pairs, priced.

A pair cancels what its two runs share, not what changes the *ratio* from one pair to the next
(a cache, a thermal state, a background job that favours one arm for a while). Then d_1, ..., d_n
of a cell (in the order they were measured) are correlated, and the t-interval is too narrow
twice over: the mean's variance is sigma^2 V / n with V = 1 + 2 sum_k (1 - k/n) rho_k, and the
sample variance underestimates sigma^2 (E s^2 = sigma^2 (n - V) / (n - 1)).

:func:`pooled_rho` fits one AR(1) coefficient to the lag-1 and lag-2 autocorrelations of every
cell's d, pooled over a run's cells (each cell centred on its own mean; the bias that centring
puts in a short series is taken into account: the expectation of each cell's ratios comes from a
seeded simulation of AR(1) series of its length), clipped to [0, :data:`MAX_RHO`]. The check:
the pooled lag-1 autocorrelation is compared with what independent pairs give; only drift
detected at :data:`DETECT_ALPHA` is priced. :func:`variance_inflation` is the factor on the
interval's variance, V (n - 1) / (n - V): an interval widens by its square root, never narrows.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as sps

#: the largest AR(1) coefficient fitted (beyond it a few pairs say almost nothing)
MAX_RHO = 0.9
#: the grid of AR(1) coefficients fitted
RHO_GRID = np.round(np.arange(0.0, MAX_RHO + 1e-9, 0.01), 2)
#: drift is priced when the pooled lag-1 autocorrelation exceeds independent pairs' at this level
DETECT_ALPHA = 0.01
#: series per length in the simulation of the ratios' expectation (fixed seed: deterministic)
_SERIES, _SEED = 4000, 20261128
#: a cell's series is used from this many pairs on (two centred values always have r1 = -1/2)
MIN_PAIRS = 3


def lag_ratios(d: np.ndarray) -> tuple[float, float]:
    """(r1, r2): lag-1 and lag-2 sums of products of the centred series over its sum of squares
    (NaN with fewer than :data:`MIN_PAIRS` values or no spread)."""
    e = np.asarray(d, float) - np.mean(d) if len(d) else np.asarray(d, float)
    s0 = float(e @ e)
    if e.size < MIN_PAIRS or s0 <= 0:
        return math.nan, math.nan
    return float(e[1:] @ e[:-1]) / s0, float(e[2:] @ e[:-2]) / s0


@functools.lru_cache(maxsize=256)
def expected_ratios(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For stationary AR(1) series of length ``n`` at every :data:`RHO_GRID` coefficient: the
    mean of r1, of r2 (rows: coefficients), and the variance of r1 of independent values."""
    rng = np.random.default_rng([_SEED, n])
    z = rng.standard_normal((n, _SERIES))
    rho = RHO_GRID[:, None]
    x = np.empty((n, RHO_GRID.size, _SERIES))
    x[0] = z[0]
    for t in range(1, n):
        x[t] = rho * x[t - 1] + np.sqrt(1 - rho**2) * z[t]
    e = x - x.mean(axis=0)
    s0 = (e**2).sum(axis=0)
    r1 = (e[1:] * e[:-1]).sum(axis=0) / s0
    r2 = (e[2:] * e[:-2]).sum(axis=0) / s0
    return r1.mean(axis=1), r2.mean(axis=1), float(r1[0].var())


def pooled_rho(series) -> tuple[float, bool]:
    """(AR(1) coefficient of d fitted to the lag-1 and lag-2 ratios pooled over ``series`` (each
    cell's d in time order; weights n - 1), whether drift is detected). NaN, False without a
    series of :data:`MIN_PAIRS` values."""
    rows = [(len(d), *lag_ratios(d)) for d in series]
    rows = [r for r in rows if math.isfinite(r[1])]
    if not rows:
        return math.nan, False
    n = np.array([r[0] for r in rows])
    w = (n - 1) / (n - 1).sum()
    observed = np.array([[r[1], r[2]] for r in rows]).T @ w
    expected = np.zeros((2, RHO_GRID.size))
    null_var = 0.0
    for size, weight in zip(*np.unique(n, return_counts=True), strict=True):
        e1, e2, v1 = expected_ratios(int(size))
        share = w[n == size].sum()
        expected += share * np.vstack([e1, e2])
        null_var += weight * ((size - 1) / (n - 1).sum()) ** 2 * v1
    rho = float(RHO_GRID[np.argmin(((expected - observed[:, None]) ** 2).sum(axis=0))])
    z = (observed[0] - expected[0, 0]) / math.sqrt(null_var) if null_var > 0 else 0.0
    return rho, bool(z > sps.norm.isf(DETECT_ALPHA))


def cycled_lag1(rho: np.ndarray, k: int) -> np.ndarray:
    """Lag-1 autocorrelation of the lag-``k`` differences d_t - d_{t-k} of an AR(1) series with
    coefficient ``rho`` (k >= 2): (2 rho - rho^(k-1) - rho^(k+1)) / (2 (1 - rho^k))."""
    rho = np.asarray(rho, float)
    return (2 * rho - rho ** (k - 1) - rho ** (k + 1)) / (2 * (1 - rho**k))


def pooled_rho_cycled(series, k: int) -> tuple[float, bool]:
    """:func:`pooled_rho` for rounds that cycle ``k`` >= 2 sessions (pair t in session t mod k):
    each session's own shift of d would read as negative autocorrelation, so the fit rests on
    the lag-k differences (same session, the shift gone): their pooled lag-1 ratio (mean 0
    known, no centring) matched to :func:`cycled_lag1`. Without drift the differences are
    uncorrelated at lag 1 (the ratio of the mean product to the mean square); the products correlate 1/4 at lag k, so the ratio's null variance is
    1.5 / (products pooled). NaN, False without a series longer than k + 1."""
    num = den = 0.0
    products = terms = 0
    for d in series:
        diff = np.asarray(d, float)[k:] - np.asarray(d, float)[:-k] if len(d) > k + 1 else None
        if diff is None:
            continue
        num += float(diff[1:] @ diff[:-1])
        den += float(diff @ diff)
        products, terms = products + diff.size - 1, terms + diff.size
    if products == 0 or den <= 0:
        return math.nan, False
    observed = (num / products) / (den / terms)  # per product over per square: no length bias
    rho = float(RHO_GRID[np.argmin(np.abs(cycled_lag1(RHO_GRID, k) - observed))])
    return rho, bool(observed / math.sqrt(1.5 / products) > sps.norm.isf(DETECT_ALPHA))


def variance_inflation(rho: float, n: int) -> float:
    """Factor on the t-interval's variance s^2 / n that makes it the mean's under AR(1) drift
    ``rho`` with ``n`` pairs: V (n - 1) / (n - V), V = 1 + 2 sum_{k<n} (1 - k/n) rho^k; 1 for
    rho <= 0 or NaN (never narrows) or n < 2."""
    if not (math.isfinite(rho) and rho > 0) or n < 2:
        return 1.0
    k = np.arange(1, n)
    v = 1 + 2 * float(((1 - k / n) * rho**k).sum())
    return max(1.0, v * (n - 1) / (n - v))


def cell_inflation(rho: float, detected: bool, n: int) -> float:
    """The variance factor a cell's interval gets: :func:`variance_inflation` where drift was
    detected, else 1."""
    return variance_inflation(rho, n) if detected else 1.0


def pooled_by(series: dict, group) -> dict:
    """{group(key): :func:`pooled_rho` of the series of its keys} for ``series`` {key: d in time
    order} (e.g. a loss table's cells, grouped by host and metric)."""
    members: dict = {}
    for key, d in series.items():
        members.setdefault(group(key), []).append(d)
    return {g: pooled_rho(ds) for g, ds in members.items()}
