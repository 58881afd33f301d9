"""What the loss table's certainty is worth, validated end to end: simulated raw runs in the raw
layout (fio JSON files), ``luksbench targets`` and ``luksbench loss`` run as commands, coverage and
decisions counted against the truth put in. Seeded; docs/statistics.md quotes
the figures these tests produce.

The simulated pairs drift from pair to pair (both arms alike) and carry no order effect inside
a pair (the balanced schedule is tested on its own). Monte-Carlo error: a coverage estimated from n cells has a standard error of
sqrt(0.95 * 0.05 / n): 0.34 points at n = 4000, 0.49 at 2000.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from simulate import (
    BOUNDARIES,
    covers,
    fio_frame,
    loss_csv,
    luksbench,
    simulate_logs,
    two_stage,
    write_raw_reps,
    wrong_decision,
)

from luksbench.analysis import stats
from luksbench.analysis.loss import write_loss

# -------------------------------------------------------------------------------- fixed design


@pytest.mark.slow
def test_fixed_design_coverage_and_decisions_at_the_boundaries(tmp_path):
    """4000 cells (200 workloads x 20 jobs), 6 counterbalanced pairs with drift, true losses just
    either side of each boundary of the throughput regions (+-5, +-20 %)."""
    rng = np.random.default_rng(1515)
    workloads, jobs, pairs = 200, 20, 6
    cells = workloads * jobs
    sigma = rng.uniform(0.005, 0.05, cells)
    true_loss = rng.choice(BOUNDARIES, cells) + rng.choice([-1e-3, 1e-3], cells)
    lb, lv = simulate_logs(rng, cells, pairs, sigma, np.log1p(-true_loss / 100), order_drift=0)
    raw = tmp_path / "fixed"
    write_raw_reps(
        raw, {"plain": lb + 18, "luks": lv + 18}, [range(1, pairs + 1)] * workloads, jobs
    )

    bw = loss_csv(raw, "--metric", "bw_bytes")
    assert len(bw) == cells and (bw["n"] == pairs).all() and (bw["interval"] == "t").all()
    coverage = covers(bw, true_loss).mean()
    assert 0.94 <= coverage <= 0.96, coverage
    # Decision error: a decided region without the truth. Wholly inside a region means the
    # interval missed the truth on one side: at most 1 - coverage, about 2.5 % at a boundary.
    wrong = wrong_decision(bw["decision"], true_loss)
    for boundary in BOUNDARIES:
        near = np.abs(true_loss - boundary) < 0.01
        assert wrong[near].mean() <= 0.05, (boundary, wrong[near].mean())
    assert bw["decision"].str.startswith("undecided: straddles").any()
    assert set(bw["decision"]) >= {"negligible", "moderate", "material", "moderate gain"}

    # one family per metric: bandwidth's q-values, verdicts and decisions are the same when
    # every default metric is computed beside it
    every = loss_csv(raw)
    assert set(every["metric"]) > {"bw_bytes", "iops", "clat_p50_ns"}
    alone = every[every["metric"] == "bw_bytes"].reset_index(drop=True)
    for column in ("q_value", "verdict", "decision"):
        pd.testing.assert_series_equal(alone[column], bw[column], check_exact=False)
    iops = every[every["metric"] == "iops"]
    assert (iops["derived_from"] == "bw_bytes").all()
    per_io = every[every["metric"] == "busy_cpu_us_per_io"]
    assert (per_io["derived_from"] == "busy_cpu_s_per_gib").all()
    own = ~every["metric"].isin(["iops", "busy_cpu_us_per_io"])
    assert every.loc[own, "derived_from"].isna().all()


@pytest.mark.slow
def test_fixed_design_three_pairs_coverage(tmp_path):
    """The default run's design: 3 pairs per cell (4000 cells: 100 workloads x 40 jobs)."""
    rng = np.random.default_rng(3)
    workloads, jobs, pairs = 100, 40, 3
    cells = workloads * jobs
    true_loss = rng.uniform(-10, 60, cells)
    sigma = rng.uniform(0.005, 0.1, cells)
    lb, lv = simulate_logs(rng, cells, pairs, sigma, np.log1p(-true_loss / 100), order_drift=0)
    raw = tmp_path / "fixed3"
    write_raw_reps(
        raw, {"plain": lb + 18, "luks": lv + 18}, [range(1, pairs + 1)] * workloads, jobs
    )
    coverage = covers(loss_csv(raw, "--metric", "bw_bytes"), true_loss).mean()
    assert 0.94 <= coverage <= 0.96, coverage


# ----------------------------------------------------------------------------- adaptive design


def adaptive_run(tmp_path, rng, name, sigma, jobs, n0=4, cap=12):
    """Pilot (n0 pairs) written, ``luksbench targets`` into the run's targets.json, each workload
    topped up to its target, ``luksbench loss``. Returns (loss rows, true loss, targets doc)."""
    cells = sigma.size
    workloads = cells // jobs
    true_loss = rng.uniform(-10, 60, cells)
    lb, lv = simulate_logs(rng, cells, cap, sigma, np.log1p(-true_loss / 100), order_drift=0)
    raw = tmp_path / name
    logs = {"plain": lb + 18, "luks": lv + 18}
    write_raw_reps(raw, logs, [range(1, n0 + 1)] * workloads, jobs)
    targets = raw / "sim" / "fio" / "targets.json"
    luksbench(
        *("targets", raw, "--host", "sim", "--baseline", "plain", "--variant", "luks"),
        *("--pilot-pairs", n0, "--target-half-width", 2, "--max-pairs", cap, "--out", targets),
    )
    doc = json.loads(targets.read_text())
    pairs = [doc["pairs"][f"randread-4k-qd{w + 1}"] for w in range(workloads)]
    write_raw_reps(raw, logs, [range(1, n + 1) for n in pairs], jobs)
    loss = loss_csv(raw, "--metric", "bw_bytes")
    assert (loss["n"].to_numpy() == np.repeat(pairs, jobs)).all()
    assert (loss["interval"] == "stein").all() and (loss["pilot_pairs"] == n0).all()
    return loss, true_loss, doc


@pytest.mark.slow
def test_adaptive_design_coverage_capped_and_uncapped(tmp_path):
    """Stein's interval on adaptive cells, through targets.json: a quiet run (4000 cells, each arm's
    noise sd 0.002-0.007: the rule chooses 4 to 12 pairs) and a noisy one (2000 cells, sd 0.1-0.3:
    cells stop at the cap); coverage of the cells below the cap and at the cap, separately."""
    rng = np.random.default_rng(2024)
    quiet, q_true, q_doc = adaptive_run(
        tmp_path, rng, "quiet", rng.uniform(0.002, 0.007, 4000), jobs=10
    )
    noisy, n_true, _ = adaptive_run(tmp_path, rng, "noisy", rng.uniform(0.1, 0.3, 2000), jobs=20)
    assert len(set(q_doc["pairs"].values())) >= 3  # the rule adapts
    assert q_doc["pilot_pairs"] == 4 and q_doc["confidence"] == 0.95
    assert all(c["pilot_sd_log_ratio"] > 0 for c in q_doc["cells"].values())
    loss = pd.concat([quiet, noisy], ignore_index=True)
    hit = covers(loss, np.concatenate([q_true, n_true]))
    capped = loss["noisy"].to_numpy(bool)
    assert (~capped).sum() > 3500 and capped.sum() > 1500
    assert 0.94 <= hit[~capped].mean() <= 0.96, hit[~capped].mean()
    assert 0.94 <= hit[capped].mean() <= 0.96, hit[capped].mean()
    # Stein's interval rests on the pilot's SD: cells below the cap come out within the target
    half = ((loss["ci_high"] - loss["ci_low"]) / 2).to_numpy()
    assert (half[~capped] <= 2.0).mean() > 0.95


@pytest.mark.slow
def test_stein_keeps_coverage_where_the_final_sd_does_not():
    """One job per cell, each arm's noise sd 0.02-0.03 (sd of d 0.028-0.042, near the cap's
    threshold of 0.022): the pilot's SD decides both where a cell stops and, with the final SD,
    how wide its interval is. Over all cells Stein's interval keeps
    95 %; the final-sample t-interval does not. Conditional on where a cell stopped no interval
    that rests on the pilot's SD can: below the cap Stein's covers less, at the cap more (docs/statistics.md)."""
    rng = np.random.default_rng(77)
    cells, n0, cap = 4000, 4, 12
    sigma = rng.uniform(0.02, 0.03, cells)
    true_loss = rng.uniform(-10, 60, cells)
    lb, lv = simulate_logs(rng, cells, cap, sigma, np.log1p(-true_loss / 100), order_drift=0)
    sd0 = (lv - lb)[:, :n0].std(axis=1, ddof=1)
    pairs, _, capped = stats.stein_pairs(sd0, n0, 2.0, cap)
    fio = fio_frame(lb, lv, pairs, capped=capped).assign(pilot_pairs=float(n0))
    stein = covers(stats.loss_table(fio, metrics=["bw_bytes"]).sort_values("iodepth"), true_loss)
    final = covers(
        stats.loss_table(fio.drop(columns="pilot_pairs"), metrics=["bw_bytes"]).sort_values(
            "iodepth"
        ),
        true_loss,
    )
    assert 0.94 <= stein.mean() <= 0.96, stein.mean()
    assert final.mean() < 0.935, final.mean()
    assert stein[~capped].mean() < 0.93 and stein[capped].mean() > 0.97


# ------------------------------------------------------------------- decisions, Fieller, targets


def test_decision_regions():
    lower, upper = stats.DEFAULT_DECISION_REGIONS["throughput"]
    assert (lower, upper) == (5, 20)
    assert stats.DEFAULT_DECISION_REGIONS["latency"] == stats.DEFAULT_DECISION_REGIONS["cpu"]
    cases = {
        (0.2, 1.0): "negligible",  # a tight 0.6 % loss: negligible, whatever its p-value
        (-4.9, 4.9): "negligible",
        (6.0, 19.0): "moderate",
        (5.0, 20.0): "moderate",
        (21.0, 60.0): "material",
        (-19.0, -6.0): "moderate gain",
        (-40.0, -25.0): "material gain",
        (3.0, 7.0): "undecided: straddles 5 %",
        (-8.0, 30.0): "undecided: straddles -5 %, 5 %, 20 %",
        (math.nan, math.nan): "insufficient",
    }
    for (low, high), want in cases.items():
        assert stats.decision(low, high, lower, upper) == want, (low, high)
    assert stats.check_regions({"latency": {"lower_pct": 1, "upper_pct": 2}})["latency"] == (1, 2)
    for bad in ({"latency": (5, 5)}, {"disk": (1, 2)}):
        with pytest.raises(ValueError, match="decision_regions"):
            stats.check_regions(bad)


def test_decision_per_metric_family_in_the_table():
    rng = np.random.default_rng(12)
    lb, lv = simulate_logs(rng, 1, 10, np.array([0.002]), np.log([0.93]), order_drift=0)
    fio = fio_frame(lb, lv).assign(clat_mean_ns=lambda f: 1e12 / f["bw_bytes"])
    loss = stats.loss_table(fio, metrics=["bw_bytes", "clat_mean_ns"]).set_index("metric")
    # a 7 % loss is a moderate throughput loss; the 7.5 % latency increase is negligible (10 %)
    assert loss.loc["bw_bytes", "decision"] == "moderate"
    assert loss.loc["clat_mean_ns", "decision"] == "negligible"
    wider = stats.loss_table(
        fio, metrics=["bw_bytes"], decision_regions={"throughput": (10, 30)}
    ).iloc[0]
    assert wider["decision"] == "negligible" and wider["verdict"] == "significant"


def test_fieller_bounds_stay_possible():
    """A ratio of two positive means is >= 0: the lower bound is clipped there, not -20 %."""
    b, v = np.array([1, 1.2, 0.9, 1.1]), np.array([0.01, 0.5, 0.02, 0.4])
    low, high = stats.fieller_ratio_ci(b, v)
    assert low == 0 and 0 < high < 1
    lb, lv = np.log(b)[None, :], np.log(v)[None, :]
    row = stats.loss_table(fio_frame(lb, lv), metrics=["bw_bytes"]).iloc[0]
    assert row["fieller_high"] == 100  # a loss of at most 100 %
    lat = stats.loss_table(
        fio_frame(-lb, -lv).rename(columns={"bw_bytes": "clat_mean_ns"}), metrics=["clat_mean_ns"]
    ).iloc[0]
    assert lat["fieller_low"] >= -100


def test_targets_file_carries_what_steins_interval_needs(tmp_path):
    from luksbench.formats.targets import TargetsError, read_targets

    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"pairs": {"a": 6, "b": 12}, "noisy": ["b"], "pilot_pairs": 4}))
    assert read_targets(path) == {"a": (6, False, 4, None), "b": (12, True, 4, None)}
    path.write_text(json.dumps({"pairs": {"a": 6}, "pilot_pairs": 1}))
    with pytest.raises(TargetsError, match="pilot_pairs"):
        read_targets(path)


def test_adaptive_cell_with_unusable_pilot_pairs_keeps_steins_interval(tmp_path):
    """A pilot pair of the metric unusable (a value withheld): Stein's interval on the usable
    pilot pairs (their SD, their count - 1 degrees of freedom), never the t-interval of the
    final sample after a pilot-chosen N; with fewer than two usable pilot pairs, no interval."""
    rng = np.random.default_rng(15)
    fio, pairs, _ = two_stage(rng, 3, np.full(3, 0.02), np.zeros(3))
    luks = fio["stack"].eq("luks")
    fio.loc[luks & fio["workload"].eq("c00000") & fio["rep"].eq(2), "bw_bytes"] = math.nan
    fio.loc[luks & fio["workload"].eq("c00001") & fio["rep"].isin([1, 2, 3]), "bw_bytes"] = 0
    loss = stats.loss_table(fio, metrics=["bw_bytes"]).set_index("workload")
    one = loss.loc["c00000"]
    pilot = fio[fio["workload"].eq("c00000") & fio["rep"].isin([1, 3, 4])]
    d = np.log(pilot[pilot["stack"].eq("luks")]["bw_bytes"].to_numpy()) - np.log(
        pilot[pilot["stack"].eq("plain")]["bw_bytes"].to_numpy()
    )
    half = stats._t_quantile(0.95, 2) * d.std(ddof=1) / math.sqrt(pairs[0] - 1)
    assert one["interval"] == "stein" and one["n"] == pairs[0] - 1
    assert one["pilot_sd_log_ratio"] == pytest.approx(d.std(ddof=1))
    low = 100 * (1 - math.exp(one["mean_log_ratio"] + half))
    assert one["ci_low"] == pytest.approx(low)
    two = loss.loc["c00001"]
    assert two["interval"] == "none" and two["n"] >= 2
    assert two["verdict"] == "insufficient" and two["decision"] == "insufficient"
    assert math.isnan(two["ci_low"]) and math.isnan(two["p_value"])
    assert loss.loc["c00002", "interval"] == "stein"
    fio.to_parquet(tmp_path / "fio.parquet")
    written, _ = write_loss(tmp_path, metrics=["bw_bytes"])
    assert written.set_index("workload")["note"].to_dict() == {
        "c00000": "",
        "c00001": stats.NO_PILOT_NOTE,
        "c00002": "",
    }
    # a pilot without an SD ran the cap whatever the data: the t-interval
    fixed = stats.loss_table(fio.assign(pilot_pairs=math.nan), metrics=["bw_bytes"])
    assert (fixed["interval"] == "t").all() and fixed["ci_low"].notna().all()


def test_targets_without_a_pilot_sd_name_no_pilot(tmp_path):
    from luksbench.formats.targets import read_targets

    path = tmp_path / "targets.json"
    cells = {"a": {"pilot_sd_log_ratio": 0.01}, "b": {"pilot_sd_log_ratio": None}}
    doc = {"pairs": {"a": 6, "b": 12, "c": 12}, "pilot_pairs": 4, "cells": cells}
    path.write_text(json.dumps(doc))
    assert read_targets(path) == {
        "a": (6, False, 4, None),
        "b": (12, False, None, None),
        "c": (12, False, None, None),
    }
