"""Empirical-Bayes moderated variances (Smyth 2004, limma's ``squeezeVar``), for intervals that
rest on few replicates (sessions).

With k = 2 or 3 sessions a cell's own variance has 1 or 2 degrees of freedom and its t-interval is
very wide. The cells of one host and metric share a box, so their variances are alike: each cell's
sample variance s^2 (d degrees of freedom) is taken as a draw of s0^2 chi^2_d0 / d0 scaled, the
prior (d0, s0^2) estimated from all the cells by the method of moments on log variances
(digamma/trigamma), and each cell's interval rests on the posterior variance
``(d0 s0^2 + d s^2) / (d0 + d)`` with ``d0 + d`` degrees of freedom. d0 = inf: the cells' variances
differ no more than sampling explains, every cell takes s0^2 (a normal quantile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

#: intervals over at most this many replicates (sessions) are moderated: from 4 on a cell's own
#: t-interval is exact whatever the other cells do and already narrow enough, while moderation
#: under-covers slightly where cells' variances differ more than the prior allows
MODERATE_UP_TO = 3
#: fewest cells with a finite positive variance from which a prior is estimated (fewer: none)
MIN_CELLS = 5


@dataclass(frozen=True)
class Prior:
    """Prior degrees of freedom ``df`` (may be inf) and prior variance ``var``."""

    df: float
    var: float


def trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x (x > 0): Newton's method as limma's ``trigammaInverse``."""
    if x > 1e7:
        return 1 / math.sqrt(x)
    if x < 1e-6:
        return 1 / x
    y = 0.5 + 1 / x
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1 - tri / x) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def fit_prior(variances, dfs) -> Prior | None:
    """The prior (d0, s0^2) of sample variances ``variances`` with ``dfs`` degrees of freedom
    (arrays, one per cell) by Smyth's method of moments on log variances; None from fewer than
    :data:`MIN_CELLS` usable cells (finite, positive variance and df)."""
    s2, d = np.asarray(variances, float), np.asarray(dfs, float)
    ok = np.isfinite(s2) & (s2 > 0) & np.isfinite(d) & (d > 0)
    if ok.sum() < MIN_CELLS:
        return None
    s2, d = s2[ok], d[ok]
    e = np.log(s2) - special.digamma(d / 2) + np.log(d / 2)
    mean = float(e.mean())
    excess = float(e.var(ddof=1) - special.polygamma(1, d / 2).mean())
    if excess <= 0:
        return Prior(math.inf, math.exp(mean))
    d0 = 2 * trigamma_inverse(excess)
    return Prior(d0, math.exp(mean + special.digamma(d0 / 2) - math.log(d0 / 2)))


def posterior(var: float, df: float, prior: Prior | None) -> tuple[float, float]:
    """(variance, degrees of freedom) of one cell moderated by ``prior`` (None: its own)."""
    if prior is None or not (math.isfinite(var) and df > 0):
        return var, df
    if math.isinf(prior.df):
        return prior.var, math.inf
    return (prior.df * prior.var + df * var) / (prior.df + df), prior.df + df


def pooled_variance(a, b) -> tuple[float, float]:
    """(pooled variance, its df) of two samples: the residual variance of the two-group model
    limma moderates (NaN with fewer than 3 values in all or one on a side)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    df = a.size + b.size - 2
    if a.size < 1 or b.size < 1 or df < 1:
        return math.nan, 0.0
    ss = float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
    return ss / df, float(df)


def two_sample_t(a, b, prior: Prior | None) -> tuple[float, float, float]:
    """(mean(b) - mean(a), its standard error, df) on the pooled variance moderated by
    ``prior``: limma's moderated t of a two-group comparison."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    var, df = posterior(*pooled_variance(a, b), prior)
    se = math.sqrt(var * (1 / a.size + 1 / b.size)) if math.isfinite(var) else math.nan
    return float(b.mean() - a.mean()), se, df
