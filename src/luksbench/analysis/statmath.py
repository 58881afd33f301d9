"""The statistics math of the loss tables: intervals, tests and decisions on arrays of log ratios.

Pure functions of numpy arrays and numbers (numpy and scipy only, no tables): paired and Welch
t-intervals on mean log ratios, Stein's two-stage rule, the Fieller and bootstrap cross-checks,
outlier flags, the equivalence check, Benjamini-Hochberg and Bonferroni, the decision by
magnitude and the session components of a two-level design. :mod:`luksbench.analysis.stats`
assembles the loss table from them.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

#: bootstrap intervals only from this many pairs on (fewer: the bootstrap distribution is too coarse)
BOOTSTRAP_MIN_PAIRS = 20
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 20231124
#: modified z-score (Iglewicz & Hoaglin) above which a pair's log ratio is flagged
OUTLIER_Z = 3.5
#: ... computed only from this many pairs on: with fewer the MAD is too ill-determined (with 3
#: normal pairs 29 % of cells would get a flag; with 6-20 pairs still 10-15 %, see flag_outliers)
OUTLIER_MIN_PAIRS = 6


def usable_pairs(baseline: np.ndarray, variant: np.ndarray) -> np.ndarray:
    """Mask of pairs with both sides present and > 0 (a log ratio exists)."""
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    with np.errstate(invalid="ignore"):
        return np.isfinite(b) & np.isfinite(v) & (b > 0) & (v > 0)


@dataclass(frozen=True)
class LogRatioCI:
    n: int
    mean: float
    sd: float
    low: float
    high: float


@functools.lru_cache(maxsize=1024)
def _t_quantile(confidence: float, df: int) -> float:
    return float(sps.t.ppf(0.5 + confidence / 2, df=df))


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")


def _scale(d: np.ndarray, pilot: tuple[float, int] | None) -> tuple[float, int]:
    """(SD, degrees of freedom) the interval of ``d`` rests on: the pilot's (s0, n0 - 1) for
    Stein's interval, else the sample's own (sd, n - 1)."""
    if pilot is not None:
        return float(pilot[0]), pilot[1] - 1
    return (float(d.std(ddof=1)) if d.size > 1 else math.nan), d.size - 1


def paired_log_ratio_ci(
    d: np.ndarray, confidence: float = 0.95, pilot: tuple[float, int] | None = None
) -> LogRatioCI:
    """Paired t-interval on the mean of log ratios ``d``; bounds NaN for n < 2. ``pilot=(s0,
    n0)``: Stein's interval, ``mean(d) +- t_{n0-1} s0 / sqrt(n)`` with s0 the SD of the n0 pilot
    pairs that chose n: exact coverage whatever n the pilot chose (the final SD would not be)."""
    _check_confidence(confidence)
    d = np.asarray(d, float)
    n = int(d.size)
    mean = float(d.mean()) if n else math.nan
    if n < 2:
        return LogRatioCI(n, mean, math.nan, math.nan, math.nan)
    sd, df = _scale(d, pilot)
    half = _t_quantile(confidence, df) * sd / math.sqrt(n)
    return LogRatioCI(n, mean, sd, mean - half, mean + half)


def _t_pvalue(mean: float, se: float, df: float) -> float:
    """Two-sided p-value of ``t = mean / se``; 0 or 1 when the standard error is 0."""
    if se == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * sps.t.sf(abs(mean / se), df=df))


def paired_t_pvalue(d: np.ndarray, pilot: tuple[float, int] | None = None) -> float:
    """Two-sided p-value of the paired t-test ``mean(d) = 0`` (as ``scipy.stats.ttest_1samp``;
    with ``pilot``, Stein's test, see :func:`paired_log_ratio_ci`); NaN for n < 2."""
    d = np.asarray(d, float)
    if d.size < 2:
        return math.nan
    sd, df = _scale(d, pilot)
    return _t_pvalue(float(d.mean()), sd / math.sqrt(d.size), df)


@dataclass(frozen=True)
class WelchLogCI:
    n_a: int
    n_b: int
    mean: float
    se: float
    df: float
    low: float
    high: float


def welch_log_ratio_ci(
    log_a: np.ndarray, log_b: np.ndarray, confidence: float = 0.95
) -> WelchLogCI:
    """Welch t-interval on ``mean(log_b) - mean(log_a)`` of two independent samples (unequal
    variances, Welch-Satterthwaite df): the unpaired :func:`paired_log_ratio_ci`. Bounds NaN
    unless both samples have two values; both SDs 0: the point (df = n_a + n_b - 2)."""
    _check_confidence(confidence)
    a, b = np.asarray(log_a, float), np.asarray(log_b, float)
    na, nb = int(a.size), int(b.size)
    mean = float(b.mean() - a.mean()) if na and nb else math.nan
    if na < 2 or nb < 2:
        return WelchLogCI(na, nb, mean, math.nan, math.nan, math.nan, math.nan)
    va, vb = float(a.var(ddof=1)) / na, float(b.var(ddof=1)) / nb
    se = math.sqrt(va + vb)
    if se == 0:
        return WelchLogCI(na, nb, mean, 0.0, float(na + nb - 2), mean, mean)
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    half = _t_quantile(confidence, df) * se
    return WelchLogCI(na, nb, mean, se, df, mean - half, mean + half)


def welch_t_pvalue(log_a: np.ndarray, log_b: np.ndarray) -> float:
    """Two-sided p-value of Welch's t-test ``mean(log_a) = mean(log_b)`` (as
    ``scipy.stats.ttest_ind(equal_var=False)``); NaN unless both samples have two values."""
    ci = welch_log_ratio_ci(log_a, log_b)
    return math.nan if math.isnan(ci.se) else _t_pvalue(ci.mean, ci.se, ci.df)


def fieller_ratio_ci(
    baseline: np.ndarray, variant: np.ndarray, confidence: float = 0.95
) -> tuple[float, float]:
    """Paired Fieller interval for the ratio of means ``theta = mean(variant) / mean(baseline)``.

    The theta for which the paired t-test of ``variant_i - theta * baseline_i`` does not reject:
    ``(v - theta b)^2 <= t^2 (s_vv - 2 theta s_bv + theta^2 s_bb) / n``, bounded exactly when
    ``b^2 > t^2 s_bb / n`` (else both bounds NaN, as for n < 2). Both arms are positive, so is
    their ratio: a bound below 0 is clipped to 0 (NaN if both are)."""
    _check_confidence(confidence)
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    n = b.size
    if n < 2:
        return math.nan, math.nan
    bm, vm = float(b.mean()), float(v.mean())
    cov = np.cov(np.vstack([b, v]), ddof=1)
    s_bb, s_bv, s_vv = float(cov[0, 0]), float(cov[0, 1]), float(cov[1, 1])
    q = _t_quantile(confidence, n - 1) ** 2 / n
    a = bm * bm - q * s_bb
    if a <= 0:
        return math.nan, math.nan
    half_b = bm * vm - q * s_bv  # the quadratic is a theta^2 - 2 half_b theta + c <= 0
    c = vm * vm - q * s_vv
    root = math.sqrt(max(half_b * half_b - a * c, 0.0))  # >= 0 up to rounding: vm/bm is inside
    low, high = (half_b - root) / a, (half_b + root) / a
    return (max(low, 0.0), high) if high > 0 else (math.nan, math.nan)


def bootstrap_log_ratio_ci(d: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Seeded BCa bootstrap interval for mean d over whole pairs, from :data:`BOOTSTRAP_MIN_PAIRS`
    pairs on (NaN below); the percentile method where BCa is undefined (e.g. all d equal)."""
    _check_confidence(confidence)
    d = np.asarray(d, float)
    if d.size < BOOTSTRAP_MIN_PAIRS:
        return math.nan, math.nan
    for method in ("BCa", "percentile"):
        options = {"n_resamples": BOOTSTRAP_RESAMPLES, "method": method}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sps.DegenerateDataWarning)
            rng = np.random.default_rng(BOOTSTRAP_SEED)
            res = sps.bootstrap((d,), np.mean, confidence_level=confidence, **options, rng=rng)
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi
    return math.nan, math.nan


def modified_z(d: np.ndarray) -> np.ndarray:
    """Iglewicz-Hoaglin modified z-score ``0.6745 (d - median) / MAD``; with MAD = 0 the mean absolute
    deviation stands in (``(d - median) / (1.253314 mean|d - median|)``); all 0 when both are 0."""
    d = np.asarray(d, float)
    if d.size == 0:
        return d
    dev = d - np.median(d)
    mad = float(np.median(np.abs(dev)))
    if mad > 0:
        return 0.6745 * dev / mad
    meanad = float(np.mean(np.abs(dev)))
    return dev / (1.253314 * meanad) if meanad > 0 else np.zeros_like(d)


def flag_outliers(
    d: np.ndarray, fio_error: np.ndarray | None = None, ss_not_attained: np.ndarray | None = None
) -> np.ndarray:
    """Pairs to flag: |modified z of d| > :data:`OUTLIER_Z` within the cell (cells with at least
    :data:`OUTLIER_MIN_PAIRS` pairs), or a fio error / an unattained steady state on either arm.
    Flags only: normal pairs get a flag in 10-15 % of cells, so the loss table keeps them."""
    d = np.asarray(d, float)
    flags = np.zeros(d.shape, dtype=bool)
    if d.size >= OUTLIER_MIN_PAIRS:
        flags = np.abs(modified_z(d)) > OUTLIER_Z
    for extra in (fio_error, ss_not_attained):
        if extra is not None:
            flags |= np.asarray(extra, dtype=bool)
    return flags


def effect_from_log_ratio(
    mean: float, low: float, high: float, better_high: bool
) -> tuple[float, float, float]:
    """(effect_pct, ci_low, ci_high): loss for higher-is-better metrics, increase otherwise."""
    if better_high:
        return 100 * (1 - math.exp(mean)), 100 * (1 - math.exp(high)), 100 * (1 - math.exp(low))
    return 100 * (math.exp(mean) - 1), 100 * (math.exp(low) - 1), 100 * (math.exp(high) - 1)


def effect_bounds_from_ratio(low: float, high: float, better_high: bool) -> tuple[float, float]:
    """Bounds on a ratio (variant / baseline) as (low, high) effect %, swapped for losses."""
    if better_high:
        return 100 * (1 - high), 100 * (1 - low)
    return 100 * (low - 1), 100 * (high - 1)


def tost_confidence(confidence: float) -> float:
    """Confidence of the interval the equivalence check (TOST at alpha = 1 - confidence) uses."""
    return 1 - 2 * (1 - confidence)


def effect_with_equivalence(ci, eq, better_high: bool, margin_pct: float) -> tuple[float, dict]:
    """(effect %, {ci_low, ci_high, equiv_low, equiv_high, equivalent}) of an interval ``ci`` on
    a mean log ratio and ``eq``, its :func:`tost_confidence` interval (None: no check)."""
    effect = lo = hi = eq_lo = eq_hi = math.nan
    if not math.isnan(ci.mean):
        effect, lo, hi = effect_from_log_ratio(ci.mean, ci.low, ci.high, better_high)
    if eq is not None and not math.isnan(eq.low):
        _, eq_lo, eq_hi = effect_from_log_ratio(eq.mean, eq.low, eq.high, better_high)
    equivalent = bool(-margin_pct < eq_lo and eq_hi < margin_pct)
    bounds = {"ci_low": lo, "ci_high": hi, "equiv_low": eq_lo, "equiv_high": eq_hi}
    return effect, {**bounds, "equivalent": equivalent}


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """BH-adjusted q-values (scipy's ``false_discovery_control``) of the finite p-values; NaN stays
    NaN and is not counted in the family."""
    p = np.asarray(p, float)
    q = np.full_like(p, math.nan)
    ok = np.isfinite(p)
    if ok.any():
        q[ok] = sps.false_discovery_control(p[ok], method="bh")
    return q


def decision(low: float, high: float, lower: float, upper: float) -> str:
    """The region (below) the whole interval [low, high] (effect %, positive = the variant is
    worse) lies in; else ``undecided: straddles`` the boundaries inside it; ``insufficient``
    without an interval."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "insufficient"
    regions = (
        ("negligible", -lower, lower),
        ("moderate", lower, upper),
        ("material", upper, math.inf),
        ("moderate gain", -upper, -lower),
        ("material gain", -math.inf, -upper),
    )
    for name, a, b in regions:
        if a <= low and high <= b:
            return name
    inside = [x for x in (-upper, -lower, lower, upper) if low < x < high]
    return "undecided: straddles " + ", ".join(f"{x:g} %" for x in inside)


def bonferroni(half, scale, df, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(half-width, level) of t-intervals ``mean +- half`` (``half`` = t quantile x ``scale``,
    ``df`` degrees of freedom) at the Bonferroni level of a family of ``m``: each interval's own
    error split by m, so that all m hold together with the confidence each had alone."""
    half, scale = np.asarray(half, float), np.asarray(scale, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = 2 * sps.t.sf(half / scale, df) / max(m, 1)
        wide = np.where(scale > 0, sps.t.isf(alpha / 2, df) * scale, half)
    return wide, 1 - alpha


def table_verdicts(
    n: np.ndarray, q: np.ndarray, equivalent: np.ndarray, confidence: float
) -> np.ndarray:
    """Verdict per row: insufficient (n < 2) > significant (q <= 1 - confidence) > equivalent >
    inconclusive."""
    alpha = 1 - confidence
    n, q, eq = np.asarray(n), np.asarray(q, float), np.asarray(equivalent, bool)
    out = np.full(n.shape, "inconclusive", dtype=object)
    out[eq] = "equivalent"
    with np.errstate(invalid="ignore"):
        out[np.isfinite(q) & (q <= alpha)] = "significant"
    out[n < 2] = "insufficient"
    return out


def half_width_log(half_width_pct: float) -> float:
    """Target half-width on the log scale for ``half_width_pct`` points: ``ln(1 + h/100)``
    (0.01980 for 2). At zero effect mean +- h maps to [-1.96, +2.00] points on the increase scale
    and [-2.00, +1.96] on the loss scale: neither side exceeds the target (``-ln(1 - h/100)``
    would let one side reach 2.04)."""
    if not half_width_pct > 0:
        raise ValueError(f"half-width must be > 0 percentage points, not {half_width_pct}")
    return math.log1p(half_width_pct / 100)


def stein_pairs(
    sd_pilot,
    pilot_pairs: int = 4,
    half_width_pct: float = 2.0,
    max_pairs: int = 12,
    confidence: float = 0.95,
):
    """Stein's two-stage rule: pairs needed so that the interval on mean d has half-width <= h.

    ``N = max(n0, ceil((t_{1-alpha/2, n0-1} s / h)^2))``, s the pilot SD of d (NaN: the cap), h =
    :func:`half_width_log`, capped at ``max_pairs``. Vectorised over ``sd_pilot``. Returns (pairs
    to run, the uncapped real-valued requirement, whether the cap was hit: the cell is *noisy*)."""
    _check_confidence(confidence)
    if pilot_pairs < 2:
        raise ValueError("a pilot needs at least 2 pairs (an SD)")
    if max_pairs < pilot_pairs:
        raise ValueError(f"max_pairs ({max_pairs}) < pilot_pairs ({pilot_pairs})")
    s = np.asarray(sd_pilot, float)
    t = _t_quantile(confidence, pilot_pairs - 1)
    required = np.where(np.isfinite(s), (t * s / half_width_log(half_width_pct)) ** 2, np.inf)
    needed = np.maximum(pilot_pairs, np.ceil(np.minimum(required, 1e9) - 1e-9))
    capped = needed > max_pairs
    pairs = np.minimum(needed, max_pairs).astype(int)
    if pairs.ndim == 0:
        return int(pairs), float(required), bool(capped)
    return pairs, required, capped


def session_components(d: np.ndarray, sessions: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Session means of ``d``, and the within- and between-session SDs of d: one-way random
    effects by the method of moments (ANOVA; unequal pairs per session through the usual n0),
    the between part clipped at 0; NaN where not estimable."""
    labels, inv = np.unique(np.asarray(sessions, dtype=str), return_inverse=True)
    n_j = np.bincount(inv, minlength=labels.size)
    means = np.bincount(inv, weights=d, minlength=labels.size) / np.maximum(n_j, 1)
    n, m = d.size, labels.size
    ms_within = ((d - means[inv]) ** 2).sum() / (n - m) if n > m else math.nan
    if m < 2:
        return means, math.sqrt(ms_within), math.nan
    if not math.isfinite(ms_within):  # one pair per session: the parts cannot be told apart
        return means, math.nan, math.nan
    ms_between = (n_j * (means - d.mean()) ** 2).sum() / (m - 1)
    n0 = (n - (n_j**2).sum() / n) / (m - 1)
    return means, math.sqrt(ms_within), math.sqrt(max(0.0, (ms_between - ms_within) / n0))
