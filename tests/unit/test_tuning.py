"""The tune-dmcrypt study's pieces: high_priority skipped with its reason where the kernel or
cryptsetup lack it, the ranking of the tuning arms (tuning.parquet), and the VM case that
builds every arm of the study."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from luksbench.analysis.tuning import TUNING_COLUMNS, settings, tuning_table
from luksbench.testbox.backends.kernel import usable_perf_flags
from luksbench.testbox.plan import PERF_FLAGS

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
CELLS = [  # (workload, pattern, direction)
    ("randread-4k-qd1", "", "read"),
    ("randwrite-4k-qd32-equalload", "equalload", "write"),
]


def loss_row(baseline, variant, workload, pattern, direction, metric, low, high, decision):
    return {
        "host": HOST,
        "workload": workload,
        "pattern": pattern,
        "direction": direction,
        "metric": metric,
        # as the loss table has it at a fixed block size: CPU per I/O repeats CPU per GiB's test
        "derived_from": "busy_cpu_s_per_gib" if metric == "busy_cpu_us_per_io" else "",
        "baseline": baseline,
        "variant": variant,
        "effect_pct": (low + high) / 2,
        "ci_low": low,
        "ci_high": high,
        "decision": decision,
    }


def synthetic_run():
    """Three settings against `luks`: `fast` gains throughput at full speed, `slow` costs it,
    `flagged` had its flag skipped; CPU per I/O differs only in the fixed-rate cell."""
    rows = []
    decisions = {
        "fast": ((-30.0, -25.0, "material gain"), (-1.0, 1.0, "negligible")),
        "slow": ((8.0, 12.0, "moderate"), (-20.0, 30.0, "undecided: straddles -10 %, 10 %")),
        "flagged": ((-1.0, 1.0, "negligible"), (-1.0, 1.0, "negligible")),
    }
    for arm, (tput, cpu) in decisions.items():
        for workload, pattern, direction in CELLS:
            for metric in ("bw_bytes", "busy_cpu_us_per_io", "clat_p50_ns"):
                # throughput at full speed and CPU per I/O at a fixed rate count; the others
                # (throughput pinned at a rate, CPU at unequal load, p50) must not
                low, high, dec = -60, -55, "material gain"
                if (metric, pattern) == ("bw_bytes", ""):
                    low, high, dec = tput
                if (metric, pattern) == ("busy_cpu_us_per_io", "equalload"):
                    low, high, dec = cpu
                rows.append(
                    loss_row("luks", arm, workload, pattern, direction, metric, low, high, dec)
                )
                rows.append(
                    loss_row("plain", arm, workload, pattern, direction, metric, 40, 50, "material")
                )
    loss = pd.DataFrame(rows)
    stacks = pd.DataFrame(
        [
            {
                "host": HOST,
                "stack": s,
                "available": True,
                "reason": None,
                "description_json": json.dumps({"notes": n}),
            }
            for s, n in [
                ("fast", []),
                ("slow", []),
                (
                    "flagged",
                    [
                        "perf flag high_priority skipped: this cryptsetup has no --perf-high_priority"
                    ],
                ),
            ]
        ]
        + [
            {
                "host": HOST,
                "stack": "adiantum",
                "available": False,
                "reason": "no adiantum",
                "description_json": "{}",
            }
        ]
    )
    plan = {"patterns": {"equalload": {"rate_pct": 80}, "seq": {"rate_pct": None}}}
    env = pd.DataFrame([{"host": HOST, "env_json": json.dumps({"plan": plan})}])
    comparisons = [{"baseline": "plain", "variant": "luks"}]
    comparisons += [
        {"baseline": "luks", "variant": s} for s in ("fast", "slow", "flagged", "adiantum")
    ]
    return loss, stacks, env, comparisons


def test_settings_are_the_stacks_compared_with_the_reference():
    *_, comparisons = synthetic_run()
    assert settings("luks", comparisons) == ["fast", "slow", "flagged", "adiantum"]
    assert settings("plain", comparisons) == ["luks"]


def test_the_settings_are_ranked_by_their_decisions_and_the_skipped_ones_are_not():
    table = tuning_table(*synthetic_run()[:3], "luks", "plain", synthetic_run()[3])
    assert list(table.columns) == TUNING_COLUMNS
    per = table.groupby("setting").first()
    # each metric from the cells that answer it: throughput and p99 at full speed, CPU per I/O
    # at equal load; p50 and the derived rows are not read
    measured = table[table["metric"].notna()]
    assert set(zip(measured["metric"], measured["workload"], strict=True)) == {
        ("bw_bytes", "randread-4k-qd1"),
        ("busy_cpu_us_per_io", "randwrite-4k-qd32-equalload"),
    }
    assert per.loc["fast", "rank"] == 1 and per.loc["fast", "score"] == 2
    assert per.loc["slow", "rank"] == 2 and per.loc["slow", "score"] == -1
    assert (per.loc["slow", "n_costs"], per.loc["slow", "n_undecided"]) == (1, 1)
    assert per.loc["fast", "n_gains"] == 1
    # a skipped flag measures the reference again: listed with the reason, never ranked
    assert pd.isna(per.loc["flagged", "rank"])
    assert "no --perf-high_priority" in per.loc["flagged", "not_applied"]
    assert pd.isna(per.loc["adiantum", "rank"]) and per.loc["adiantum", "not_applied"] == (
        "not built: no adiantum"
    )
    # against the ceiling beside the reference
    fast = measured[measured["setting"] == "fast"]
    assert (fast["ceiling_decision"] == "material").all() and (fast["ceiling_ci_low"] == 40).all()
    assert list(table["setting"].drop_duplicates()) == ["fast", "slow", "adiantum", "flagged"]


def test_a_run_without_tuning_arms_has_an_empty_table():
    loss, stacks, env, _ = synthetic_run()
    table = tuning_table(
        loss, stacks, env, "luks", "plain", [{"baseline": "plain", "variant": "luks"}]
    )
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


def test_the_recommendation_lists_ranked_settings_and_states_the_skipped_ones():
    from luksbench.publish.recommend import recommendations

    loss, stacks, env, comparisons = synthetic_run()
    table = tuning_table(loss, stacks, env, "luks", "plain", comparisons)
    plan = {
        "stacks": {
            "luks": {},
            "fast": {"sector_size": 4096},
            "flagged": {"perf_flags": ["high_priority"]},
        }
    }
    env = pd.DataFrame([{"host": HOST, "env_json": json.dumps({"plan": plan})}])
    hosts = [
        {
            "host": HOST,
            "kernel": "6.1.0",
            "cryptsetup_version": "cryptsetup 2.6.1",
            "backend_short": "kernel",
        }
    ]
    rec = recommendations(table, env, hosts)
    assert [(s["rank"], s["setting"]) for s in rec["ranked"]] == [(1, "fast"), (2, "slow")]
    fast = rec["ranked"][0]
    assert "--sector-size 4096" in fast["apply"][0]
    assert {r["effect"] for r in fast["rows"]} >= {"-27.5 % [-30.0, -25.0]"}
    assert {r["ceiling_decision"] for r in fast["rows"]} == {"material"}
    skipped = {s["setting"]: s for s in rec["not_measured"]}
    assert set(skipped) == {"flagged", "adiantum"}
    assert "no --perf-high_priority" in skipped["flagged"]["reason"]
    assert "--perf-high_priority" in skipped["flagged"]["apply"][0]
    assert rec["versions"] == hosts
    assert recommendations(table.iloc[0:0], env, hosts) == {"present": False}


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
