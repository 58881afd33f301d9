"""The loss table's selection-adjusted columns (analysis/headline.py): the largest cell's interval
at 1 - alpha/m, material listed only where a one-sided test against the upper margin survives
Benjamini-Hochberg over the family. The simulation of what they are worth is in
test_selection_certainty.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from simulate import loss_row

from luksbench.analysis import stats
from luksbench.analysis.headline import HEADLINE_COLUMNS, selection_columns


def row(d, metric="bw_bytes", level=0.95, kind="t", workload="w", variant="luks") -> dict:
    """A loss-table row of the log ratios ``d`` (None: a withheld row without pairs)."""
    return loss_row(d, metric, level, kind, workload=workload, baseline="plain", variant=variant)


D = {  # log ratios of 4 pairs: losses of about 1, 10, 30 and 45 %
    "a": [-0.01, -0.012, -0.008, -0.011],
    "b": [-0.10, -0.11, -0.105, -0.12],
    "c": [-0.35, -0.36, -0.37, -0.355],
    "d": [-0.60, -0.58, -0.62, -0.61],
}


def test_the_largest_cell_is_quoted_at_the_bonferroni_level_of_its_family():
    rows = [row(d, workload=w) for w, d in D.items()] + [row(None, workload="withheld")]
    loss = pd.DataFrame(rows)
    out = selection_columns(loss)
    assert list(out.columns) == HEADLINE_COLUMNS and out.index.equals(loss.index)
    have = out.iloc[:4]
    assert (have["family_cells"] == 4).all()  # the withheld row is not one of the m
    assert have["selection_confidence"].to_numpy() == pytest.approx(1 - 0.05 / 4)
    for k, d in enumerate(D.values()):
        ci = stats.paired_log_ratio_ci(np.array(d), 1 - 0.05 / 4)
        want = stats.effect_from_log_ratio(ci.mean, ci.low, ci.high, True)[1:]
        got = out.loc[k, ["selection_ci_low", "selection_ci_high"]].to_numpy(float)
        assert got == pytest.approx(want)
    assert out["largest"].tolist() == [False, False, False, True, False]
    withheld = out.iloc[4]
    assert withheld["selection_decision"] == "insufficient" and not withheld["largest"]
    assert math.isnan(withheld["selection_ci_low"]) and not withheld["material_listed"]
    # every (baseline, variant, metric) is its own family
    two = selection_columns(pd.DataFrame([*rows[:2], row(D["c"], variant="other")]))
    assert two["family_cells"].tolist() == [2, 2, 1]
    assert two["largest"].tolist() == [False, True, True]


def test_alone_a_cell_is_listed_material_exactly_when_its_decision_is():
    for d in (D["c"], D["d"], [-0.25, -0.20, -0.28, -0.22]):
        loss = pd.DataFrame([row(d)])
        out = selection_columns(loss)
        assert out["material_listed"].iloc[0] == (loss["decision"].iloc[0] == "material")
        # the one-sided p-value against the margin ln(1 - 20 %)
        t = (math.log(0.8) - np.mean(d)) / (np.std(d, ddof=1) / 2)
        assert out["p_material"].iloc[0] == pytest.approx(sps.t.sf(t, 3))


def test_a_material_cell_among_many_is_listed_only_where_bh_keeps_it():
    """One cell just material on its own interval, 15 cells near the margin but below it: alone
    it would be listed, after Benjamini-Hochberg over 16 it is not; a clear one stays listed."""
    rng = np.random.default_rng(5)
    edge = [-0.30, -0.26, -0.34, -0.28]  # loss ~ 25 %, its 95 % interval just above 20 %
    near = [list(np.log(0.83) + rng.normal(0, 0.02, 4)) for _ in range(15)]
    loss = pd.DataFrame(
        [row(edge, workload="edge")] + [row(d, workload=f"n{k}") for k, d in enumerate(near)]
    )
    assert loss["decision"].iloc[0] == "material"
    out = selection_columns(loss)
    assert not out["material_listed"].iloc[0] and out["q_material"].iloc[0] > 0.025
    assert selection_columns(loss.iloc[:1])["material_listed"].iloc[0]
    clear = pd.concat([pd.DataFrame([row(D["d"], workload="clear")]), loss], ignore_index=True)
    assert selection_columns(clear)["material_listed"].tolist()[:2] == [True, False]


def test_a_sequential_rows_test_counts_its_looks():
    """A sequential row's interval is at its look level (here K = 5 looks): its one-sided
    p-value is multiplied by K, as its two-sided p_value is."""
    d = [-0.30, -0.26, -0.34, -0.28, -0.29, -0.31]
    fixed = selection_columns(pd.DataFrame([row(d)]))
    looked = selection_columns(pd.DataFrame([row(d, level=0.99, kind="sequential")]))
    assert looked["p_material"].iloc[0] == pytest.approx(5 * fixed["p_material"].iloc[0])
    assert looked["selection_confidence"].iloc[0] == pytest.approx(0.99)


def test_an_increase_is_tested_on_its_own_side():
    """Latency: effect = increase; +80 % is beyond the 50 % margin, -40 % is a gain, not a cost."""
    up = row(list(np.log(1.8) + np.array([0.01, -0.01, 0.02, 0.0])), metric="clat_p99_ns")
    down = row(list(np.log(0.6) + np.array([0.01, -0.01, 0.02, 0.0])), metric="clat_p99_ns")
    out = selection_columns(pd.DataFrame([up, down]))
    assert out["material_listed"].tolist() == [True, False]
    assert out["p_material"].iloc[1] > 0.99
    assert out["largest"].tolist() == [True, False]
