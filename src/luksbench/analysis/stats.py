"""Paired loss table: what does the variant stack (luks) cost against the baseline (plain)?

Rep k of every stack forms pair k (same cell, same session, run back to back). Per cell
(:data:`CELL_KEYS`; pairs never cross hosts) and metric, the log ratios of the complete pairs,
``d_k = ln(variant_k / baseline_k)``, get an interval on mean d (which one: :func:`_cell_stats`);
``r = exp(mean d)`` is the geometric-mean ratio (effects multiply). The effect is always how much
worse the variant is, in percent: ``loss_pct = 100 (1 - r)`` for higher-is-better metrics
(bounds swapped), ``increase_pct = 100 (r - 1)`` for the others; ``effect_pct`` repeats the filled
one. Every column, decision and verdict: README, "How sure: the statistics". Comparing two runs
is :mod:`luksbench.analysis.crossrun`.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from luksbench.analysis import drift
from luksbench.analysis import moderated as eb
from luksbench.analysis.cells import CELL_ATTRS, CELL_KEYS, active_rows, with_pattern

_HIGHER_IS_WORSE = ("lat_mean_ns", "clat_mean_ns", "clat_p50_ns", "clat_p99_ns", "clat_p999_ns")
_HIGHER_IS_WORSE += ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib", "cpu_util_pct")
_HIGHER_IS_WORSE += ("busy_cpu_us_per_io",)
#: metric -> higher is better?
METRICS = {"bw_bytes": True, "iops": True, **dict.fromkeys(_HIGHER_IS_WORSE, False)}
#: every metric but the mean latencies (the percentiles describe latency)
DEFAULT_METRICS = tuple(m for m in METRICS if "mean" not in m)
#: metric -> family of its decision regions (config ``analysis.decision_regions``)
METRIC_FAMILIES = {m: "latency" for m in METRICS if "lat" in m}
METRIC_FAMILIES |= {"bw_bytes": "throughput", "iops": "throughput"}
METRIC_FAMILIES |= {m: "cpu" for m in METRICS if "cpu" in m}
#: family -> (lower, upper) margin in % of the effect: negligible within +-lower, moderate between
#: lower and upper, material beyond upper (gains likewise on the other side)
DEFAULT_DECISION_REGIONS = {"throughput": (5.0, 20.0), "latency": (10.0, 50.0), "cpu": (10.0, 50.0)}
#: metric -> the metric whose test it repeats at a fixed block size (``derived_from``)
DERIVED_FROM = {"iops": "bw_bytes", "busy_cpu_us_per_io": "busy_cpu_s_per_gib"}
#: +- percentage points inside which a cell counts as "equivalent" (config analysis.equivalence_margin_pct)
DEFAULT_EQUIVALENCE_MARGIN_PCT = 2.0
#: bootstrap intervals only from this many pairs on (fewer: the bootstrap distribution is too coarse)
BOOTSTRAP_MIN_PAIRS = 20
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 20231124
#: modified z-score (Iglewicz & Hoaglin) above which a pair's log ratio is flagged
OUTLIER_Z = 3.5
#: ... computed only from this many pairs on: with fewer the MAD is too ill-determined (with 3
#: normal pairs 29 % of cells would get a flag; with 6-20 pairs still 10-15 %, see flag_outliers)
OUTLIER_MIN_PAIRS = 6

#: columns naming a row of a loss or comparison table: the cell, the metric and its direction
ROW_COLUMNS = ["workload", "rw", "bs_bytes", "iodepth", "direction", "job", "job_slot"]
ROW_COLUMNS += ["metric", "higher_is_better"]
#: the significance test and equivalence check of a row (loss and comparison tables alike)
TEST_COLUMNS = ["p_value", "q_value", "equivalence_margin_pct", "equiv_low", "equiv_high"]
TEST_COLUMNS += ["equivalent"]
#: loss.parquet's columns, in order (new columns are appended: the others keep their places)
LOSS_COLUMNS = [
    "host",
    *ROW_COLUMNS,
    *("baseline", "variant", "n", "n_dropped", "baseline_mean", "variant_mean"),
    *("mean_log_ratio", "sd_log_ratio", "ratio", "effect", "effect_pct", "loss_pct"),
    *("increase_pct", "ci_low", "ci_high", "confidence", "verdict"),
    *TEST_COLUMNS,
    *("fieller_low", "fieller_high", "boot_low", "boot_high"),
    *("n_outliers", "outlier_reps", "outliers_excluded", "target_pairs", "noisy", "pattern"),
    *("decision", "decision_lower_pct", "decision_upper_pct", "interval", "pilot_pairs"),
    *("pilot_sd_log_ratio", "derived_from", "covers", "sessions", "sd_within_session"),
    *("sd_between_sessions", "drift_rho", "drift_inflation", "drift_widening_pct"),
    *("moderated", "prior_df", "interval_df"),
    *("added", "added_low", "added_high"),
    *("n_fio_error", "n_ss_not_attained", "look_confidence"),
]
#: loss.parquet's text, integer and bool columns (the others are float64)
LOSS_DTYPES = {
    "string": [
        *("host", "workload", "rw", "direction", "job", "pattern", "metric", "baseline"),
        *("variant", "effect", "verdict", "outlier_reps", "decision", "interval", "derived_from"),
        "covers",
    ],
    "int64": (
        *("bs_bytes", "iodepth", "job_slot", "n", "n_dropped", "n_outliers", "sessions"),
        *("n_fio_error", "n_ss_not_attained"),
    ),
    "bool": ("higher_is_better", "equivalent", "outliers_excluded", "noisy", "moderated"),
}

VERDICTS = ("significant", "equivalent", "inconclusive", "insufficient")
#: the note of a row with ``interval`` "none"
NO_PILOT_NOTE = "no interval: fewer than 2 usable pilot pairs of this metric chose N"


def higher_is_better(metric: str) -> bool:
    try:
        return METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}") from None


def measured(fio: pd.DataFrame, metrics) -> list[str]:
    """The ``metrics`` with at least one value in ``fio``."""
    return [m for m in metrics if m in fio and pd.to_numeric(fio[m], errors="coerce").notna().any()]


#: per-rep quality flags carried from the fio table into the pairs (see :func:`flag_outliers`)
REP_FLAGS = ("fio_error", "ss_not_attained")


def _rep_flags(df: pd.DataFrame) -> pd.DataFrame:
    """fio_error: fio's error field is set; ss_not_attained: the job had a steady-state criterion
    (fio ``ss``) and fio reports it was not attained. Absent columns flag nothing."""
    missing = pd.Series(np.nan, index=df.index)
    error = pd.to_numeric(df.get("error", missing), errors="coerce")
    ss = pd.to_numeric(df.get("ss_attained", missing), errors="coerce")
    flags = {"fio_error": error.notna() & (error != 0), "ss_not_attained": ss.notna() & (ss == 0)}
    return pd.DataFrame({f: v.to_numpy(dtype=bool) for f, v in flags.items()}, index=df.index)


def rep_values(fio: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per (stack, rep, cell): jobs with several entries (numjobs without group_reporting)
    are combined — throughput summed, latency and CPU columns IOPS-weighted mean. The quality flags
    :data:`REP_FLAGS` are OR-ed over the entries."""
    df = active_rows(with_pattern(fio))
    if "session" not in df:  # a table ingested before sessions were recorded: one session
        df = df.assign(session="")
    keys = ["stack", "session", "rep", *CELL_KEYS]
    if df.empty:
        return pd.DataFrame(columns=[*keys, *CELL_ATTRS, *metrics, *REP_FLAGS])
    df = pd.concat([df, _rep_flags(df)], axis=1)
    if not df.duplicated(keys).any():  # one entry per rep and cell: nothing to combine
        return df[[*keys, *CELL_ATTRS, *metrics, *REP_FLAGS]].reset_index(drop=True)
    df = df.assign(_w=df["iops"].where(df["iops"] > 0, 1.0).fillna(1.0))

    def combine(g: pd.DataFrame) -> pd.Series:
        out, w = {a: g[a].iloc[0] for a in CELL_ATTRS}, g["_w"]
        for m in metrics:
            v = g[m]
            if METRICS[m]:
                out[m] = v.sum(min_count=len(g))  # any missing entry -> missing
            elif m in ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib", "cpu_util_pct"):
                out[m] = v.iloc[0] if v.nunique(dropna=False) == 1 else np.average(v, weights=w)
            else:
                out[m] = np.average(v, weights=w) if v.notna().all() else math.nan
        for f in REP_FLAGS:
            out[f] = bool(g[f].any())
        return pd.Series(out)

    grouped = df.groupby(keys, sort=True, dropna=False)
    rows = [{**dict(zip(keys, k, strict=True)), **combine(g)} for k, g in grouped]
    return pd.DataFrame(rows)


def pair_values(fio: pd.DataFrame, baseline: str, variant: str, metrics: list[str]) -> pd.DataFrame:
    """Long table: one row per cell x metric x pair (session, rep) with ``baseline_value`` and
    ``variant_value`` (NaN where that side is missing), and the :data:`REP_FLAGS` of either arm."""
    stacks = set(fio["stack"].dropna().unique()) if not fio.empty else set()
    for name in (baseline, variant):
        if name not in stacks:
            raise ValueError(f"stack {name!r} not in the data (stacks: {sorted(stacks)})")
    vals = rep_values(fio[fio["stack"].isin([baseline, variant])], metrics)
    id_vars = ["stack", "session", "rep", *CELL_KEYS, *CELL_ATTRS, *REP_FLAGS]
    long = vals.melt(id_vars=id_vars, value_vars=metrics, var_name="metric", value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce").astype("float64")
    base = long[long["stack"] == baseline].drop(columns="stack")
    var = long[long["stack"] == variant].drop(columns=["stack", *CELL_ATTRS])
    on = [*CELL_KEYS, "metric", "session", "rep"]  # a pair never crosses sessions
    names = {"value_baseline": "baseline_value", "value_variant": "variant_value"}
    paired = base.merge(var, on=on, how="outer", suffixes=("_baseline", "_variant"))
    paired = paired.rename(columns=names)
    for f in REP_FLAGS:
        paired[f] = paired[f"{f}_baseline"].eq(True) | paired[f"{f}_variant"].eq(True)
        paired = paired.drop(columns=[f"{f}_baseline", f"{f}_variant"])
    # cell attributes from whichever side exists
    attrs = vals[[*CELL_KEYS, *CELL_ATTRS]].drop_duplicates(CELL_KEYS)
    paired = paired.drop(columns=CELL_ATTRS).merge(attrs, on=CELL_KEYS, how="left")
    return paired.sort_values([*CELL_KEYS, "metric", "session", "rep"]).reset_index(drop=True)


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


def check_regions(regions: dict | None) -> dict[str, tuple[float, float]]:
    """Decision regions per metric family: :data:`DEFAULT_DECISION_REGIONS` updated with
    ``regions`` (family -> (lower, upper) or {"lower_pct", "upper_pct"}); 0 < lower < upper."""
    out = dict(DEFAULT_DECISION_REGIONS)
    for family, margins in (regions or {}).items():
        if family not in out:
            raise ValueError(
                f"decision_regions: unknown family {family!r}; known: {', '.join(out)}"
            )
        if isinstance(margins, dict):
            margins = (margins["lower_pct"], margins["upper_pct"])
        lower, upper = map(float, margins)
        if not 0 < lower < upper:
            raise ValueError(f"decision_regions.{family}: need 0 < lower < upper, not {margins}")
        out[family] = (lower, upper)
    return out


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


def _cell_stats(
    b: np.ndarray,
    v: np.ndarray,
    reps: np.ndarray,
    sessions: np.ndarray,
    flags: np.ndarray,
    better_high: bool,
    confidence: float,
    margin_pct: float,
    exclude_outliers: bool,
    pilot_pairs: float = math.nan,
    all_or_none: bool = False,
    sessions_planned: int = 1,
    look_confidence: float = math.nan,
    drift_fit: tuple[float, bool] = (math.nan, False),
    shared_baseline: bool | tuple = False,
    prior: eb.Prior | None = None,
) -> dict:
    """One row of the loss table but for the cross-table q-value and verdict.

    ``interval``: "sessions" with ``sessions_planned`` >= 2 and pairs from two sessions or more
    (t over the session means of d, on which every estimate then rests); "stein" with
    ``pilot_pairs`` n0 (an adaptive cell whose N came from a pilot SD: the SD of the usable pairs
    among reps 1..n0), "none" with fewer than two of those (a t-interval after a pilot-chosen N
    under-covers); "sequential" with ``look_confidence`` (everything at that level, the p-value
    Bonferroni-adjusted over the K = (1 - confidence) / (1 - look_confidence) looks); else "t".
    ``prior``: a "sessions" interval rests on the variance of the session means moderated by it
    (:mod:`luksbench.analysis.moderated`; ``moderated``, ``prior_df``, ``interval_df``).
    ``all_or_none`` (net CPU metrics): a value <= 0 on either side leaves no pair usable, as
    dropping the cell's low values would select on the outcome. ``drift_fit``: (AR(1)
    coefficient of d pooled over the run's cells, detected?) (:mod:`luksbench.analysis.drift`):
    a "t" or "sequential" interval widens by the square root of its variance inflation.
    ``shared_baseline`` (net CPU metrics whose idle sample nets several pairs): "withheld", no
    interval, unless it is over sessions (the sample's error is then part of each session's
    level, which that interval covers) or the baseline's variance can be carried (a tuple from
    :func:`baseline_carry`; :func:`_carried_scale`; ``covers`` says so). ``added`` (net CPU):
    variant minus baseline in the metric's unit, its t-interval at the row's level."""
    usable, fio_error, ss_missed = _usable_unflagged(b, v, flags, all_or_none)
    ok = usable & ~fio_error & ~ss_missed
    d_all = np.log(v[ok] / b[ok])
    # with sessions a pair is judged within its session: a session's own level is the
    # variation the two-level interval is there to capture, not an outlier
    means, _, _ = session_components(d_all, sessions[ok])
    _, inv = np.unique(sessions[ok].astype(str), return_inverse=True)
    within = d_all - means[inv] if sessions_planned >= 2 and means.size >= 2 else d_all
    flagged = flag_outliers(within, flags[ok, 0], flags[ok, 1])
    use = ~flagged if exclude_outliers else np.ones_like(flagged)
    d, bu, vu, su = d_all[use], b[ok][use], v[ok][use], sessions[ok][use]
    means, sd_within, sd_between = session_components(d, su)
    two_level = sessions_planned >= 2 and means.size >= 2
    pilot, valid, scale = None, True, None
    if two_level:  # every estimate from the session means
        d, bu, vu, scale = _session_level(means, su, bu, vu, prior)
    elif pilot_pairs >= 2:
        pilot = _pilot_scale(d_all[reps[ok] <= pilot_pairs])
        valid = pilot is not None
    moderated = scale is not None
    withheld, carried = _shared_baseline(not two_level and shared_baseline, pilot, d, bu, vu)
    scale = carried or scale
    valid = valid and not withheld
    sequential = not two_level and look_confidence > 0
    level = look_confidence if sequential else confidence
    looks = (1 - confidence) / (1 - level)  # the p-value's scale: K under Bonferroni, else 1
    ci = paired_log_ratio_ci(d, level, pilot or scale)
    if not valid:
        ci = LogRatioCI(ci.n, ci.mean, ci.sd, math.nan, math.nan)
    one = "one session" if means.size <= 1 else "sessions"
    kind = "sessions" if two_level else "none" if not valid else "stein" if pilot else "t"
    kind = "sequential" if sequential else kind
    kind = "withheld" if withheld else kind
    one += " and its idle baseline's error, carried" if carried else ""
    widens = kind in ("t", "sequential")
    inflation = drift.cell_inflation(*drift_fit, ci.n) if widens else math.nan
    estimates = (ci, d, bu, vu, pilot or scale, valid, better_high, level, margin_pct, looks)
    estimates += (inflation if widens else 1.0,)
    return {
        "n": int(use.sum()),
        "n_dropped": int((~usable).sum()),
        "n_fio_error": int(fio_error.sum()),
        "n_ss_not_attained": int(ss_missed.sum()),
        "baseline_mean": float(bu.mean()) if ci.n else math.nan,
        "variant_mean": float(vu.mean()) if ci.n else math.nan,
        **_estimates(*estimates),
        "n_outliers": int(flagged.sum()),
        "outlier_reps": ",".join(str(int(r)) for r in reps[ok][flagged]),
        "interval": kind,
        "pilot_sd_log_ratio": math.nan if pilot is None else pilot[0],
        "covers": "sessions" if two_level else f"repetitions within {one}",
        "sessions": int(means.size),
        "sd_within_session": sd_within,
        "sd_between_sessions": sd_between,
        "drift_rho": drift_fit[0],
        "drift_inflation": inflation,
        "drift_widening_pct": 100 * (math.sqrt(inflation) - 1),
        "moderated": moderated,
        "prior_df": prior.df if moderated else math.nan,
        "interval_df": float(_scale(d, pilot or scale)[1]) if ci.n >= 2 and valid else math.nan,
        # a carried idle baseline's error is in the ratio's interval, not in a plain t over vu - bu
        **_added(vu - bu, level, all_or_none and valid and not carried, estimates[-1]),
    }


def _session_level(means, sessions, bu, vu, prior) -> tuple:
    """(d, baseline, variant, scale) of a two-level cell: its session means, and with a
    ``prior`` the moderated (posterior SD, its df + 1), the form of a Stein pilot (else None)."""
    _, inv = np.unique(sessions.astype(str), return_inverse=True)
    count = np.bincount(inv)
    bu, vu = np.bincount(inv, bu) / count, np.bincount(inv, vu) / count
    scale = None
    if prior is not None:
        var, df = eb.posterior(float(means.var(ddof=1)), means.size - 1, prior)
        scale = (math.sqrt(var), df + 1) if math.isfinite(var) else None
    return means, bu, vu, scale


def _pilot_scale(d_pilot: np.ndarray) -> tuple[float, int] | None:
    """Stein's (SD, n0) of the usable pilot pairs; None with fewer than two."""
    return (float(d_pilot.std(ddof=1)), int(d_pilot.size)) if d_pilot.size >= 2 else None


def _usable_unflagged(b, v, flags, all_or_none: bool) -> tuple[np.ndarray, ...]:
    """Masks (usable, fio error, steady state not attained) of a cell's pairs: a usable pair
    fio flagged (the run failed or never settled) is no measurement of the cell; the loss table
    leaves it out, counted per reason, and the sequential design measures a replacement."""
    usable = usable_pairs(b, v)
    if all_or_none and (np.less_equal(b, 0) | np.less_equal(v, 0)).any():
        usable[:] = False
    return usable, usable & flags[:, 0], usable & flags[:, 1]


def _shared_baseline(shared, pilot, d, bu, vu) -> tuple[bool, tuple | None]:
    """(withheld, carried scale) of a cell whose idle baseline is ``shared`` (False, True, or a
    :func:`baseline_carry` tuple): carried where its variance is known and the interval is not
    Stein's, else withheld."""
    if not shared:
        return False, None
    carried = (
        _carried_scale(d, bu, vu, *shared) if isinstance(shared, tuple) and not pilot else None
    )
    return carried is None, carried


def _carried_scale(d, bu, vu, var_rate, df_rate, share, coef_b, coef_v):
    """(SD, df + 1) of a t-interval on mean d that carries a shared idle baseline's error: the
    pairs' own variance s^2 / n plus g^2 var_rate share, where g = coef_b / mean(b) -
    coef_v / mean(v) is how d moves with the idle rate, ``share`` sum_j (n_j / n)^2 over the
    pairs' idle samples and ``var_rate`` the variance of the host's idle samples (``df_rate``
    degrees of freedom); Welch-Satterthwaite df. None when not estimable."""
    n = d.size
    if n < 2 or not (df_rate >= 1 and math.isfinite(var_rate)):
        return None
    own = float(d.var(ddof=1)) / n
    g = coef_b / float(bu.mean()) - coef_v / float(vu.mean())
    extra = g * g * var_rate * share
    total = own + extra
    if not (math.isfinite(total) and total > 0):
        return None
    df = total**2 / (own**2 / (n - 1) + extra**2 / df_rate)
    return math.sqrt(total * n), df + 1


def _added(diff: np.ndarray, confidence: float, wanted: bool, inflation: float = 1.0) -> dict:
    """``added``, ``added_low``, ``added_high``: mean of ``diff`` (variant minus baseline) with its
    t-interval, widened for drift as the row's interval is (``inflation``); NaN unless ``wanted``,
    bounds NaN below 2 values."""
    ci = paired_log_ratio_ci(diff, confidence) if wanted else LogRatioCI(0, *[math.nan] * 4)
    ci = _widened(ci, inflation)
    return {"added": ci.mean, "added_low": ci.low, "added_high": ci.high}


CROSS_CHECK_COLUMNS = ("fieller_low", "fieller_high", "boot_low", "boot_high")


def _widened(ci: LogRatioCI, inflation: float) -> LogRatioCI:
    """``ci`` with its half-width times the square root of ``inflation`` (NaN or <= 1: as is)."""
    if not inflation > 1:
        return ci
    f = math.sqrt(inflation)
    return LogRatioCI(
        ci.n, ci.mean, ci.sd, ci.mean - f * (ci.mean - ci.low), ci.mean + f * (ci.high - ci.mean)
    )


def _estimates(
    ci, d, bu, vu, pilot, valid, better_high, confidence, margin_pct, looks=1.0, inflation=1.0
) -> dict:
    """A row's effect with its interval, test and equivalence check, and the Fieller and
    bootstrap cross-checks, from the values its interval rests on (pairs or session means), all at
    ``confidence``; the p-value scaled by ``looks`` (a sequential look's (1 - confidence) / (1 -
    look level): K under Bonferroni). ``inflation`` (drift): the interval, the equivalence
    interval and the test rest on the variance s^2 / n times it; the cross-checks do not."""
    eq_conf = tost_confidence(confidence)
    eq = paired_log_ratio_ci(d, eq_conf, pilot) if ci.n >= 2 and valid and eq_conf > 0 else None
    ci, eq = _widened(ci, inflation), eq and _widened(eq, inflation)
    p = paired_t_pvalue(d, pilot)
    if inflation > 1 and d.size >= 2:  # the interval's own scale and df, widened alike
        sd, df = _scale(d, pilot)
        p = _t_pvalue(ci.mean, sd * math.sqrt(inflation / d.size), df)
    effect_pct, bounds = effect_with_equivalence(ci, eq, better_high, margin_pct)
    f_lo, f_hi = fieller_ratio_ci(bu, vu, confidence)
    fieller = effect_bounds_from_ratio(f_lo, f_hi, better_high)  # NaN bounds stay NaN
    b_lo, b_hi = bootstrap_log_ratio_ci(d, confidence)
    boot = effect_from_log_ratio(ci.mean, b_lo, b_hi, better_high)[1:]
    return {
        "mean_log_ratio": ci.mean,
        "sd_log_ratio": ci.sd,
        "ratio": math.exp(ci.mean) if ci.n else math.nan,
        "effect": "loss" if better_high else "increase",
        "effect_pct": effect_pct,
        "loss_pct": effect_pct if better_high else math.nan,
        "increase_pct": math.nan if better_high else effect_pct,
        "p_value": float(np.minimum(1, looks * p)) if valid else math.nan,
        **bounds,
        **dict(zip(CROSS_CHECK_COLUMNS, (*fieller, *boot), strict=True)),
    }


DESIGN_COLUMNS = ["target_pairs", "noisy", "pilot_pairs"]


def _design(fio: pd.DataFrame) -> pd.DataFrame:
    """Per (host, workload): the adaptive design's columns from ingest's (the run's targets.json;
    NaN/False for a fixed design)."""
    keys = ["host", "workload"]
    if fio.empty or "target_pairs" not in fio.columns:
        return pd.DataFrame(columns=[*keys, *DESIGN_COLUMNS, "look_confidence"])
    missing = pd.Series(math.nan, index=fio.index)
    df = fio[keys].assign(
        target_pairs=pd.to_numeric(fio["target_pairs"], errors="coerce"),
        noisy=fio.get("hit_cap", missing).eq(True),
        pilot_pairs=pd.to_numeric(fio.get("pilot_pairs", missing), errors="coerce"),
        look_confidence=pd.to_numeric(fio.get("look_confidence", missing), errors="coerce"),
    )
    aggregate = dict.fromkeys([*DESIGN_COLUMNS, "look_confidence"], "max") | {"noisy": "any"}
    return df.groupby(keys, as_index=False).agg(aggregate)


def loss_table(
    fio: pd.DataFrame,
    baseline: str = "plain",
    variant: str = "luks",
    metrics: list[str] | tuple[str, ...] | None = None,
    confidence: float = 0.95,
    equivalence_margin_pct: float = DEFAULT_EQUIVALENCE_MARGIN_PCT,
    exclude_outliers: bool = False,
    decision_regions: dict | None = None,
) -> pd.DataFrame:
    """The paired loss table (columns :data:`LOSS_COLUMNS`) from a tidy fio table (``fio_table``).

    ``exclude_outliers``: leave flagged pairs out of every estimate (counted in ``n_outliers``
    either way). Each metric is its own Benjamini-Hochberg family, so a row's q-value, verdict
    and decision do not depend on which other metrics are computed."""
    _check_confidence(confidence)
    regions = check_regions(decision_regions)
    if not equivalence_margin_pct > 0:
        raise ValueError(f"equivalence margin must be > 0, not {equivalence_margin_pct}")
    # the default metrics a table has (CPU needs the sidecars); metrics asked for must be there
    metrics = list(metrics or [m for m in DEFAULT_METRICS if m in fio.columns])
    for m in metrics:
        higher_is_better(m)
        if m not in fio.columns:
            raise ValueError(f"metric {m!r} is not a column of the fio table")
    paired = pair_values(fio, baseline, variant, metrics)
    base_v = paired["baseline_value"].to_numpy(float)
    var_v = paired["variant_value"].to_numpy(float)
    reps = paired["rep"].to_numpy()
    sessions = paired["session"].to_numpy(dtype=object)
    planned = fio.groupby("host")["sessions_planned"].max() if "sessions_planned" in fio else {}
    flags = paired[list(REP_FLAGS)].to_numpy(bool)
    attrs = {a: paired[a].to_numpy(object) for a in CELL_ATTRS}
    design = _design(fio)
    shared = shared_idle_cells(fio, (baseline, variant))
    carries = baseline_carry(fio, baseline, variant) if shared else {}
    by_cell = design.set_index(["host", "workload"])
    pilots, levels = by_cell["pilot_pairs"].to_dict(), by_cell["look_confidence"].to_dict()
    groups = paired.groupby([*CELL_KEYS, "metric"], sort=True, dropna=False).indices
    # drift: d of every cell in the order measured, pooled per host and metric
    ok = usable_pairs(base_v, var_v)
    series = {k: np.log(var_v[p][ok[p]] / base_v[p][ok[p]]) for k, p in groups.items()}
    drift_fits = drift.pooled_by(series, lambda key: (key[0], key[-1]))
    settings = (confidence, equivalence_margin_pct, exclude_outliers)
    rows, calls = [], []
    for key, pos in groups.items():
        cell = dict(zip([*CELL_KEYS, "metric"], key, strict=True))
        better_high, host = METRICS[cell["metric"]], cell["host"]
        arrays = [a[pos] for a in (base_v, var_v, reps, sessions, flags)]
        pilot = float(pilots.get((host, cell["workload"]), math.nan))
        cpu = METRIC_FAMILIES[cell["metric"]] == "cpu"
        level = float(levels.get((host, cell["workload"]), math.nan))
        sessions_ = int(planned.get(host, 1))
        fit = drift_fits[(host, cell["metric"])]
        shared_ = cpu and (host, cell["workload"]) in shared
        carry = carries.get((host, cell["workload"], cell["metric"]))
        shared_ = carry if shared_ and carry is not None else shared_
        calls.append((*arrays, better_high, *settings, pilot, cpu, sessions_, level, fit, shared_))
        rows.append({**cell, **{a: v[pos[0]] for a, v in attrs.items()}, **_cell_stats(*calls[-1])})
    _moderate_sessions(rows, calls)
    table = pd.DataFrame(
        rows, columns=[c for c in LOSS_COLUMNS if c not in (*DESIGN_COLUMNS, "look_confidence")]
    )
    table = table.assign(
        higher_is_better=table["metric"].map(METRICS),
        baseline=baseline,
        variant=variant,
        confidence=confidence,
        equivalence_margin_pct=equivalence_margin_pct,
        outliers_excluded=exclude_outliers,
    )
    table = table.merge(design, on=["host", "workload"], how="left")
    table["noisy"] = table["noisy"].eq(True)
    table["q_value"] = math.nan
    for idx in table.groupby("metric").indices.values():
        table.loc[table.index[idx], "q_value"] = benjamini_hochberg(table["p_value"].iloc[idx])
    n = table["n"].where(~table["interval"].isin(["none", "withheld"]), 0).to_numpy()
    table["verdict"] = table_verdicts(n, table["q_value"], table["equivalent"], confidence)
    table = _with_decisions(table, regions)
    table = table[LOSS_COLUMNS]
    if not table.empty:
        keys = ["host", "pattern", "rw", "bs_bytes", "iodepth", "job_slot", "direction", "_m"]
        table = table.assign(_m=table["metric"].map({m: i for i, m in enumerate(metrics)}))
        table = table.sort_values(keys).drop(columns="_m").reset_index(drop=True)
    return with_dtypes(table, LOSS_DTYPES)


def _moderate_sessions(rows: list[dict], calls: list[tuple]) -> None:
    """The "sessions" rows of ``rows`` over at most :data:`moderated.MODERATE_UP_TO` sessions
    again, each interval on its variance moderated by the prior of its host and metric
    (:func:`moderated.fit_prior` over all those rows' session-mean variances); rows of a host and
    metric with too few such cells stay as they are."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        if row["interval"] == "sessions":
            groups.setdefault((row["host"], row["metric"]), []).append(i)
    for members in groups.values():
        var = [rows[i]["sd_log_ratio"] ** 2 for i in members]
        prior = eb.fit_prior(var, [rows[i]["sessions"] - 1 for i in members])
        if prior is None:
            continue
        for i in members:
            if rows[i]["sessions"] <= eb.MODERATE_UP_TO:
                rows[i] |= _cell_stats(*calls[i], prior=prior)


def shared_idle_cells(fio: pd.DataFrame, stacks) -> set[tuple]:
    """(host, workload) of the cells whose net CPU values on ``stacks`` come from an idle sample
    (ingest's ``idle_sample``) that nets runs of two or more repetitions: its error is shared."""
    if fio.empty or not {"idle_sample", "cpu_net"} <= set(fio.columns):
        return set()
    keys = ["host", "workload", "stack", "idle_sample"]
    net = fio[fio["cpu_net"].eq(True) & fio["stack"].isin(stacks) & fio["idle_sample"].notna()]
    reps = net.groupby(keys, observed=True)["rep"].nunique()
    return {(host, workload) for (host, workload, _, _), n in reps.items() if n >= 2}


def baseline_carry(fio: pd.DataFrame, baseline: str, variant: str) -> dict:
    """(host, workload, metric) -> (var_rate, df_rate, share, coef_b, coef_v) for
    :func:`_carried_scale`, for CPU busy time per GiB and per I/O: the variance of the host's
    idle busy rates over its distinct samples (m - 1 df; needs m >= 2), the share of the pairs'
    samples (baseline arm) and each arm's mean coefficient of the idle rate in the value
    (interval / GiB; 1e6 interval / I/Os)."""
    need = {"idle_sample", "cpu_net", "idle_busy_cpu_s", "cpu_interval_s", "io_gib", "file"}
    if fio.empty or not need <= set(fio.columns):
        return {}
    net = fio[fio["cpu_net"].eq(True) & fio["stack"].isin([baseline, variant])]
    net = net[net["idle_sample"].notna()]
    per_file = net.groupby("file")
    interval = net["cpu_interval_s"].astype(float)
    ios = (net["io_bytes"] / net["io_bs_bytes"]).groupby(net["file"]).transform("sum")
    net = net.assign(
        _rate=net["idle_busy_cpu_s"] / interval,
        _gib=interval / per_file["io_gib"].transform("sum"),
        _io=1e6 * interval / ios,
    )
    rates = net.drop_duplicates(["host", "idle_sample"]).groupby("host")["_rate"]
    spread = {h: (float(r.var(ddof=1)), r.size - 1) for h, r in rates if r.size >= 2}
    coefs = net.drop_duplicates("file").groupby(["host", "workload", "stack"])[["_gib", "_io"]]
    coefs = coefs.mean().to_dict("index")
    base = net[net["stack"] == baseline].drop_duplicates(["host", "workload", "rep"])
    out = {}
    for (host, workload), runs in base.groupby(["host", "workload"]):
        if host not in spread or runs.empty:
            continue
        share = float(((runs["idle_sample"].value_counts() / len(runs)) ** 2).sum())
        b, v = coefs.get((host, workload, baseline)), coefs.get((host, workload, variant))
        if b is None or v is None:
            continue
        for metric, col in (("busy_cpu_s_per_gib", "_gib"), ("busy_cpu_us_per_io", "_io")):
            out[(host, workload, metric)] = (*spread[host], share, b[col], v[col])
    return out


def _with_decisions(table: pd.DataFrame, regions: dict) -> pd.DataFrame:
    """The decision by magnitude of every row, its margins, and which test an IOPS or CPU-per-I/O
    row repeats."""
    margins = table["metric"].map(lambda m: regions[METRIC_FAMILIES[m]])
    table["decision_lower_pct"] = [lower for lower, _ in margins]
    table["decision_upper_pct"] = [upper for _, upper in margins]
    bounds = table[["ci_low", "ci_high", "decision_lower_pct", "decision_upper_pct"]]
    table["decision"] = [decision(*row) for row in bounds.to_numpy(float).tolist()]
    # at a fixed block size IOPS is bandwidth / block size and CPU per I/O is CPU per GiB times
    # it: the same test, not a second one
    fixed_bs = pd.to_numeric(table["bs_bytes"], errors="coerce").gt(0)
    table["derived_from"] = table["metric"].map(DERIVED_FROM).where(fixed_bs).fillna("")
    return table


def with_dtypes(
    table: pd.DataFrame, dtypes: dict, default: str = "float64", errors: str = "raise"
) -> pd.DataFrame:
    """``table`` typed by ``dtypes`` ({type, or function of a column's values: columns}), the other
    columns as ``default``: one schema however the rows came about. ``errors="coerce"``: an
    unreadable number is missing (values as a raw document holds them); else it raises."""
    types = {col: dtype for dtype, cols in dtypes.items() for col in cols}
    for col in table.columns:
        dtype = types.get(col, default)
        if callable(dtype):
            table[col] = dtype(table[col].tolist())
        elif dtype in ("int64", "Int64", "float64"):
            table[col] = pd.to_numeric(table[col], errors=errors).astype(dtype)
        else:
            table[col] = table[col].astype(dtype)
    return table


def loss_tables(fio: pd.DataFrame, comparisons, *args, **kwargs) -> pd.DataFrame:
    """:func:`loss_table` (same arguments after the pair) of every (baseline, variant) pair in
    ``comparisons``, concatenated in that order; each stays its own family of tests."""
    parts = [loss_table(fio, b, v, *args, **kwargs) for b, v in comparisons]
    if not parts:
        raise ValueError("no comparisons given")
    table = pd.concat(parts, ignore_index=True)[LOSS_COLUMNS]
    return with_dtypes(table, LOSS_DTYPES)


#: the columns that identify one arm's cell in :func:`arm_summary`
ARM_KEYS = ["host", "stack", "pattern", "rw", "bs_bytes", "iodepth", "direction", "job_slot"]


def arm_summary(fio: pd.DataFrame, metrics, confidence: float = 0.95) -> pd.DataFrame:
    """Mean over repetitions (:func:`rep_values`) per arm and cell (:data:`ARM_KEYS`) and metric,
    with the half width of its t-interval (NaN with fewer than two repetitions)."""
    _check_confidence(confidence)
    vals = rep_values(fio, list(metrics))
    rows = []
    for metric in metrics:
        for key, g in vals.groupby(ARM_KEYS, sort=True, dropna=False):
            v = pd.to_numeric(g[metric], errors="coerce").dropna().to_numpy(float)
            n = v.size
            mean = float(v.mean()) if n else math.nan
            half = math.nan
            if n >= 2:
                half = _t_quantile(confidence, n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
            rows.append([*key, metric, n, mean, half, confidence])
    return pd.DataFrame(rows, columns=[*ARM_KEYS, "metric", "n", "mean", "ci_half", "confidence"])


#: order.parquet's columns: the order effect of a comparison and metric over its cells
ORDER_COLUMNS = ["baseline", "variant", "metric", "n_cells", "n_in_order", "n_reversed"]
ORDER_COLUMNS += ["order_log", "order_pct", "ci_low", "ci_high", "p_value", "confidence"]


def pair_orders(schedule: pd.DataFrame, baseline: str, variant: str) -> pd.DataFrame:
    """Per (host, workload, rep): ``baseline_first``, whether the baseline ran before the variant
    in that pair (from the schedule table's ``position_in_cell``; a run measured again after a
    failure counts as it was last measured)."""
    cols = ["host", "workload", "rep", "stack", "position_in_cell"]
    sched = schedule[schedule["stack"].isin([baseline, variant])]
    if "status" in sched.columns:
        sched = sched[sched["status"].fillna("ok").eq("ok")]
    sched = sched[cols].dropna().drop_duplicates(cols[:4], keep="last")
    wide = sched.pivot(index=cols[:3], columns="stack", values="position_in_cell")
    if wide.empty or baseline not in wide or variant not in wide:
        return pd.DataFrame(columns=[*cols[:3], "baseline_first"])
    wide = wide.dropna()
    return (wide[baseline] < wide[variant]).rename("baseline_first").reset_index()


def order_effect(
    fio: pd.DataFrame,
    schedule: pd.DataFrame,
    baseline: str,
    variant: str,
    metrics,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """How much the second run of a pair measures above the first, per metric (columns
    :data:`ORDER_COLUMNS`). A shift o of the second run makes d = mean + o in pairs run baseline
    first and mean - o in the others: per cell with both orders, o is half the difference of
    their mean d; ``order_log`` its mean over cells with a t-interval over cells."""
    _check_confidence(confidence)
    paired = pair_values(fio, baseline, variant, list(metrics)).merge(
        pair_orders(schedule, baseline, variant), on=["host", "workload", "rep"]
    )
    paired = paired[usable_pairs(paired["baseline_value"], paired["variant_value"])]
    paired = paired.assign(d=np.log(paired["variant_value"] / paired["baseline_value"]))
    rows = []
    for metric in metrics:
        m = paired[paired["metric"] == metric]
        means = m.groupby([*CELL_KEYS, "baseline_first"])["d"].mean().unstack("baseline_first")
        both = means.shape[1] == 2
        o = ((means[True] - means[False]) / 2).dropna().to_numpy(float) if both else []
        ci = paired_log_ratio_ci(np.asarray(o, float), confidence)
        pct = [100 * math.expm1(x) for x in (ci.mean, ci.low, ci.high)]
        first = m["baseline_first"].astype(bool)
        rows.append([baseline, variant, metric, ci.n, int(first.sum()), int((~first).sum())])
        rows[-1] += [ci.mean, *pct, paired_t_pvalue(o), confidence]
    return pd.DataFrame(rows, columns=ORDER_COLUMNS)


def interval_scales(rows: pd.DataFrame) -> pd.DataFrame:
    """Per loss row, what its interval rests on (:func:`_cell_stats`): ``sign`` (-1 where the
    effect is a loss: effect % = 100 sign (ratio - 1)), ``mean`` (mean d), ``half`` (the
    interval's half-width on d, from ``ci_low``/``ci_high``), ``df`` (``interval_df``: sessions,
    moderated or not, Stein's pilot, the pairs) and ``se``, the half-width over the row's own t
    quantile (its look's level for a sequential row): whatever widened the interval (drift, a
    carried idle baseline, moderation) is in it. NaN without an interval."""
    stein, two_level = rows["interval"].eq("stein"), rows["interval"].eq("sessions")
    n_eff = rows["sessions"].where(two_level, rows["n"]).astype(float)
    df = rows["pilot_pairs"].where(stein, n_eff).astype(float) - 1
    if "interval_df" in rows:
        df = rows["interval_df"].astype(float).fillna(df)
    level = rows["confidence"].astype(float)
    if "look_confidence" in rows:
        sequential = rows["interval"].eq("sequential")
        level = rows["look_confidence"].astype(float).where(sequential, level)
    sign = np.where(rows["higher_is_better"].astype(bool), -1.0, 1.0)
    bounds = np.log1p(sign[:, None] * rows[["ci_low", "ci_high"]].to_numpy(float) / 100)
    half = np.abs(bounds[:, 1] - bounds[:, 0]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        quantile = sps.t.ppf((1 + level.to_numpy(float)) / 2, df.to_numpy(float))
        se = half / quantile
    return pd.DataFrame(
        {
            "sign": sign,
            "mean": rows["mean_log_ratio"].to_numpy(float),
            "half": half,
            "se": se,
            "df": df.to_numpy(float),
        },
        index=rows.index,
    )
