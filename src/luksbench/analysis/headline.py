"""The loss table's claims about a family of cells, adjusted for picking from the family.

A family is one metric of one comparison (:data:`FAMILY_KEYS`, the loss table's
Benjamini-Hochberg family), its m cells those with an interval. Two claims pick cells from it:

* "largest": the cell whose own interval is surest of the largest effect (the highest lower
  end, as the paper picks its largest cost), quoted with its interval at the Bonferroni level
  1 - alpha/m (``selection_ci_low``/``selection_ci_high``): all m intervals hold together with
  1 - alpha, so the picked one does too, whichever cell the data made the largest (the row's own
  interval, chosen because it is the largest, covers its truth less often);
* "material": ``material_listed`` where the one-sided test of "effect > the upper margin"
  survives Benjamini-Hochberg over the family at alpha / 2 (the one-sided error of the row's own
  two-sided interval: with m = 1 listed is exactly the decision "material").

alpha is each row's own: a sequential row's interval is at its look level, so its one-sided
p-value is multiplied by K = (1 - confidence) / (1 - look level), as its ``p_value`` is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps

from luksbench.analysis import stats

FAMILY_KEYS = ["baseline", "variant", "metric"]
#: the columns :func:`selection_columns` adds to the loss table
HEADLINE_COLUMNS = ["family_cells", "selection_confidence", "selection_ci_low"]
HEADLINE_COLUMNS += ["selection_ci_high", "selection_decision", "largest"]
HEADLINE_COLUMNS += ["p_material", "q_material", "material_listed"]


def selection_columns(loss: pd.DataFrame, by=FAMILY_KEYS) -> pd.DataFrame:
    """:data:`HEADLINE_COLUMNS` for every row of ``loss`` (same index), per family ``by``."""
    out = pd.DataFrame(index=loss.index, columns=HEADLINE_COLUMNS)
    out = out.astype({c: float for c in HEADLINE_COLUMNS})
    out["selection_decision"] = "insufficient"
    out["largest"] = out["material_listed"] = False
    if loss.empty:
        return out.astype({"family_cells": "int64"})
    for _, rows in loss.groupby(list(by), sort=False, dropna=False):
        out.loc[rows.index, HEADLINE_COLUMNS] = _family(rows)[HEADLINE_COLUMNS]
    types = {"family_cells": "int64", "largest": bool, "material_listed": bool}
    return out.astype(types | {"selection_decision": "string"})


def _family(rows: pd.DataFrame) -> pd.DataFrame:
    """One family's :data:`HEADLINE_COLUMNS`."""
    scales = stats.interval_scales(rows)
    has = np.isfinite(scales["half"]).to_numpy() & np.isfinite(scales["se"]).to_numpy()
    m = int(has.sum())
    half, se, df = (scales[c].to_numpy(float) for c in ("half", "se", "df"))
    wide, level = stats.bonferroni(half, se, df, m)
    mean, sign = scales["mean"].to_numpy(float), scales["sign"].to_numpy(float)
    ends = sign[:, None] * np.expm1(np.stack([mean - wide, mean + wide], axis=1)) * 100
    low, high = np.where(has, ends.min(axis=1), np.nan), np.where(has, ends.max(axis=1), np.nan)
    lower, upper = (rows[c].to_numpy(float) for c in ("decision_lower_pct", "decision_upper_pct"))
    surely = rows["ci_low"].to_numpy(float)  # the cost the row's own interval is sure of
    largest = np.zeros(len(rows), bool)
    if m:
        largest[np.flatnonzero(has)[np.argmax(surely[has])]] = True
    alpha = 1 - rows["confidence"].to_numpy(float)
    p = np.where(has, _p_material(scales, upper, alpha), np.nan)
    q = stats.benjamini_hochberg(p)
    material = rows["decision"].eq("material").to_numpy(bool)
    return pd.DataFrame(
        {
            "family_cells": m,
            "selection_confidence": np.where(has, level, np.nan),
            "selection_ci_low": low,
            "selection_ci_high": high,
            "selection_decision": [
                stats.decision(*b) for b in zip(low, high, lower, upper, strict=True)
            ],
            "largest": largest,
            "p_material": p,
            "q_material": q,
            "material_listed": material & (np.nan_to_num(q, nan=1.0) <= alpha / 2),
        },
        index=rows.index,
    )


def _p_material(scales: pd.DataFrame, upper: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """One-sided p-value of "effect > ``upper`` %" per row: a t-test of mean d against the
    margin's log ratio, times the looks its interval's level was split over."""
    sign, mean, half, se, df = (scales[c].to_numpy(float) for c in scales.columns)
    with np.errstate(divide="ignore", invalid="ignore"):
        margin = np.log1p(sign * upper / 100)  # a loss of 100 % or more: -inf, never beyond
        t = sign * (mean - margin) / se
        t = np.where(np.isnan(t) & (se == 0), 0.0, t)  # d exactly at the margin, no spread
        own = 2 * sps.t.sf(half / se, df)  # the row's own two-sided error (its look level)
        looks = np.where(own > 0, alpha / own, 1.0)
    return np.minimum(1.0, np.maximum(looks, 1.0) * sps.t.sf(t, df))
