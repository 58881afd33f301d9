"""One row of the loss table from one cell's pairs: which interval, its estimates, checks and flags.

:func:`cell_stats` takes a cell's pairs and design (:class:`CellData`) and the table's settings
(:class:`TestSettings`); numpy and scipy on arrays only (the table assembly is
:mod:`luksbench.analysis.stats`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from luksbench.analysis import drift
from luksbench.analysis import moderated as eb
from luksbench.analysis.statmath import (
    LogRatioCI,
    _scale,
    _t_pvalue,
    bootstrap_log_ratio_ci,
    effect_bounds_from_ratio,
    effect_from_log_ratio,
    effect_with_equivalence,
    fieller_ratio_ci,
    flag_outliers,
    paired_log_ratio_ci,
    paired_t_pvalue,
    session_components,
    tost_confidence,
    usable_pairs,
)

CROSS_CHECK_COLUMNS = ("fieller_low", "fieller_high", "boot_low", "boot_high")


@dataclass(frozen=True)
class CellData:
    """One cell and metric: its pairs (arrays aligned by pair; ``flags`` one column per
    :data:`luksbench.analysis.stats.REP_FLAGS`) and what the design says about them (see
    :func:`cell_stats`)."""

    baseline: np.ndarray
    variant: np.ndarray
    reps: np.ndarray
    sessions: np.ndarray
    flags: np.ndarray
    better_high: bool
    pilot_pairs: float = math.nan
    all_or_none: bool = False
    sessions_planned: int = 1
    look_confidence: float = math.nan
    drift_fit: tuple[float, bool] = (math.nan, False)
    shared_baseline: bool | tuple = False


@dataclass(frozen=True)
class TestSettings:
    """The loss table's settings every cell shares: confidence level, equivalence margin (% points)
    and whether flagged pairs are left out of the estimates."""

    confidence: float
    margin_pct: float
    exclude_outliers: bool = False


@dataclass(frozen=True)
class Basis:
    """What a row's estimates rest on (:func:`row_estimates`): its interval ``ci`` on mean d, the
    values it comes from (``d`` and both arms: pairs or session means), the ``scale`` (SD, n0) it
    rests on when not the values' own (Stein's pilot, a moderated or carried scale), whether it
    is ``valid``, the level, margin, ``looks`` (the p-value's Bonferroni factor) and drift
    ``inflation`` of its variance."""

    ci: LogRatioCI
    d: np.ndarray
    baseline: np.ndarray
    variant: np.ndarray
    scale: tuple[float, int] | None
    valid: bool
    better_high: bool
    confidence: float
    margin_pct: float
    looks: float = 1.0
    inflation: float = 1.0


def cell_stats(cell: CellData, settings: TestSettings, prior: eb.Prior | None = None) -> dict:
    """One row of the loss table but for the cross-table q-value and verdict.

    ``interval``: "sessions" with ``sessions_planned`` >= 2 and pairs from two sessions or more
    (t over the session means of d, on which every estimate then rests); "stein" with
    ``pilot_pairs`` n0 (an adaptive cell whose N came from a pilot SD: the SD of the usable pairs
    among reps 1..n0), "none" with fewer than two of those (a t-interval after a pilot-chosen N
    under-covers); "sequential" with ``look_confidence`` (everything at that level, the p-value
    Bonferroni-adjusted over the K = (1 - confidence) / (1 - look_confidence) looks), over
    sessions too when there are (:func:`_sequential_sessions`, ``covers`` sessions); else "t".
    ``prior``: a "sessions" interval rests on the variance of the session means moderated by it
    (:mod:`luksbench.analysis.moderated`; ``moderated``, ``prior_df``, ``interval_df``).
    ``all_or_none`` (net CPU metrics): a value <= 0 on either side leaves no pair usable, as
    dropping the cell's low values would select on the outcome. ``drift_fit``: (AR(1)
    coefficient of d pooled over the run's cells, detected?) (:mod:`luksbench.analysis.drift`):
    a "t" or "sequential" interval widens by the square root of its variance inflation.
    ``shared_baseline`` (net CPU metrics whose idle sample nets several pairs): "withheld", no
    interval, unless it is over sessions (the sample's error is then part of each session's
    level, which that interval covers) or the baseline's variance can be carried (a tuple from
    :func:`luksbench.analysis.stats.baseline_carry`; :func:`_carried_scale`; ``covers`` says so). ``added`` (net CPU):
    variant minus baseline in the metric's unit, its t-interval at the row's level."""
    b, v, reps, sessions, flags = cell.baseline, cell.variant, cell.reps, cell.sessions, cell.flags
    sessions_planned, look_confidence = cell.sessions_planned, cell.look_confidence
    confidence = settings.confidence
    usable, fio_error, ss_missed = _usable_unflagged(b, v, flags, cell.all_or_none)
    ok = usable & ~fio_error & ~ss_missed
    d_all = np.log(v[ok] / b[ok])
    flagged = _outliers(d_all, sessions[ok], flags[ok], sessions_planned)
    use = ~flagged if settings.exclude_outliers else np.ones_like(flagged)
    d, bu, vu, su = d_all[use], b[ok][use], v[ok][use], sessions[ok][use]
    means, sd_within, sd_between = session_components(d, su)
    two_level = sessions_planned >= 2 and means.size >= 2
    sequential = look_confidence > 0
    level = look_confidence if sequential else confidence
    pilot, valid, scale, inflation = None, True, None, math.nan
    if two_level and sequential:  # the sessions interval, or the pairs' drift-widened if wider
        d, bu, vu, scale, inflation = _sequential_sessions(means, su, d, bu, vu, prior, cell, level)
    elif two_level:  # every estimate from the session means
        d, bu, vu, scale = _session_level(means, su, bu, vu, prior)
    elif cell.pilot_pairs >= 2:
        pilot = _pilot_scale(d_all[reps[ok] <= cell.pilot_pairs])
        valid = pilot is not None
    moderated = scale is not None
    withheld, carried = _shared_baseline(not two_level and cell.shared_baseline, pilot, d, bu, vu)
    scale = carried or scale
    valid = valid and not withheld
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
    if widens and not two_level:
        inflation = drift.cell_inflation(*cell.drift_fit, ci.n)
    basis = Basis(
        ci, d, bu, vu, pilot or scale, valid, cell.better_high, level, settings.margin_pct
    )
    basis = dataclasses.replace(basis, looks=looks, inflation=inflation if widens else 1.0)
    return {
        "n": int(use.sum()),
        "n_dropped": int((~usable).sum()),
        "n_fio_error": int(fio_error.sum()),
        "n_ss_not_attained": int(ss_missed.sum()),
        "baseline_mean": float(bu.mean()) if ci.n else math.nan,
        "variant_mean": float(vu.mean()) if ci.n else math.nan,
        **row_estimates(basis),
        "n_outliers": int(flagged.sum()),
        "outlier_reps": ",".join(str(int(r)) for r in reps[ok][flagged]),
        "interval": kind,
        "pilot_sd_log_ratio": math.nan if pilot is None else pilot[0],
        "covers": "sessions" if two_level else f"repetitions within {one}",
        "sessions": int(means.size),
        "sd_within_session": sd_within,
        "sd_between_sessions": sd_between,
        "drift_rho": cell.drift_fit[0],
        "drift_inflation": inflation,
        "drift_widening_pct": 100 * (math.sqrt(inflation) - 1),
        "moderated": moderated,
        "prior_df": prior.df if moderated else math.nan,
        "interval_df": float(_scale(d, pilot or scale)[1]) if ci.n >= 2 and valid else math.nan,
        # a carried idle baseline's error is in the ratio's interval, not in a plain t over vu - bu
        **_added(vu - bu, level, cell.all_or_none and valid and not carried, basis.inflation),
    }


def _outliers(d: np.ndarray, sessions: np.ndarray, flags: np.ndarray, planned: int) -> np.ndarray:
    """:func:`flag_outliers` of a cell's usable pairs; with sessions a pair is judged within its
    session: a session's own level is the variation the two-level interval is there to capture,
    not an outlier."""
    means, _, _ = session_components(d, sessions)
    _, inv = np.unique(sessions.astype(str), return_inverse=True)
    within = d - means[inv] if planned >= 2 and means.size >= 2 else d
    return flag_outliers(within, flags[:, 0], flags[:, 1])


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


def _sequential_sessions(means, sessions, d, bu, vu, prior, cell: CellData, level: float):
    """(d, baseline, variant, scale, drift inflation) of a sequential look over sessions: the
    sessions interval (:func:`_session_level`, moderated with a ``prior``) unless the pairs'
    t-interval widened by the drift of d across rounds (``cell.drift_fit``) is wider at the
    look's ``level``. Rounds cycle the sessions, so each session's mean spans the whole run and
    drift across rounds barely shows between them; over pairs it is priced by the widening."""
    m, bm, vm, scale = _session_level(means, sessions, bu, vu, prior)
    inflation = drift.cell_inflation(*cell.drift_fit, d.size)
    over_sessions = paired_log_ratio_ci(m, level, scale)
    over_pairs = paired_log_ratio_ci(d, level)
    half_sessions = over_sessions.high - over_sessions.low
    half_pairs = (over_pairs.high - over_pairs.low) * math.sqrt(max(inflation, 1.0))
    if half_pairs > half_sessions:
        return d, bu, vu, None, inflation
    return m, bm, vm, scale, 1.0


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
    :func:`luksbench.analysis.stats.baseline_carry` tuple): carried where its variance is known and the interval is not
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


def _widened(ci: LogRatioCI, inflation: float) -> LogRatioCI:
    """``ci`` with its half-width times the square root of ``inflation`` (NaN or <= 1: as is)."""
    if not inflation > 1:
        return ci
    f = math.sqrt(inflation)
    return LogRatioCI(
        ci.n, ci.mean, ci.sd, ci.mean - f * (ci.mean - ci.low), ci.mean + f * (ci.high - ci.mean)
    )


def row_estimates(basis: Basis) -> dict:
    """A row's effect with its interval, test and equivalence check, and the Fieller and
    bootstrap cross-checks, from the values its interval rests on (pairs or session means), all at
    ``confidence``; the p-value scaled by ``looks`` (a sequential look's (1 - confidence) / (1 -
    look level): K under Bonferroni). ``inflation`` (drift): the interval, the equivalence
    interval and the test rest on the variance s^2 / n times it; the cross-checks do not."""
    ci, d, bu, vu, pilot, valid = (
        basis.ci,
        basis.d,
        basis.baseline,
        basis.variant,
        basis.scale,
        basis.valid,
    )
    better_high, confidence, looks, inflation = (
        basis.better_high,
        basis.confidence,
        basis.looks,
        basis.inflation,
    )
    margin_pct = basis.margin_pct
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
