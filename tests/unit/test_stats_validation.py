"""Validation of the statistics: coverage by simulation (fixed and adaptive design), and each new
piece (p/q-values, equivalence, Fieller, bootstrap, outliers, Stein targets) against its definition.

Simulations are seeded and vectorised (a few seconds); the simulated truth is the ratio put in.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from simulate import covered, fio_frame, simulate_logs, two_stage

from luksbench.analysis import design as adaptive
from luksbench.analysis import ingest, rawloss, stats

N_CELLS = 2000
REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------- coverage


def test_fixed_design_95_percent_intervals_cover_the_truth():
    """6 counterbalanced pairs per cell, shared drift between pairs, an order trend inside pairs."""
    rng = np.random.default_rng(20231124)
    sigma = rng.uniform(0.005, 0.15, N_CELLS)
    log_ratio = np.log(rng.uniform(0.5, 1.05, N_CELLS))
    lb, lv = simulate_logs(rng, N_CELLS, 6, sigma, log_ratio)
    loss = stats.loss_table(fio_frame(lb, lv), metrics=["bw_bytes"])
    assert len(loss) == N_CELLS and (loss["n"] == 6).all()
    coverage = covered(loss, log_ratio).mean()
    assert 0.93 <= coverage <= 0.97, coverage

    # The check has teeth: a normal (z) interval on the same pairs is too narrow at n = 6.
    loss = loss.sort_values("workload")
    half = 1.959964 * loss["sd_log_ratio"] / np.sqrt(loss["n"])
    lo, hi = loss["mean_log_ratio"] - half, loss["mean_log_ratio"] + half
    z_coverage = ((lo <= log_ratio) & (log_ratio <= hi)).mean()
    assert z_coverage < 0.93, z_coverage


def test_adaptive_two_stage_intervals_cover_the_truth_and_reach_the_target():
    """Pilot 4 pairs, Stein targets from the pilot alone (target +-2 points), cap 12."""
    rng = np.random.default_rng(4)
    sigma = rng.uniform(0.002, 0.05, N_CELLS)
    log_ratio = np.log(rng.uniform(0.5, 1.05, N_CELLS))
    fio, pairs, capped = two_stage(rng, N_CELLS, sigma, log_ratio)
    assert 0.1 < capped.mean() < 0.9 and len(set(pairs)) > 3  # the rule really adapts here
    loss = stats.loss_table(fio, metrics=["bw_bytes"]).sort_values("workload")
    assert (loss["n"].to_numpy() == pairs).all()
    assert (loss["noisy"].to_numpy() == capped).all()
    assert (loss["target_pairs"].to_numpy() == pairs).all()
    assert (loss["interval"] == "stein").all()
    hit = covered(loss, log_ratio)
    assert 0.94 <= hit.mean() <= 0.96, hit.mean()
    # Stein's interval is t_{n0-1} s0 / sqrt(N) with N >= (t s0 / h)^2: every cell below the cap
    # reaches the target width h = ln(1.02) on the log scale (2 points at zero effect)
    half = (np.log1p(-loss["ci_low"] / 100) - np.log1p(-loss["ci_high"] / 100)) / 2
    assert (half.to_numpy()[~capped] <= stats.half_width_log(2.0) + 1e-12).all()
    assert (half.to_numpy()[capped] > stats.half_width_log(2.0)).mean() > 0.9


# --------------------------------------------------------------------------- p, q and verdicts


def test_p_values_are_the_paired_t_test_and_q_values_bh():
    rng = np.random.default_rng(3)
    log_ratio = np.log(rng.choice([0.9, 1.0], 40))
    lb, lv = simulate_logs(rng, 40, 5, np.full(40, 0.05), log_ratio)
    loss = stats.loss_table(fio_frame(lb, lv), metrics=["bw_bytes"]).sort_values("workload")
    expected_p = sps.ttest_1samp(lv - lb, 0.0, axis=1).pvalue
    np.testing.assert_allclose(loss["p_value"], expected_p, rtol=1e-9)
    np.testing.assert_allclose(
        loss["q_value"], sps.false_discovery_control(expected_p, method="bh"), rtol=1e-9
    )
    sig = loss["verdict"] == "significant"
    assert (sig == (loss["q_value"] <= 0.05)).all()
    # BH is stricter than the marginal test: some rows with p < 0.05 are not significant here
    assert ((loss["p_value"] < 0.05) & ~sig).any()
    assert ((loss.loc[sig, "ci_low"] > 0) | (loss.loc[sig, "ci_high"] < 0)).all()


def test_equivalent_when_the_90_percent_interval_is_inside_the_margin():
    rng = np.random.default_rng(5)
    lb, lv = simulate_logs(rng, 3, 10, np.array([0.002, 0.002, 0.2]), np.log([1.0, 0.9, 1.0]))
    fio = fio_frame(lb, lv)
    loss = stats.loss_table(fio, metrics=["bw_bytes"]).sort_values("workload")
    assert list(loss["verdict"]) == ["equivalent", "significant", "inconclusive"]
    row = loss.iloc[0]
    d = (lv - lb)[0]
    lo, hi = sps.t.interval(0.90, 9, loc=d.mean(), scale=sps.sem(d))
    assert row["equiv_low"] == pytest.approx(100 * (1 - math.exp(hi)))
    assert row["equiv_high"] == pytest.approx(100 * (1 - math.exp(lo)))
    assert -2 < row["equiv_low"] < row["equiv_high"] < 2 and row["equivalent"]
    tight = stats.loss_table(fio, metrics=["bw_bytes"], equivalence_margin_pct=0.01)
    assert (tight["verdict"] != "equivalent").all()


def test_insufficient_with_one_pair():
    loss = stats.loss_table(fio_frame(np.zeros((2, 1)), np.ones((2, 1))), metrics=["bw_bytes"])
    assert (loss["verdict"] == "insufficient").all()
    assert loss["p_value"].isna().all() and loss["q_value"].isna().all()


# ------------------------------------------------------------------------ Fieller and bootstrap


def test_fieller_interval_is_the_inverted_paired_test():
    rng = np.random.default_rng(6)
    b = rng.normal(100, 10, 8)
    v = 0.8 * b + rng.normal(0, 4, 8)
    lo, hi = stats.fieller_ratio_ci(b, v, 0.95)
    assert lo < v.mean() / b.mean() < hi
    t = sps.t.ppf(0.975, 7)
    for theta in np.linspace(lo - 0.05, hi + 0.05, 201):
        z = v - theta * b
        inside = abs(z.mean()) <= t * z.std(ddof=1) / math.sqrt(8) + 1e-12
        assert inside == (lo - 1e-9 <= theta <= hi + 1e-9), theta


def test_fieller_is_nan_when_unbounded():
    b = np.array([1.0, -1.0, 2.0, -1.5])  # baseline mean not significantly different from 0
    assert all(math.isnan(x) for x in stats.fieller_ratio_ci(b, b * 0.8, 0.95))


def test_fieller_columns_in_loss_units_agree_with_the_t_interval():
    rng = np.random.default_rng(7)
    lb, lv = simulate_logs(rng, 1, 8, np.array([0.03]), np.log([0.7]))
    row = stats.loss_table(fio_frame(lb, lv), metrics=["bw_bytes"]).iloc[0]
    ratio_of_means = np.exp(lv).mean() / np.exp(lb).mean()
    assert row["fieller_low"] < 100 * (1 - ratio_of_means) < row["fieller_high"]
    assert (
        abs(row["fieller_low"] - row["ci_low"]) < 3
        and abs(row["fieller_high"] - row["ci_high"]) < 3
    )


def test_bootstrap_only_from_twenty_pairs_and_close_to_t():
    rng = np.random.default_rng(8)
    lb, lv = simulate_logs(rng, 2, 25, np.array([0.05, 0.05]), np.log([0.8, 0.8]))
    few = stats.loss_table(fio_frame(lb[:, :19], lv[:, :19]), metrics=["bw_bytes"])
    assert few["boot_low"].isna().all() and few["boot_high"].isna().all()
    many = stats.loss_table(fio_frame(lb, lv), metrics=["bw_bytes"])
    assert many["boot_low"].notna().all()
    for _, row in many.iterrows():
        assert row["boot_low"] < row["effect_pct"] < row["boot_high"]
        assert abs(row["boot_low"] - row["ci_low"]) < 1.5
        assert abs(row["boot_high"] - row["ci_high"]) < 1.5
    again = stats.loss_table(fio_frame(lb, lv), metrics=["bw_bytes"])
    pd.testing.assert_series_equal(many["boot_low"], again["boot_low"])  # seeded


# ----------------------------------------------------------------------------------- outliers


def test_an_outlier_pair_is_flagged_kept_and_can_be_excluded():
    rng = np.random.default_rng(9)
    lb, lv = simulate_logs(rng, 1, 10, np.array([0.01]), np.log([0.8]))
    lv[0, 6] += 0.7  # pair 7: the variant run was twice as fast (a cache hit, say)
    fio = fio_frame(lb, lv)
    kept = stats.loss_table(fio, metrics=["bw_bytes"]).iloc[0]
    assert kept["n"] == 10 and kept["n_outliers"] == 1 and kept["outlier_reps"] == "7"
    assert not kept["outliers_excluded"]
    out = stats.loss_table(fio, metrics=["bw_bytes"], exclude_outliers=True).iloc[0]
    assert out["n"] == 9 and out["n_outliers"] == 1 and out["outliers_excluded"]
    assert abs(out["loss_pct"] - 20) < abs(kept["loss_pct"] - 20)
    assert out["ci_low"] < 20 < out["ci_high"]
    assert out["ci_high"] - out["ci_low"] < kept["ci_high"] - kept["ci_low"]


def test_fio_error_and_unattained_steady_state_leave_their_pair_out():
    """Whatever exclude_outliers says: a pair fio flagged is no measurement of the cell."""
    rng = np.random.default_rng(10)
    lb, lv = simulate_logs(rng, 1, 4, np.array([0.01]), np.log([0.8]))
    fio = fio_frame(lb, lv).assign(error=0, ss_attained=np.nan)
    fio.loc[(fio["stack"] == "luks") & (fio["rep"] == 2), "ss_attained"] = 0
    fio.loc[(fio["stack"] == "plain") & (fio["rep"] == 3), "error"] = 5
    fio.loc[fio["rep"].isin([2, 3]) & (fio["stack"] == "luks"), "bw_bytes"] /= 2  # far off
    clean = stats.loss_table(fio[~fio["rep"].isin([2, 3])], metrics=["bw_bytes"]).iloc[0]
    for exclude in (False, True):
        row = stats.loss_table(fio, metrics=["bw_bytes"], exclude_outliers=exclude).iloc[0]
        assert row["n"] == 2 and row["n_fio_error"] == 1 and row["n_ss_not_attained"] == 1
        assert row["n_outliers"] == 0 and row["loss_pct"] == clean["loss_pct"]


def test_modified_z_small_cells_are_not_flagged():
    d = np.array([0.0, 0.01, 0.5])  # looks wild, but three pairs say nothing about outliers
    assert not stats.flag_outliers(d).any()
    assert abs(stats.modified_z(np.array([1, 2, 3, 4, 100.0]))[-1]) > 3.5


# ------------------------------------------------------------------------------ adaptive rule


def test_half_width_on_the_log_scale():
    h = stats.half_width_log(2)
    assert h == pytest.approx(math.log(1.02))
    assert 100 * (math.exp(h) - 1) == pytest.approx(2.0)  # no side of the interval exceeds 2 points
    assert 100 * (1 - math.exp(-h)) < 2.0


def test_stein_pairs():
    h = math.log(1.02)
    t = sps.t.ppf(0.975, 3)
    s = 0.02
    pairs, required, capped = stats.stein_pairs(s, 4, 2.0, 12)
    assert required == pytest.approx((t * s / h) ** 2)
    assert pairs == max(4, math.ceil(required)) and not capped
    assert stats.stein_pairs(0.0, 4, 2.0, 12)[0] == 4
    assert stats.stein_pairs(0.2, 4, 2.0, 12)[:1] + stats.stein_pairs(0.2, 4, 2.0, 12)[2:] == (
        12,
        True,
    )
    assert stats.stein_pairs(math.nan, 4, 2.0, 12)[0] == 12
    with pytest.raises(ValueError, match="max_pairs"):
        stats.stein_pairs(0.1, 4, 2.0, 3)


def test_pilot_targets_look_only_at_the_pilot():
    rng = np.random.default_rng(11)
    sigma = np.array([0.001, 0.01, 0.2])
    lb, lv = simulate_logs(rng, 3, 12, sigma, np.log([0.8, 0.8, 0.8]))
    doc = adaptive.pilot_targets(fio_frame(lb, lv), "plain", ["luks"], pilot_pairs=4)["sim"]
    sd = (lv - lb)[:, :4].std(axis=1, ddof=1)
    expected = stats.stein_pairs(sd, 4, 2.0, 12)[0]
    assert list(doc["pairs"].values()) == list(expected)
    assert doc["noisy"] == ["c00002"] and doc["pairs"]["c00000"] == 4
    lv[:, 4:] += rng.normal(0, 1, (3, 8))  # later pairs must not change the decision
    again = adaptive.pilot_targets(fio_frame(lb, lv), "plain", ["luks"], pilot_pairs=4)["sim"]
    assert again["pairs"] == doc["pairs"]
    # an incomplete pilot asks for the cap
    short = adaptive.pilot_targets(
        fio_frame(lb, lv, np.array([3, 4, 4])), "plain", ["luks"], pilot_pairs=4
    )["sim"]
    assert short["pairs"]["c00000"] == 12 and "c00000" in short["noisy"]
    # so does a pilot with a pair fio flagged: the loss table leaves that pair out
    fio = fio_frame(lb, lv).assign(ss_attained=np.nan)
    fio.loc[(fio["workload"] == "c00000") & (fio["rep"] == 2), "ss_attained"] = 0
    flagged = adaptive.pilot_targets(fio, "plain", ["luks"], pilot_pairs=4)["sim"]
    assert flagged["pairs"]["c00000"] == 12 and "c00000" in flagged["noisy"]
    assert flagged["pairs"]["c00001"] == doc["pairs"]["c00001"]


def test_ingest_carries_targets_into_the_loss_table(tmp_path):
    raw = tmp_path / "sample"
    shutil.copytree(REPO / "data" / "raw" / "sample", raw)
    host = next(p for p in raw.iterdir() if p.is_dir())
    doc = {"pairs": {"randread-4k-qd1": 12, "write-1m-qd32": 5}, "noisy": ["randread-4k-qd1"]}
    targets = host / "fio" / "targets.json"
    targets.write_text(json.dumps(doc))
    loss = rawloss.loss_table_from_raw(raw, metrics=["bw_bytes"]).set_index("workload")
    assert (
        loss.loc["randread-4k-qd1", "noisy"] and loss.loc["randread-4k-qd1", "target_pairs"] == 12
    )
    assert not loss.loc["write-1m-qd32", "noisy"] and loss.loc["write-1m-qd32", "target_pairs"] == 5
    assert (
        math.isnan(loss.loc["read-4k-qd1", "target_pairs"]) and not loss.loc["read-4k-qd1", "noisy"]
    )
    targets.write_text('{"pairs": {"read-4k-qd1": 0}}')
    with pytest.raises(ingest.IngestError, match=r"targets\.json"):
        ingest.fio_table(raw)
