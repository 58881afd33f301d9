"""Paired loss table on constructed data with known ratios, and on real fio output."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from luksbench.analysis import cells, rawloss, stats
from luksbench.formats.layout import Workload

CELLS = [Workload("randread", 4096, 32), Workload("write", 1048576, 1)]


def make_fio(ratio: float = 0.8, reps: int = 6, noise: float = 0.01, seed: int = 1) -> pd.DataFrame:
    """Tidy fio-like table: variant = ratio x baseline x small log-normal noise, per pair."""
    rng = np.random.default_rng(seed)
    rows = []
    for wl in CELLS:
        direction = "read" if "read" in wl.rw else "write"
        for rep in range(1, reps + 1):
            base_bw = 100e6 * rng.uniform(0.7, 1.3)  # pairs differ a lot, the ratio does not
            base_lat = 1e6 * rng.uniform(0.7, 1.3)
            for stack, f in (("plain", 1.0), ("luks", ratio * math.exp(rng.normal(0, noise)))):
                bw = base_bw * f
                rows.append(
                    {
                        "run": "t",
                        "host": "h",
                        "stack": stack,
                        "workload": wl.id,
                        "rep": rep,
                        "job_slot": 0,
                        "job": wl.id,
                        "direction": direction,
                        "rw": wl.rw,
                        "bs_bytes": wl.bs_bytes,
                        "iodepth": wl.iodepth,
                        "io_bytes": int(bw),
                        "bw_bytes": bw,
                        "iops": bw / wl.bs_bytes,
                        "clat_p50_ns": 0.5 * base_lat / f,
                        "clat_p99_ns": base_lat / f,
                        "clat_p999_ns": 2 * base_lat / f,
                        "busy_cpu_s_per_gib": 0.3 / f,
                        "sys_cpu_s_per_gib": 0.1 / f,
                    }
                )
    return pd.DataFrame(rows)


def test_known_ratio_gives_twenty_percent_loss():
    fio = make_fio(ratio=0.8)
    loss = stats.loss_table(fio, "plain", "luks")
    assert list(loss.columns) == stats.LOSS_COLUMNS
    assert len(loss) == len(CELLS) * len([m for m in stats.DEFAULT_METRICS if m in fio])
    for _, row in loss.iterrows():
        assert row["n"] == 6 and row["n_dropped"] == 0
        assert row["verdict"] == "significant"
        assert row["ci_low"] < row["effect_pct"] < row["ci_high"]
        if row["higher_is_better"]:
            assert row["effect"] == "loss" and math.isnan(row["increase_pct"])
            assert row["loss_pct"] == pytest.approx(20, abs=1.5)
            assert row["ci_low"] < 20 < row["ci_high"]
        else:  # latency = 1/0.8 -> +25 %
            assert row["effect"] == "increase" and math.isnan(row["loss_pct"])
            assert row["increase_pct"] == pytest.approx(25, abs=2)
            assert row["ci_low"] < 25 < row["ci_high"]


def test_ci_matches_scipy_paired_t_on_log_ratios():
    fio = make_fio(ratio=0.9, reps=5, noise=0.05, seed=7)
    loss = stats.loss_table(fio, metrics=["bw_bytes"], confidence=0.9)
    row = loss.iloc[0]
    sub = fio[(fio["workload"] == row["workload"])]
    b = sub[sub["stack"] == "plain"].sort_values("rep")["bw_bytes"].to_numpy()
    v = sub[sub["stack"] == "luks"].sort_values("rep")["bw_bytes"].to_numpy()
    d = np.log(v / b)
    lo, hi = sps.t.interval(0.9, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert row["mean_log_ratio"] == pytest.approx(d.mean())
    assert row["sd_log_ratio"] == pytest.approx(d.std(ddof=1))
    assert row["loss_pct"] == pytest.approx(100 * (1 - math.exp(d.mean())))
    # bounds transformed and swapped
    assert row["ci_low"] == pytest.approx(100 * (1 - math.exp(hi)))
    assert row["ci_high"] == pytest.approx(100 * (1 - math.exp(lo)))
    assert row["ratio"] == pytest.approx(math.exp(d.mean()))
    assert row["baseline_mean"] == pytest.approx(b.mean())


def test_no_effect_is_inconclusive():
    loss = stats.loss_table(make_fio(ratio=1.0, noise=0.05, seed=3), metrics=["bw_bytes"])
    assert set(loss["verdict"]) == {"inconclusive"}
    assert ((loss["ci_low"] < 0) & (loss["ci_high"] > 0)).all()


def test_missing_and_nonpositive_pairs_are_dropped_and_counted():
    fio = make_fio(reps=5)
    wl = CELLS[0].id
    # pair 2: variant missing entirely; pair 4: baseline bandwidth 0
    fio = fio[~((fio["workload"] == wl) & (fio["stack"] == "luks") & (fio["rep"] == 2))].copy()
    mask = (fio["workload"] == wl) & (fio["stack"] == "plain") & (fio["rep"] == 4)
    fio.loc[mask, ["bw_bytes", "iops"]] = 0.0
    loss = stats.loss_table(fio)
    cell = loss[loss["workload"] == wl].set_index("metric")
    assert cell.loc["bw_bytes", "n"] == 3 and cell.loc["bw_bytes", "n_dropped"] == 2
    assert cell.loc["iops", "n_dropped"] == 2
    assert cell.loc["clat_p99_ns", "n"] == 4 and cell.loc["clat_p99_ns", "n_dropped"] == 1
    other = loss[loss["workload"] != wl]
    assert (other["n"] == 5).all() and (other["n_dropped"] == 0).all()


def test_single_pair_is_insufficient():
    fio = make_fio(reps=1)
    loss = stats.loss_table(fio)
    assert set(loss["verdict"]) == {"insufficient"}
    assert loss["ci_low"].isna().all() and loss["ci_high"].isna().all()
    assert loss["loss_pct"].notna().sum() == 2 * len(CELLS)  # point estimate still reported


def test_unknown_stack_or_metric_is_an_error():
    fio = make_fio(reps=2)
    with pytest.raises(ValueError, match="'dmcrypt'"):
        stats.loss_table(fio, variant="dmcrypt")
    with pytest.raises(ValueError, match="unknown metric"):
        stats.loss_table(fio, metrics=["speed"])
    with pytest.raises(ValueError, match="confidence"):
        stats.paired_log_ratio_ci(np.array([0.1, 0.2]), confidence=95)


def test_multi_entry_jobs_are_summed_before_pairing():
    """numjobs=4 without group_reporting: four entries per job, throughput adds up."""
    fio = make_fio(reps=3)
    fio4 = pd.concat([fio.assign(bw_bytes=fio["bw_bytes"] / 4, iops=fio["iops"] / 4)] * 4)
    a = stats.loss_table(fio, metrics=["bw_bytes", "clat_p99_ns"])
    b = stats.loss_table(fio4, metrics=["bw_bytes", "clat_p99_ns"])
    pd.testing.assert_series_equal(a["loss_pct"], b["loss_pct"])
    pd.testing.assert_series_equal(a["baseline_mean"], b["baseline_mean"])


def test_inactive_directions_are_not_cells():
    fio = make_fio(reps=3)
    idle = fio.assign(direction="write", bw_bytes=0.0, iops=0.0, io_bytes=0)
    idle = idle[idle["rw"] == "randread"]
    loss = stats.loss_table(pd.concat([fio, idle]))
    assert (loss["n_dropped"] == 0).all()
    assert set(loss[loss["rw"] == "randread"]["direction"]) == {"read"}


def test_loss_table_from_real_fio(external_dir, tmp_path):
    from testkit.raw import build_raw

    raw = build_raw(external_dir, tmp_path / "tumrun")
    loss = rawloss.loss_table_from_raw(
        raw, metrics=["bw_bytes", "iops", "clat_p99_ns", "busy_cpu_s_per_gib"]
    )
    d2 = loss[loss["host"] == "tum-direct2"]
    # 10 jobs, 2 of them randrw (read + write): 12 cells x 4 metrics, 2 pairs each
    assert len(d2) == 12 * 4
    assert (d2["n"] == 2).all() and (d2["n_dropped"] == 0).all()
    vm = loss[loss["host"] == "tum-vm"]
    assert set(vm["verdict"]) == {"insufficient"}
    # the CPU sidecars exist only on tum-direct2
    assert (vm[vm["metric"] == "busy_cpu_s_per_gib"]["n_dropped"] == 1).all()
    # dm-crypt costs ~23 % of 4k QD1 random-read bandwidth in both VMs (828 vs 1082 MB, 712 vs 925 MB)
    qd1 = d2[(d2["metric"] == "bw_bytes") & (d2["rw"] == "randread") & (d2["iodepth"] == 1)].iloc[0]
    assert 15 < qd1["loss_pct"] < 30
    assert qd1["ci_low"] < qd1["loss_pct"] < qd1["ci_high"]


# ------------------------------------------------------------------------- patterns, comparisons


def _two_pattern_frame() -> pd.DataFrame:
    """One cell measured twice, in the main matrix and as pattern ``sync``: same rw, bs and
    iodepth; luks costs 10 % in the first and 50 % in the second."""
    from simulate import fio_frame

    lb = np.log(np.array([[100.0, 110.0, 90.0], [100.0, 110.0, 90.0]]))
    lv = lb + np.log(np.array([[0.9], [0.5]]))
    df = fio_frame(lb, lv)
    df["workload"] = df["iodepth"].map({1: "randread-4k-qd1", 2: "randread-4k-qd1-sync"})
    df["iodepth"] = 1
    return df


def test_cells_that_differ_only_by_pattern_are_kept_apart():
    df = _two_pattern_frame()
    assert "pattern" not in df  # a table ingested before patterns: read from the workload ids
    loss = stats.loss_table(df, "plain", "luks", metrics=["bw_bytes"])
    by = loss.set_index("pattern")
    assert list(loss["pattern"]) == ["", "sync"]
    assert by.loc["", "effect_pct"] == pytest.approx(10.0)
    assert by.loc["sync", "effect_pct"] == pytest.approx(50.0)
    assert (by["n"] == 3).all()
    # an ingested pattern column is used as it is
    assert cells.with_pattern(df.assign(pattern="x"))["pattern"].eq("x").all()
    assert cells.pattern_of("randwrite-1g-qd1-largeblock") == "largeblock"
    assert cells.pattern_of("randwrite-1g-qd1") == cells.pattern_of("c00001") == ""


def test_loss_tables_keep_each_comparison_its_own_family():
    df = _two_pattern_frame()
    other = df[df["stack"] == "luks"].assign(stack="luks2")
    other["bw_bytes"] = other["bw_bytes"] * 0.99
    df = pd.concat([df, other], ignore_index=True)
    pairs = [("plain", "luks2"), ("luks", "luks2")]
    both = stats.loss_tables(df, pairs, ["bw_bytes"])
    assert list(dict.fromkeys(zip(both["baseline"], both["variant"], strict=True))) == pairs
    for baseline, variant in pairs:
        alone = stats.loss_table(df, baseline, variant, ["bw_bytes"])
        rows = both[(both["baseline"] == baseline) & (both["variant"] == variant)]
        assert rows["q_value"].tolist() == pytest.approx(alone["q_value"].tolist())
    with pytest.raises(ValueError, match="no comparisons"):
        stats.loss_tables(df, [], ["bw_bytes"])
