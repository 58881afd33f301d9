"""The tune-dmcrypt study's pieces: high_priority skipped with its reason where the kernel or
cryptsetup lack it, the ranking of the tuning arms (tuning.parquet), and the VM case that
builds every arm of the study."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from simulate import loss_row as simulated_row

from luksbench.analysis import stats
from luksbench.analysis.ingest_tables import plan_frames, stack_frames
from luksbench.analysis.tuning import (
    TUNING_COLUMNS,
    family_decisions,
    settings,
    tuning_table,
    unapplied,
)
from luksbench.testbox.backends.kernel import usable_perf_flags
from luksbench.testbox.planbuild import PERF_FLAGS

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "config" / "studies" / "tune-dmcrypt.yaml"


def test_high_priority_is_skipped_with_the_reason_where_kernel_or_cryptsetup_lack_it():
    assert "high_priority" in PERF_FLAGS
    every = set(PERF_FLAGS)
    # kernel 6.9 (dm-crypt 1.25): the flag came with 1.26 (kernel 6.10)
    applied, skipped = usable_perf_flags(["high_priority", "no_read_workqueue"], every, (1, 25, 0))
    assert applied == ["no_read_workqueue"]
    assert skipped == {
        "high_priority": "dm-crypt target v1.25.0 is older than v1.26.0, which brought high_priority"
    }
    # cryptsetup 2.6 has no --perf-high_priority, whatever the kernel
    applied, skipped = usable_perf_flags(["high_priority"], every - {"high_priority"}, (1, 28, 0))
    assert applied == [] and "no --perf-high_priority" in skipped["high_priority"]
    assert usable_perf_flags(["high_priority"], every, (1, 26, 0)) == (["high_priority"], {})


HOST = "box"
FULL, AT_RATE = (
    ("randread-4k-qd1", "", "read"),
    ("randwrite-4k-qd32-equalload", "equalload", "write"),
)
TPUT, CPU = "bw_bytes", "busy_cpu_us_per_io"
#: log ratios d = ln(setting / luks) of 5 pairs: throughput higher is better, CPU lower
GAIN = [0.30, 0.31, 0.29, 0.305, 0.295]  # about 35 % faster: a material gain
NEAR_GAIN = [0.05, 0.06, 0.07, 0.055, 0.065]  # a moderate gain at 95 %, not once adjusted
FLAT = [0.001, -0.001, 0.002, 0.0, -0.002]
COST = [0.60, 0.62, 0.58, 0.61, 0.59]  # CPU per I/O about 80 % higher: a material cost


def loss_row(baseline, variant, cell, metric, d, level=0.95, kind="t", pilot=None, n=None):
    """A loss-table row of d as :mod:`luksbench.analysis.stats` computes it."""
    workload, pattern, direction = cell
    cell_columns = {"host": HOST, "workload": workload, "pattern": pattern, "direction": direction}
    return {
        **simulated_row(
            d, metric, level, kind, pilot, n, **cell_columns, baseline=baseline, variant=variant
        ),
        "fio_bound": False,
        "cpu_saturated": False,
    }


def kernel_luks(flags, in_table, skipped=None, sector=512):
    """A kernel-backend description of a luks stack: the flags cryptsetup applied, those of them
    the dm table shows, the flags skipped with the reason."""
    table = " ".join(
        ["0 1048576 crypt aes-xts-plain64 :64:logon:cryptsetup:x 0 7:1 32768", *in_table]
    )
    layer = {"kind": "luks", "perf_flags_applied": flags, "perf_flags_skipped": skipped or {}}
    layer |= {"dm_table": table, "over": {"kind": "raw"}}
    return {"kind": "luks", "perf_flags": flags, "sector_size": sector, "layers": layer}


#: setting -> (d of throughput at full speed, d of CPU per I/O at equal load, plan, description)
SETTINGS = {
    "fast": (GAIN, FLAT, {"perf_flags": ["no_read_workqueue"]}, ["no_read_workqueue"] * 2),
    "lucky": (NEAR_GAIN, FLAT, {}, None),
    "mixed": (GAIN, COST, {}, None),
    "flat": (FLAT, FLAT, {}, None),
    # the kernel dropped the flag silently: cryptsetup applied it, the dm table lacks it
    "dropped": (GAIN, FLAT, {"perf_flags": ["same_cpu_crypt"]}, ["same_cpu_crypt", None]),
    "skipped": (FLAT, FLAT, {"perf_flags": ["high_priority"]}, [None, None]),
    "sector": (GAIN, FLAT, {"sector_size": 4096}, None),
}


def description(setting):
    flags = SETTINGS[setting][3]
    if setting == "skipped":
        why = "this cryptsetup has no --perf-high_priority"
        return kernel_luks([], [], {"high_priority": why})
    if flags:
        return kernel_luks(flags[:1], [f for f in flags[1:] if f])
    return kernel_luks([], [], sector=512)


def synthetic_run():
    """The settings of :data:`SETTINGS` against `luks` (and `plain`), adiantum not built; the
    reference fio-bound in `fast`'s throughput cell."""
    rows = []
    for arm, (tput, cpu, _, _) in SETTINGS.items():
        for cell in (FULL, AT_RATE):
            for metric in (TPUT, CPU, "clat_p50_ns"):
                # throughput at full speed and CPU per I/O at a fixed rate count; the others
                # (throughput pinned at a rate, CPU at unequal load, p50) must not
                d = {(TPUT, FULL): tput, (CPU, AT_RATE): cpu}.get((metric, cell), COST)
                rows.append(loss_row("luks", arm, cell, metric, d))
                worse = [x * (-1 if metric == TPUT else 1) for x in (0.5, 0.45, 0.55, 0.5)]
                rows.append(loss_row("plain", arm, cell, metric, worse))
                rows[-2]["fio_bound"] = (arm, metric, cell) == ("fast", TPUT, FULL)
    descriptions = {s: description(s) for s in SETTINGS} | {
        "adiantum": {"unavailable": "no adiantum"}
    }
    plan_stacks = {"luks": {}, **{s: v[2] for s, v in SETTINGS.items()}}
    plan_stacks["adiantum"] = {"cipher": "xchacha12,aes-adiantum-plain64"}
    plan = {"patterns": {"equalload": {"rate_pct": 80}, "seq": {"rate_pct": None}}}
    planned = {s: c.get("perf_flags", []) for s, c in plan_stacks.items()}
    # the processed tables ingest writes from these documents
    tables = stack_frames("r", HOST, descriptions, planned)
    tables |= plan_frames("r", HOST, {"plan": plan | {"stacks": plan_stacks}})
    comparisons = [{"baseline": "plain", "variant": "luks"}]
    comparisons += [{"baseline": "luks", "variant": s} for s in [*SETTINGS, "adiantum"]]
    return pd.DataFrame(rows), tables, comparisons


def planned(tables):
    """The plan tables :func:`recommendations` reads."""
    return tables["plan_stacks"], tables["perf_flags"]


def tuning_of_synthetic_run():
    loss, tables, comparisons = synthetic_run()
    return tuning_table(loss, tables, "luks", "plain", comparisons)


def test_settings_are_the_stacks_compared_with_the_reference():
    *_, comparisons = synthetic_run()
    assert settings("luks", comparisons) == [*SETTINGS, "adiantum"]
    assert settings("plain", comparisons) == ["luks"]


def test_a_setting_is_measured_only_where_the_stacks_description_shows_it_applied():
    per = tuning_of_synthetic_run().groupby("setting").first()
    not_measured = per[per["recommendation"] == "not measured"]
    assert set(not_measured.index) == {"dropped", "skipped", "sector", "adiantum"}
    assert not_measured["rank"].isna().all()
    why = per["not_applied"]
    # cryptsetup took the flag, the kernel's dm table does not show it (the backend's note is
    # free text; the decision rests on the recorded flags and table)
    assert why["dropped"] == "perf flag same_cpu_crypt not applied: not in the dm table"
    assert why["skipped"] == (
        "perf flag high_priority not applied: this cryptsetup has no --perf-high_priority"
    )
    assert why["sector"] == "sector_size 512, plan asked 4096"
    assert why["adiantum"] == "not built: no adiantum"
    assert why["fast"] == "" and why["flat"] == ""
    # a description without dm-crypt (the userspace backend) applies no flag
    no_dm = {"kind": "luks", "sector_size": 512, "notes": ["perf flags [...] skipped: ..."]}
    built = stack_frames("r", HOST, {"x": no_dm}, {"x": ["no_read_workqueue"]})
    row = built["stacks"].iloc[0].to_dict()
    assert unapplied({"perf_flags": ["no_read_workqueue"]}, row, built["perf_flags"]) == [
        "perf flag no_read_workqueue not applied: not recorded as applied"
    ]


def test_each_metric_is_read_from_the_cells_that_answer_it():
    table = tuning_of_synthetic_run()
    assert list(table.columns) == TUNING_COLUMNS
    measured = table[table["metric"].notna()]
    assert set(zip(measured["metric"], measured["workload"], strict=True)) == {
        (TPUT, "randread-4k-qd1"),
        (CPU, "randwrite-4k-qd32-equalload"),
    }
    fast = measured[measured["setting"] == "fast"]
    assert (fast["ceiling_decision"] == "material").all()
    # against the ceiling: the loss table's own row, not adjusted (it decides nothing here)
    loss = synthetic_run()[0]
    vs_plain = loss[(loss["baseline"] == "plain") & (loss["variant"] == "fast")]
    vs_plain = vs_plain.merge(fast[["metric", "workload", "ceiling_ci_low"]])
    assert len(vs_plain) == 2 and (vs_plain["ci_low"] == vs_plain["ceiling_ci_low"]).all()


def test_the_rows_are_decided_on_intervals_at_the_bonferroni_level_of_their_family():
    loss = synthetic_run()[0]
    table = tuning_of_synthetic_run()
    decided = table[table["not_applied"] == ""]
    m = 8  # fast, lucky, mixed, flat x (throughput, CPU per I/O)
    assert (decided["n_decisions"] == m).all() and (decided["family_confidence"] == 0.95).all()
    assert np.allclose(decided["row_confidence"], 1 - 0.05 / m)
    lucky = decided[(decided["setting"] == "lucky") & (decided["metric"] == TPUT)].iloc[0]
    ci = stats.paired_log_ratio_ci(np.array(NEAR_GAIN), 1 - 0.05 / m)
    _, low, high = stats.effect_from_log_ratio(ci.mean, ci.low, ci.high, True)
    assert (lucky["ci_low"], lucky["ci_high"]) == pytest.approx((low, high))
    # alone at 95 % the row is a gain; one of 8 decisions, it is not
    alone = loss[(loss["variant"] == "lucky") & (loss["metric"] == TPUT) & (loss["pattern"] == "")]
    assert alone["decision"].iloc[0] == "moderate gain"
    assert lucky["decision"] == "undecided: straddles -5 %"


def test_every_kind_of_interval_is_widened_from_its_own_level_and_degrees_of_freedom():
    d = np.array([0.10, 0.14, 0.08, 0.12, 0.11, 0.15])
    kinds = [  # (kind, level of the row's own interval, pilot, pairs)
        ("t", 0.95, None, None),
        ("sequential", 0.99, None, None),  # its look level: already split over the looks
        ("stein", 0.95, (0.03, 4), None),  # the pilot's SD, n0 - 1 degrees of freedom
        ("sessions", 0.95, None, 18),  # d = 6 session means of 18 pairs
    ]
    rows = pd.DataFrame(
        [loss_row("luks", k, FULL, TPUT, d, lvl, k, pilot, n) for k, lvl, pilot, n in kinds]
    )
    out = family_decisions(rows)
    for (kind, level, pilot, _), row in zip(kinds, out.itertuples(), strict=True):
        ci = stats.paired_log_ratio_ci(d, 1 - (1 - level) / 4, pilot)
        want = stats.effect_from_log_ratio(ci.mean, ci.low, ci.high, True)
        assert (row.effect_pct, row.ci_low, row.ci_high) == pytest.approx(want), kind


def test_only_a_setting_with_a_gain_and_no_cost_is_recommended():
    per = tuning_of_synthetic_run().groupby("setting").first()
    recommendation = per["recommendation"].to_dict()
    assert {s: recommendation[s] for s in ("fast", "lucky", "mixed", "flat")} == {
        "fast": "recommended",
        "lucky": "undecided",
        "mixed": "costs",  # a material gain does not cancel a material cost
        "flat": "no measured benefit",
    }
    assert per.loc["fast", "rank"] == 1 and per.drop("fast")["rank"].isna().all()
    assert (per.loc["mixed", "n_gains"], per.loc["mixed", "n_costs"]) == (1, 1)
    assert per.loc["lucky", "n_undecided"] == 1
    order = list(tuning_of_synthetic_run()["setting"].drop_duplicates())
    assert order[:4] == ["fast", "lucky", "flat", "mixed"]


def test_the_reference_arms_limits_reach_the_table_and_the_paper():
    from luksbench.publish.recommend import recommendations

    table = tuning_of_synthetic_run()
    limited = table[table["fio_bound"]]
    assert set(zip(limited["setting"], limited["metric"], strict=True)) == {("fast", TPUT)}
    assert not table["cpu_saturated"].any()
    rec = recommendations(table, *planned(synthetic_run()[1]), [])
    fast = next(s for s in rec["measured"] if s["setting"] == "fast")
    assert [r["limited"] for r in fast["rows"]] == ["fio-bound", ""]
    assert rec["any_limited"]


def test_a_run_without_tuning_arms_has_an_empty_table():
    loss, tables, _ = synthetic_run()
    table = tuning_table(loss, tables, "luks", "plain", [{"baseline": "plain", "variant": "luks"}])
    assert table.empty and list(table.columns) == TUNING_COLUMNS


def test_the_vm_case_builds_the_studys_arms_as_the_study_configures_them():
    study = yaml.safe_load(STUDY.read_text())
    case = json.loads((REPO / "tests" / "vm" / "plans" / "tune-dmcrypt.json").read_text())
    assert case["plan"]["stacks"] == study["stacks"]
    luks_arms = {n for n, s in study["stacks"].items() if s["kind"] == "luks"}
    assert set(case["expect"]["crypt_arms_up"]) == luks_arms
    for name in luks_arms:
        want, arm = case["expect"]["crypt_arms_up"][name], study["stacks"][name]
        flags = set(arm.get("perf_flags", [])) - {"high_priority"}  # kernel 6.1 in the guest
        assert flags <= set(want["options"])
        assert want["cipher"] == arm.get("cipher", "aes-xts-plain64")


def test_how_to_apply_names_the_commands_of_what_the_setting_changes():
    from luksbench.publish.recommend import how_to_apply

    default = {"cipher": "aes-xts-plain64", "key_bits": 512, "sector_size": 512, "perf_flags": []}
    nowq = how_to_apply(
        {**default, "perf_flags": ["no_read_workqueue", "no_write_workqueue"]}, default
    )
    assert nowq == [
        "`cryptsetup refresh --perf-no_read_workqueue --perf-no_write_workqueue --persistent "
        "<name>` (kept in the LUKS2 header)",
        "or the crypttab options `no-read-workqueue,no-write-workqueue`",
    ]
    high = how_to_apply({**default, "perf_flags": ["high_priority"]}, default)
    assert len(high) == 1 and "--perf-high_priority --persistent" in high[0]
    assert "--sector-size 4096" in how_to_apply({**default, "sector_size": 4096}, default)[0]
    assert "--key-size 256" in how_to_apply({**default, "key_bits": 256}, default)[0]
    assert how_to_apply(default, default) == []


def test_the_recommendation_lists_the_measured_settings_and_states_the_others():
    from luksbench.publish.recommend import recommendations

    table = tuning_of_synthetic_run()
    plans = planned(synthetic_run()[1])
    hosts = [
        {
            "host": HOST,
            "kernel": "6.1.0",
            "cryptsetup_version": "cryptsetup 2.6.1",
            "backend_short": "kernel",
        }
    ]
    rec = recommendations(table, *plans, hosts)
    assert [(s["rank"], s["setting"], s["recommendation"]) for s in rec["measured"]] == [
        (1, "fast", "recommended (not measured: p99 latency)"),  # no evidence it is free
        (None, "lucky", "undecided"),
        (None, "flat", "no measured benefit"),
        (None, "mixed", "costs"),
    ]
    assert rec["n_recommended"] == 1
    assert rec["family"] == {
        "n_decisions": 8,
        "row_confidence": "99.38",
        "family_confidence": "95",
    }
    fast, row = rec["measured"][0], table.iloc[0]
    assert "--perf-no_read_workqueue" in fast["apply"][0]
    assert fast["rows"][0]["effect"] == (
        f"{row['effect_pct']:.1f} % [{row['ci_low']:.1f}, {row['ci_high']:.1f}]"
    )
    assert {r["ceiling_decision"] for r in fast["rows"]} == {"material"}
    skipped = {s["setting"]: s for s in rec["not_measured"]}
    assert set(skipped) == {"dropped", "skipped", "sector", "adiantum"}
    assert "no --perf-high_priority" in skipped["skipped"]["reason"]
    assert "--perf-high_priority" in skipped["skipped"]["apply"][0]
    assert rec["versions"] == hosts
    assert recommendations(table.iloc[0:0], *plans, hosts) == {"present": False}


def test_the_userspace_backend_refuses_the_dm_crypt_only_ciphers_naming_them():
    from luksbench.testbox.backends.choose import userspace_compatible

    study = yaml.safe_load(STUDY.read_text())
    stacks = {n: {k: v for k, v in s.items() if k != "over"} for n, s in study["stacks"].items()}
    stacks["plain"] = {"kind": "plain"}
    why = userspace_compatible({"stacks": stacks})
    assert why == [
        "stack adiantum (cipher xchacha12,aes-adiantum-plain64: dm-crypt only, qemu's luks "
        "driver lacks it)",
        "stack null-cipher (cipher cipher_null-ecb: dm-crypt only, qemu's luks driver lacks it)",
    ]


def test_a_gain_with_a_row_undecided_toward_a_material_cost_is_not_recommended():
    """The paper's rule for every metric: tuning.parquet recommends `fast` (a gain, no decided
    cost); a p99 latency row whose interval reaches past the 50 % margin holds it back."""
    from luksbench.publish.recommend import recommendations

    table = tuning_of_synthetic_run()
    fast = table[(table["setting"] == "fast") & (table["metric"] == TPUT)].iloc[0]
    p99 = fast.copy()
    p99[["metric", "metric_label", "effect_pct", "ci_low", "ci_high"]] = (
        "clat_p99_ns",
        "p99 latency",
        20.0,
        -5.0,
        60.0,
    )
    p99[["decision", "decision_lower_pct", "decision_upper_pct"]] = (
        "undecided: straddles 10 %, 50 %",
        10.0,
        50.0,
    )
    p99["higher_is_better"] = False
    held = pd.concat([table, p99.to_frame().T], ignore_index=True)
    rec = recommendations(held, *planned(synthetic_run()[1]), [])
    entry = next(s for s in rec["measured"] if s["setting"] == "fast")
    assert entry["recommendation"] == (
        "undecided (a gain, but undecided toward a material cost: p99 latency in 1 cell)"
    )
    assert entry["rank"] is None and rec["n_recommended"] == 0
    # short of the material margin it does not stand in the way
    p99["ci_high"], p99["decision"] = 45.0, "undecided: straddles 10 %"
    rec = recommendations(
        pd.concat([table, p99.to_frame().T], ignore_index=True), *planned(synthetic_run()[1]), []
    )
    entry = next(s for s in rec["measured"] if s["setting"] == "fast")
    assert entry["recommendation"] == "recommended" and entry["rank"] == 1
