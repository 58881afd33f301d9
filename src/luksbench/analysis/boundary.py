"""Group-sequential boundaries: the level of each look's interval in the sequential design.

Looks at n = min_pairs, ..., max_pairs pairs (K looks); the statistic of a cell at look k is the
standardised sum of its first n_k log ratios, so the looks are a Brownian motion seen at
information n_k. A boundary gives every look a constant c_k: its two-sided interval is the paired
t-interval at the nominal level 1 - 2 (1 - Phi(c_k)) (with n_k - 1 degrees of freedom), and the
constants are chosen so that with K looks the probability that any look's interval misses the
truth is 1 - confidence (repeated confidence intervals, Jennison & Turnbull 1989). A decision is
read off the two one-sided bounds, each wrong at most (1 - confidence) / 2 over all looks.

* ``pocock``: one constant for every look (Pocock 1977), calibrated to the K looks;
* ``obrien-fleming``: Lan-DeMets spending of the O'Brien-Fleming type, each side spending
  alpha(t) = 2 - 2 Phi(z_{1 - alpha/4} / sqrt(t)) of its alpha / 2 by information fraction t =
  n_k / max_pairs: very wide early, close to the fixed
  interval at the last look (spends where noisy cells are decided, late);
* ``bonferroni``: 1 - (1 - confidence) / K at every look (spends only part of the error: the
  looks are strongly correlated).

The constants come from the exact crossing probabilities of the looks (recursive numerical
integration, Armitage, McPherson & Rowe 1969, on a fixed grid): deterministic, no table.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize
from scipy import stats as sps

BOUNDARIES = ("pocock", "obrien-fleming", "bonferroni")
#: Pocock spends the error evenly over the looks, so most cells of a quiet box (settled at the
#: first looks) are decided soonest; O'Brien-Fleming suits boxes where cells need the late looks
DEFAULT_BOUNDARY = "pocock"
#: grid points per look of the recursive integration (spacing well under one pair's SD)
_GRID = 301


def _check(boundary: str, confidence: float, min_pairs: int, max_pairs: int) -> None:
    if boundary not in BOUNDARIES:
        raise ValueError(f"unknown boundary {boundary!r}; known: {', '.join(BOUNDARIES)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    if not 2 <= min_pairs <= max_pairs:
        raise ValueError(f"need 2 <= min_pairs <= max_pairs, not {min_pairs}, {max_pairs}")


def _continue(density, grid, weights, info, step, bound):
    """From the density on ``grid`` (the continuation region of the last look, sums at
    information ``info``) to the next look ``step`` later: (probability it crosses ``bound``
    there, the density kept on the next continuation grid)."""
    sd = math.sqrt(step)
    mass = density * weights
    outside = sps.norm.sf((bound - grid) / sd) + sps.norm.cdf((-bound - grid) / sd)
    crossed = float(mass @ outside)
    nxt = np.linspace(-bound, bound, _GRID)
    kept = sps.norm.pdf((nxt[:, None] - grid[None, :]) / sd) @ mass / sd
    return crossed, nxt, kept


def _weights(grid: np.ndarray) -> np.ndarray:
    """Simpson's weights of an odd-sized even grid."""
    h = grid[1] - grid[0]
    w = np.full(grid.size, 2.0)
    w[1::2] = 4.0
    w[0] = w[-1] = 1.0
    return w * h / 3


def crossing_probabilities(info: tuple[int, ...], constants: tuple[float, ...]) -> list[float]:
    """P(the first crossing of |S_k| >= c_k sqrt(n_k) is at look k), k = 1..K, for S the sum of
    iid N(0, 1) seen at ``info`` = (n_1 < ... < n_K) and ``constants`` c_k."""
    first = 2 * float(sps.norm.sf(constants[0]))
    bound = constants[0] * math.sqrt(info[0])
    grid = np.linspace(-bound, bound, _GRID)
    density = sps.norm.pdf(grid / math.sqrt(info[0])) / math.sqrt(info[0])
    out = [first]
    for k in range(1, len(info)):
        step, nxt_bound = info[k] - info[k - 1], constants[k] * math.sqrt(info[k])
        crossed, grid, density = _continue(
            density, grid, _weights(grid), info[k - 1], step, nxt_bound
        )
        out.append(crossed)
    return out


def _pocock(info: tuple[int, ...], alpha: float) -> list[float]:
    def excess(c: float) -> float:
        return sum(crossing_probabilities(info, (c,) * len(info))) - alpha

    upper = float(sps.norm.isf(alpha / (2 * len(info)))) + 0.5  # Bonferroni's is wider
    c = optimize.brentq(excess, float(sps.norm.isf(alpha / 2)) - 1e-9, upper, xtol=1e-7)
    return [c] * len(info)


def _obrien_fleming(info: tuple[int, ...], alpha: float) -> list[float]:
    z = float(sps.norm.isf(alpha / 4))  # each side spends alpha / 2 (Lan & DeMets 1983)
    spend = [4 * float(sps.norm.sf(z / math.sqrt(n / info[-1]))) for n in info]
    constants = [float(sps.norm.isf(spend[0] / 2))]
    bound = constants[0] * math.sqrt(info[0])
    grid = np.linspace(-bound, bound, _GRID)
    density = sps.norm.pdf(grid / math.sqrt(info[0])) / math.sqrt(info[0])
    for k in range(1, len(info)):
        step, target, weights = info[k] - info[k - 1], spend[k] - spend[k - 1], _weights(grid)

        mass = density * weights

        def excess(c: float, k=k, step=step, grid=grid, mass=mass, target=target) -> float:
            bound = c * math.sqrt(info[k])
            outside = sps.norm.sf((bound - grid) / math.sqrt(step))
            return (
                float(mass @ (outside + sps.norm.cdf((-bound - grid) / math.sqrt(step)))) - target
            )

        constants.append(optimize.brentq(excess, 0.0, 40.0, xtol=1e-7))
        bound = constants[-1] * math.sqrt(info[k])
        _, grid, density = _continue(density, grid, weights, info[k - 1], step, bound)
    return constants


@functools.lru_cache(maxsize=64)
def look_levels(
    boundary: str, confidence: float, min_pairs: int, max_pairs: int
) -> dict[int, float]:
    """Pairs n -> the two-sided nominal level of the look at n pairs (n = min_pairs..max_pairs)."""
    _check(boundary, confidence, min_pairs, max_pairs)
    alpha, info = 1 - confidence, tuple(range(min_pairs, max_pairs + 1))
    if boundary == "bonferroni" or len(info) == 1:
        return dict.fromkeys(info, 1 - alpha / len(info))
    constants = _pocock(info, alpha) if boundary == "pocock" else _obrien_fleming(info, alpha)
    return {n: 1 - 2 * float(sps.norm.sf(c)) for n, c in zip(info, constants, strict=True)}


def level_at(boundary: str, confidence: float, min_pairs: int, max_pairs: int, n: int) -> float:
    """The nominal level of the look at ``n`` pairs (clamped to the planned looks: fewer pairs
    than min_pairs take the first look's, more than max_pairs the last's)."""
    levels = look_levels(boundary, confidence, min_pairs, max_pairs)
    return levels[min(max(int(n), min_pairs), max_pairs)]
