"""Test-box pieces that need no devices: command lines, schedule, CPU sidecar math, safety."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from testkit.plans import fio_settings

from luksbench.formats.layout import Workload
from luksbench.formats.plan import migrated_plan_document
from luksbench.testbox import safety
from luksbench.testbox.backends.kernel import losetup_argv, luks_format_argv, luks_open_argv
from luksbench.testbox.backends.userspace import qsd_argv
from luksbench.testbox.planbuild import baseline_first
from luksbench.testbox.planbuild import workloads as workloads_of
from luksbench.testbox.runner import (
    check_fio_result,
    cpu_sidecar,
    fio_argv,
    load_targets,
    schedule,
    stacks_in_order,
    steadiest_clock,
)
from luksbench.testbox.sysutil import TestboxError

REPO = Path(__file__).resolve().parents[2]


def _plan(**over) -> dict:
    plan = {
        "run": "unit",
        "host": "tb",
        "backend": "kernel",
        "scratch_dir": "/srv/scratch/unit/tb",
        "device_size_mib": 64,
        "precondition": True,
        "baseline": "plain",
        "stacks": {
            "luks": {
                "kind": "luks",
                "cipher": "aes-xts-plain64",
                "key_bits": 512,
                "hash": "sha256",
                "luks_type": "luks2",
                "sector_size": 4096,
                "pbkdf_iterations": 1000,
            },
            "plain": {"kind": "plain"},
        },
        "matrix": {"rw": ["randread", "write"], "bs": ["4k", "1m"], "iodepth": [1, 32]},
        "fio": fio_settings(runtime_s=3, ramp_time_s=1),
        "repetitions": 6,
        "seed": 7,
    }
    plan.update(over)
    return migrated_plan_document(plan)  # a version 1 document, as the test box reads it


def test_baseline_first_puts_baseline_first():
    assert baseline_first(_plan()) == ["plain", "luks"]


def test_stack_order_alternates_in_blocks_of_two_rounds():
    stacks = ["plain", "luks"]
    a, b = stacks, stacks[::-1]
    assert [stacks_in_order(stacks, k, 0) for k in range(1, 9)] == [a, b, b, a, a, b, b, a]
    assert [stacks_in_order(stacks, k, 1) for k in range(1, 5)] == [b, a, a, b]
    three = ["plain", "luks", "luks4k"]
    assert stacks_in_order(three, 2, 0) == ["luks4k", "luks", "plain"]


def _baseline_first_counts(runs) -> dict[str, Counter]:
    """Per cell: how many of its pairs ran baseline first (True) and reversed (False)."""
    counts: dict[str, Counter] = {}
    for r in runs:
        if r["stack"] == "plain":
            counts.setdefault(r["workload"].id, Counter())[r["position_in_cell"] == 0] += 1
    return counts


@pytest.mark.parametrize("reps", [1, 2, 3, 4, 5, 6])
def test_stack_order_is_balanced_within_every_cell_and_over_the_run(reps):
    """Every cell has as many pairs baseline first as reversed (odd counts: one more of one),
    and with an odd count the extra order goes to half of the cells each way."""
    runs = schedule(_plan(repetitions=reps))
    counts = _baseline_first_counts(runs)
    assert len(counts) == 8
    for c in counts.values():
        assert abs(c[True] - c[False]) == reps % 2
    total = sum(counts.values(), Counter())
    assert total[True] == total[False] == 8 * reps // 2
    if reps % 2:  # which cells get the extra order comes from the seed
        assert _baseline_first_counts(schedule(_plan(repetitions=reps, seed=8))) != counts


def test_schedule_rounds_shuffle_and_balance():
    plan = _plan()
    runs = schedule(plan)
    cells = 8
    assert len(runs) == cells * 2 * 6
    assert [r["index"] for r in runs] == list(range(1, len(runs) + 1))
    # Rounds run in order; each round covers every (cell, stack) once.
    assert [r["round"] for r in runs] == sorted(r["round"] for r in runs)
    for k in range(1, 7):
        in_round = [(r["workload"].id, r["stack"]) for r in runs if r["round"] == k]
        assert len(set(in_round)) == cells * 2
    # Within a cell the two stacks run back to back; each round has both orders.
    for k in range(1, 7):
        firsts = Counter(x["stack"] for x in runs if x["round"] == k and x["position_in_cell"] == 0)
        assert firsts == {"plain": cells // 2, "luks": cells // 2}
    for i in range(0, len(runs), 2):
        x, y = runs[i], runs[i + 1]
        assert (
            x["workload"] == y["workload"] and x["round"] == y["round"] and x["stack"] != y["stack"]
        )
    # Cell order differs between rounds and is reproducible from the seed.
    order1 = [r["workload"] for r in runs if r["round"] == 1 and r["position_in_cell"] == 0]
    order2 = [r["workload"] for r in runs if r["round"] == 2 and r["position_in_cell"] == 0]
    assert order1 != order2 and sorted(order1) == sorted(order2)
    assert schedule(plan) == runs
    assert schedule(_plan(seed=8)) != runs


def test_schedule_with_targets_tops_each_cell_up_to_its_own_target():
    """Adaptive stage 2: rounds 1..n0 are the pilot's, unchanged; round k then runs (shuffled,
    balanced) only the cells whose target is >= k."""
    plan = _plan(repetitions=4)
    ids = sorted(w.id for w in workloads_of(plan))
    targets = {ids[0]: 12, ids[1]: 7, ids[2]: 4, ids[3]: 2}  # 2 < n0: the pilot's 4 still stand
    runs = schedule(plan, targets)
    pilot = schedule(plan)
    assert runs[: len(pilot)] == pilot
    per_cell = Counter(r["workload"].id for r in runs)
    expected = {w: 2 * max(4, targets.get(w, 4)) for w in ids}
    assert per_cell == expected
    assert all(r["rep"] == r["round"] for r in runs)
    for w, c in _baseline_first_counts(runs).items():
        assert abs(c[True] - c[False]) == per_cell[w] // 2 % 2
    late = [r["workload"].id for r in runs if r["round"] == 6 and r["position_in_cell"] == 0]
    assert sorted(late) == sorted([ids[0], ids[1]])
    assert [r["index"] for r in runs] == list(range(1, len(runs) + 1))


def test_load_targets(tmp_path):
    good = tmp_path / "t.json"
    good.write_text(json.dumps({"pairs": {"randread-4k-qd1": 6}, "cells": {}}))
    assert load_targets(good) == {"randread-4k-qd1": 6}
    for bad in ('{"pairs": {"x": 0}}', '{"pairs": [1]}', "{not json", '{"pairs": {"x": true}}'):
        good.write_text(bad)
        with pytest.raises(TestboxError, match=r"t\.json"):
            load_targets(good)


def test_the_shipped_sample_ran_the_counterbalanced_shuffled_schedule():
    """The real manifest of data/raw/sample: pairs back to back, ABBA by round, cells reshuffled
    every round, exactly the order schedule() computes from the seed; rep k of both arms is pair k."""
    manifest_path = next((REPO / "data" / "raw" / "sample").glob("*/fio/manifest.json"))
    m = json.loads(manifest_path.read_text())
    cells = [Workload.from_id(c) for c in m["cells"]]
    plan = _plan(
        repetitions=m["repetitions"],
        seed=m["seed"],
        baseline=m["baseline"],
        matrix={
            "rw": sorted({w.rw for w in cells}),
            "bs": sorted({w.bs for w in cells}),
            "iodepth": sorted({w.iodepth for w in cells}),
        },
    )
    assert sorted(w.id for w in workloads_of(plan)) == sorted(m["cells"])
    runs = m["runs"]
    # the cells in the order schedule() shuffles them (the sample predates the per-cell balanced
    # stack order: its rounds ran all cells in one order, ABBA by round)
    expected = [(r["round"], r["workload"].id) for r in schedule(plan)]
    assert [(r["round"], r["workload"]) for r in runs] == expected
    assert m["repetitions"] >= 3 and len(runs) == len(cells) * 2 * m["repetitions"]
    a, b = m["stacks"], m["stacks"][::-1]
    orders = {}
    for i in range(0, len(runs), 2):
        x, y = runs[i], runs[i + 1]
        assert x["workload"] == y["workload"] and x["rep"] == y["rep"] == x["round"]
        assert x["ended"] <= y["started"]  # back to back, in this order
        orders.setdefault(x["round"], set()).add((x["stack"], y["stack"]))
    assert orders[1] == {tuple(a)} and orders[2] == {tuple(b)} and orders[3] == {tuple(b)}
    firsts = [
        [r["workload"] for r in runs if r["round"] == k and r["position_in_cell"] == 0]
        for k in range(1, m["repetitions"] + 1)
    ]
    assert all(sorted(f) == sorted(m["cells"]) for f in firsts)
    assert len({tuple(f) for f in firsts}) == len(firsts), "cell order must change every round"
    for r in runs:
        assert (manifest_path.parent.parent / r["path"]).is_file()


def test_kernel_command_lines():
    assert losetup_argv("/s/b.img") == ["losetup", "--direct-io=on", "--show", "-f", "/s/b.img"]
    cfg = _plan()["stacks"]["luks"]
    argv = luks_format_argv(cfg, "/dev/loop3", "/s/.k/luks.key", "luks2")
    assert argv[:4] == ["cryptsetup", "luksFormat", "--batch-mode", "--type"]
    joined = " ".join(argv)
    for part in (
        "--type luks2",
        "--cipher aes-xts-plain64",
        "--key-size 512",
        "--hash sha256",
        "--sector-size 4096",
        "--pbkdf pbkdf2",
        "--pbkdf-force-iterations 1000",
        "--key-file /s/.k/luks.key",
    ):
        assert part in joined
    assert argv[-1] == "/dev/loop3"
    # LUKS1 has no --sector-size option.
    assert "--sector-size" not in luks_format_argv(cfg, "/f", "/k", "luks1")
    assert luks_open_argv("/dev/loop3", "luksbench-r-luks", "/k") == [
        "cryptsetup",
        "open",
        "--type",
        "luks",
        "--key-file",
        "/k",
        "/dev/loop3",
        "luksbench-r-luks",
    ]


def test_qsd_command_line_passes_key_by_file_only():
    argv = qsd_argv(
        kind="luks",
        backing="/s/a,b.img",
        mountpoint="/s/m.fuse",
        qmp_socket="/run/x/l.qmp",
        pidfile="/run/x/l.pid",
        key_file="/s/.k/luks.key",
    )
    joined = " ".join(argv)
    assert "secret,id=sec0,file=/s/.k/luks.key,format=raw" in joined
    assert "filename=/s/a,,b.img" in joined  # qemu escapes ',' as ',,'
    assert "driver=luks,node-name=dev0,file=file0,key-secret=sec0" in joined
    assert "type=fuse,id=exp0,node-name=dev0,mountpoint=/s/m.fuse,writable=on" in joined
    assert argv[-1] == "--daemonize" and "--pidfile" in argv
    assert not any(a.startswith("secret,") and "data=" in a for a in argv)
    plain = " ".join(
        qsd_argv(kind="plain", backing="/b", mountpoint="/m", qmp_socket="/q", pidfile="/p")
    )
    assert "driver=raw,node-name=dev0,file=file0" in plain and "secret" not in plain
    with pytest.raises(ValueError):
        qsd_argv(kind="luks", backing="/b", mountpoint="/m", qmp_socket="/q", pidfile="/p")


def test_fio_command_line():
    plan = _plan()
    w = Workload("randread", 4096, 32)
    argv = fio_argv(
        plan,
        {"device": "/dev/mapper/luksbench-unit-luks"},
        "luks",
        w,
        "/o/.rep1.json.x.tmp",
        1 << 26,
    )
    assert argv == [
        "fio",
        "--output-format=json+",
        "--output=/o/.rep1.json.x.tmp",
        "--name=luks-randread-4k-qd32",
        "--filename=/dev/mapper/luksbench-unit-luks",
        "--rw=randread",
        "--bs=4096",
        "--iodepth=32",
        "--ioengine=libaio",
        "--direct=1",
        "--time_based",
        "--runtime=3s",
        "--ramp_time=1s",
        "--numjobs=1",
        "--group_reporting",
        f"--size={1 << 26}",
    ]


def test_cpu_sidecar_math():
    clk = os.sysconf("SC_CLK_TCK")
    before = dict.fromkeys(
        ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), 0
    )
    after = {
        "user": 2 * clk,
        "nice": 0,
        "system": clk,
        "idle": 4 * clk,
        "iowait": 2 * clk,
        "irq": 0,
        "softirq": clk,
        "steal": 0,
    }
    s = cpu_sidecar(before, after, 5.0)
    assert s["busy_s"] == pytest.approx(4.0)
    assert s["busy_pct"] == pytest.approx(40.0)  # iowait counts as idle
    assert s["delta_s"]["iowait"] == pytest.approx(2.0)
    assert s["clk_tck"] == clk and s["interval_s"] == 5.0


def test_check_fio_result_strips_leading_text_and_refuses_what_ingest_refuses(tmp_path):
    """The runner accepts a result exactly as ingest's loader and parser do."""
    sample = REPO / "data/raw/sample/vm/fio/luks/randread-1m-qd1/rep1.json"
    out = tmp_path / "rep1.json"
    out.write_text("fio: warning\n" + sample.read_text())
    assert check_fio_result(out)["jobs"][0]["error"] == 0
    for bad in ("fio: no output", '{"jobs": ['):
        out.write_text(bad)
        with pytest.raises(ValueError, match="fio output unreadable"):
            check_fio_result(out)
    doc = json.loads(sample.read_text())
    doc["jobs"][0]["error"] = 5
    out.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"fio job error \[5\]"):
        check_fio_result(out)


def test_a_session_uses_the_tsc_only_when_every_fio_start_up_accepted_it():
    assert steadiest_clock(["cpu", "cpu", "cpu"]) == "cpu"
    assert steadiest_clock(["cpu", "clock_gettime", "cpu"]) == "clock_gettime"
    assert steadiest_clock(["clock_gettime", "gettimeofday"]) == "clock_gettime"
    assert steadiest_clock(["cpu", None, "cpu"]) is None
    assert steadiest_clock([]) is None


def test_safety_names_and_paths(tmp_path):
    assert safety.mapper_name("default", "luks") == "luksbench-default-luks"
    for bad in ("", "../x", "a b", "-x", "a/b", "x" * 65):
        with pytest.raises(safety.SafetyError):
            safety.check_name(bad, "stack")
    with pytest.raises(safety.SafetyError):
        safety.check_scratch_dir("relative/dir")
    with pytest.raises(safety.SafetyError):
        safety.check_scratch_dir("/")
    assert safety.check_inside(tmp_path / "b.img", tmp_path) == tmp_path.resolve() / "b.img"
    with pytest.raises(safety.SafetyError):
        safety.check_inside(tmp_path / "sub" / "b.img", tmp_path)
    with pytest.raises(safety.SafetyError):
        safety.check_inside(tmp_path / ".." / "b.img", tmp_path)
    (tmp_path / "link.img").symlink_to("/etc/hostname")
    with pytest.raises(safety.SafetyError):
        safety.check_inside(tmp_path / "link.img", tmp_path)
