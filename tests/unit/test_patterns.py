"""Patterns: families of cells beside the main matrix with their own fio options (issue 3).

From the config to the plan (defaults, errors naming the key, blocks that must fit), the fio
command line, the I/O fio really issues (its own --write_iolog on a file here), the plan's
description, the run identity, and ingest (pattern, io_bs_bytes). The device tests run pattern
cells through the testbox CLI on loop devices and ext4 on a loop device."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from snakemake.utils import validate
from testkit.paths import SCHEMA
from testkit.plans import KIB, LARGEBLOCK, MIB, SYNC
from testkit.plans import pattern_config as config
from testkit.plans import pattern_plan as plan_of

from luksbench.analysis import ingest
from luksbench.formats.layout import Workload
from luksbench.testbox.planbuild import (
    PlanError,
    cell_options,
    check_plan,
    plan_changes,
    workloads,
    write_plan,
)
from luksbench.testbox.planview import describe_plan
from luksbench.testbox.runner import fio_argv
from luksbench.testbox.sysutil import TestboxError

REPO = Path(__file__).resolve().parents[2]
# --- config -> plan ------------------------------------------------------------------------------


def test_patterns_resolve_into_the_plan_with_every_key():
    plan = plan_of(config())
    assert plan["patterns"]["largeblock"] == {
        **LARGEBLOCK,
        # fio overrides resolved against the top-level fio section: no nulls in the plan
        "fio": {"ioengine": "psync", "direct": False, "sync": False},
        "rate_pct": None,  # unthrottled
    }
    assert plan["patterns"]["sync"] == {
        "description": "",
        "matrix": SYNC["matrix"],
        "io_bs": "",
        "fsync_per_block": False,
        "fio": {"ioengine": "psync", "direct": True, "sync": True},
        "rate_pct": None,
    }
    inherit = plan_of(config(patterns={"p1": {"matrix": SYNC["matrix"]}}))["patterns"]["p1"]
    assert inherit["fio"] == {"ioengine": "libaio", "direct": True, "sync": False}
    # no patterns: an empty object (a version 1 plan without the key reads the same)
    assert plan_of(config(patterns={}))["patterns"] == {}


def test_workloads_are_the_main_cells_and_every_patterns_cells_sorted():
    cells = workloads(plan_of(config()))
    ids = [w.id for w in cells]
    assert cells == sorted(cells) and len(ids) == len(set(ids)) == 2 + 8 + 2
    assert {w.id for w in cells if not w.pattern} == {"randread-4k-qd1", "randread-4k-qd32"}
    assert "randwrite-1m-qd1-largeblock" in ids and "randread-4k-qd1-largeblock" in ids
    assert {w.id for w in cells if w.pattern == "sync"} == {
        "randread-4k-qd1-sync",
        "randwrite-4k-qd1-sync",
    }
    # the same rw/bs/iodepth in the main matrix and a pattern are two cells
    assert Workload("randread", 4096, 1) in cells and Workload("randread", 4096, 1, "sync") in cells


def test_a_bad_pattern_is_refused_naming_the_key():
    plan = plan_of(config())
    cases = [
        (("largeblock", "io_bs", "8q"), r"patterns\.largeblock\.io_bs: '8q' is not a size"),
        (("largeblock", "io_bs", "0k"), r"patterns\.largeblock\.io_bs must be larger than 0"),
        (("largeblock", "fsync_per_block", "yes"), r"patterns\.largeblock\.fsync_per_block"),
        (("sync", "matrix", {"rw": ["read"], "bs": [], "iodepth": [1]}), r"sync\.matrix\.bs"),
        (("sync", "matrix", {"rw": ["read"], "bs": ["4x"], "iodepth": [1]}), r"sync\.matrix\.bs"),
    ]
    for (name, key, value), message in cases:
        bad = copy.deepcopy(plan)
        bad["patterns"][name][key] = value
        with pytest.raises(PlanError, match=message):
            check_plan(bad)
    bad = copy.deepcopy(plan)
    bad["patterns"]["largeblock"]["matrix"]["bs"] = ["4k", "12k", "20k"]
    with pytest.raises(
        PlanError, match=r"largeblock\.matrix\.bs: 12k, 20k not a multiple of io_bs"
    ):
        check_plan(bad)
    bad = copy.deepcopy(plan)
    bad["patterns"]["Large-Block"] = bad["patterns"].pop("largeblock")
    with pytest.raises(PlanError, match=r"'Large-Block' is not a pattern name"):
        check_plan(bad)
    bad = copy.deepcopy(plan)
    bad["patterns"]["sync"]["fio"]["ioengine"] = "posixaio"
    with pytest.raises(PlanError, match=r"patterns\.sync\.fio\.ioengine: 'posixaio'"):
        check_plan(bad)
    # straight from a config (no schema in between): unknown keys name themselves
    raw = {**config(), "patterns": {"sync": {**SYNC, "fio": {"runtime_s": 3}}}}
    with pytest.raises(PlanError, match=r"patterns\.sync\.fio\.runtime_s: not a pattern fio"):
        plan_of(raw)
    raw = {**config(), "patterns": {"sync": {**SYNC, "iodepth": [1]}}}
    with pytest.raises(PlanError, match=r"patterns\.sync\.iodepth: not a pattern setting"):
        plan_of(raw)


def test_the_schema_names_a_bad_pattern_key():
    for patterns, where in (
        ({"largeblock": {"io_bs": "8 KiB"}}, "['largeblock']['io_bs']"),
        ({"Large": {}}, "'Large' does not match"),
        ({"sync": {"fio": {"runtime_s": 3}}}, "'runtime_s' was unexpected"),
    ):
        with pytest.raises(Exception, match="Error validating") as err:
            validate({"patterns": patterns}, str(SCHEMA))
        assert where in str(err.value)


def test_fsync_per_block_on_reads_only_is_fine_and_adds_no_fsync():
    reads = {**LARGEBLOCK, "matrix": {"rw": ["randread"], "bs": ["64k"], "iodepth": [1]}}
    plan = plan_of(config(patterns={"reads": reads}))
    options = cell_options(plan, Workload("randread", 64 * KIB, 1, "reads"))
    assert options["fsync"] == 0 and options["ios_per_block"] == 8


def test_a_block_larger_than_a_stack_is_refused_naming_pattern_cell_and_stack():
    big = {**LARGEBLOCK, "matrix": {"rw": ["randwrite"], "bs": ["1m", "64m"], "iodepth": [1]}}
    # plain: a 64 MiB scratch file; luks: 16 MiB less (the LUKS2 header)
    with pytest.raises(PlanError) as err:
        plan_of(config(patterns={"largeblock": big}))
    message = str(err.value)
    assert "pattern largeblock: cell randwrite-64m-qd1-largeblock" in message
    assert "stack luks" in message and "patterns.largeblock.matrix.bs" in message
    # an fs layer's file_size_mib, the sizes of scratch devices and md arithmetic count too
    stacks = {
        "raid0": {"kind": "md", "level": 0, "members": ["d0", "d1"]},
        "ext4": {"kind": "fs", "file_size_mib": 48, "over": "d2"},
    }
    devices = {f"d{i}": {"size_mib": 64} for i in range(3)}
    cfg = config(stacks=stacks, devices=devices, baseline="raid0")
    cfg["patterns"] = {"largeblock": {**big, "matrix": {**big["matrix"], "bs": ["32m"]}}}
    assert plan_of(cfg)["patterns"]
    cfg["patterns"]["largeblock"]["matrix"]["bs"] = ["64m"]
    with pytest.raises(
        PlanError, match=r"cell randwrite-64m-qd1-largeblock: .* stack ext4 \(at most 48 MiB"
    ):
        plan_of(cfg)
    # real disks: the size is not known at plan time, fio_argv checks it before fio runs
    cfg["devices"] = {f"d{i}": {"path": f"/dev/disk/by-id/pytest-{i}"} for i in range(3)}
    cfg["stacks"]["ext4"]["file_size_mib"] = 0  # 90 % of a filesystem of unknown size
    plan = plan_of(cfg)
    w = Workload("randwrite", 64 * MIB, 1, "largeblock")
    with pytest.raises(TestboxError, match=r"pattern largeblock: cell .*-largeblock on stack ext4"):
        fio_argv(plan, {"device": "/mnt/x/fio.dat"}, "ext4", w, Path("/o"), 48 * MIB)
    assert fio_argv(plan, {"device": "/mnt/x/fio.dat"}, "ext4", w, Path("/o"), 64 * MIB)


# --- run identity ----------------------------------------------------------------------------------


def test_a_patterns_fio_options_are_part_of_the_run_identity(tmp_path):
    measured = plan_of(config(), tmp_path)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"plan": measured}))
    # more cells: a larger pattern matrix, a new pattern, a changed description
    grown = config()
    grown["patterns"]["largeblock"]["matrix"]["bs"] += ["2m"]
    grown["patterns"]["largeblock"]["description"] = "reworded"
    grown["patterns"]["more"] = copy.deepcopy(SYNC)
    validate(grown, str(SCHEMA))  # the new pattern's defaults filled
    assert plan_changes(measured, plan_of(grown, tmp_path)) == []
    write_plan(plan_of(grown, tmp_path), tmp_path / "plan.json", measured_env=env)
    # how a cell is measured: refused, naming the key
    for key, value, shown in (
        ("io_bs", "16k", "patterns.largeblock.io_bs: '8k' -> '16k'"),
        ("fsync_per_block", False, "patterns.largeblock.fsync_per_block: True -> False"),
        ("fio", {"ioengine": "psync", "direct": True}, "patterns.largeblock.fio.direct"),
    ):
        changed = config()
        changed["patterns"]["largeblock"][key] = value
        with pytest.raises(PlanError, match="new run name") as err:
            write_plan(plan_of(changed, tmp_path), tmp_path / "plan2.json", measured_env=env)
        assert shown in str(err.value)
    # an inherited option changes with the top-level fio section (already a measurement key)
    other = config(fio={"runtime_s": 1, "ramp_time_s": 0, "ioengine": "io_uring"})
    changes = plan_changes(measured, plan_of(other, tmp_path))
    assert "fio.ioengine: 'libaio' -> 'io_uring'" in changes
    assert not any(c.startswith("patterns.") for c in changes)  # sync, largeblock set their own


def test_a_run_measured_before_patterns_existed_can_be_resumed(tmp_path):
    current = plan_of(config(patterns={}), tmp_path)
    assert current["patterns"] == {}
    old = {k: v for k, v in current.items() if k not in ("patterns", "version")}  # a version 1 plan
    assert plan_changes(old, plan_of(config(patterns={}), tmp_path)) == []
    assert plan_changes(old, plan_of(config(), tmp_path)) == []  # patterns add cells


# --- the fio command line -------------------------------------------------------------------------


def argv_of(plan: dict, w: Workload, io_size: int = 64 * MIB) -> list[str]:
    return fio_argv(plan, {"device": "/dev/loop9"}, "plain", w, Path("/o/rep1.json"), io_size)


def test_fio_argv_of_a_large_block_cell():
    plan = plan_of(config())
    assert argv_of(plan, Workload("randwrite", MIB, 1, "largeblock")) == [
        "fio",
        "--output-format=json+",
        "--output=/o/rep1.json",
        "--name=plain-randwrite-1m-qd1-largeblock",
        "--filename=/dev/loop9",
        "--rw=randwrite:128",
        "--rw_sequencer=sequential",
        f"--blockalign={MIB}",
        "--norandommap",
        "--bs=8192",
        "--iodepth=1",
        "--ioengine=psync",
        "--direct=0",
        "--fsync=128",
        "--time_based",
        "--runtime=1s",
        "--ramp_time=0s",
        "--numjobs=1",
        "--group_reporting",
        f"--size={64 * MIB}",
    ]
    read = argv_of(plan, Workload("randread", MIB, 1, "largeblock"))
    assert "--rw=randread:128" in read and not any(a.startswith("--fsync") for a in read)
    # a block not larger than io_bs is one I/O of its size, with an fsync after each write
    small = argv_of(plan, Workload("randwrite", 4 * KIB, 1, "largeblock"))
    assert "--rw=randwrite" in small and "--bs=4096" in small and "--fsync=1" in small
    assert not any(a.startswith(("--rw_sequencer", "--blockalign")) for a in small)
    same = argv_of(plan, Workload("randwrite", 8 * KIB, 1, "largeblock"))
    assert "--rw=randwrite" in same and "--bs=8192" in same and "--fsync=1" in same


def test_fio_argv_of_sync_main_and_sequential_cells():
    plan = plan_of(config())
    sync = argv_of(plan, Workload("randwrite", 4 * KIB, 1, "sync"))
    assert "--ioengine=psync" in sync and "--direct=1" in sync and "--sync=1" in sync
    assert not any(a.startswith("--fsync") for a in sync)
    main = argv_of(plan, Workload("randread", 4 * KIB, 32))
    assert "--ioengine=libaio" in main and "--direct=1" in main and "--rw=randread" in main
    assert not any(a.startswith(("--sync", "--fsync", "--blockalign")) for a in main)
    seq = {**LARGEBLOCK, "matrix": {"rw": ["write"], "bs": ["64k"], "iodepth": [1]}}
    plan = plan_of(config(patterns={"seq": seq}))
    argv = argv_of(plan, Workload("write", 64 * KIB, 1, "seq"))
    assert "--rw=write" in argv and "--bs=8192" in argv and "--fsync=8" in argv
    assert not any(a.startswith(("--rw_sequencer", "--blockalign")) for a in argv)
    # the span must hold one block
    with pytest.raises(TestboxError, match="cell randwrite-1m-qd1-largeblock on stack plain"):
        argv_of(plan_of(config()), Workload("randwrite", MIB, 1, "largeblock"), 512 * KIB)


# --- plan description -------------------------------------------------------------------------------


def test_the_plan_lists_each_pattern_with_its_cells_description_and_fio_options():
    lines = describe_plan(plan_of(config()))
    text = "\n".join(lines)
    assert lines[0].endswith("2 stacks x 12 cells x 3 repetitions = 72 fio runs")
    assert (
        "  main matrix: 2 cells (randread x 4k (1 sizes) x qd1/32), fio: libaio, O_DIRECT" in lines
    )
    assert "  pattern largeblock: 8 cells (randread/randwrite x 4k..1m (4 sizes) x qd1)" in lines
    assert f"    {LARGEBLOCK['description']}" in lines
    block = next(line for line in lines if line.startswith("    fio: psync, buffered"))
    assert "8k I/Os at sequential offsets" in block and "fsync after every block" in block
    assert "  pattern sync: 2 cells (randread/randwrite x 4k (1 sizes) x qd1)" in lines
    assert "    fio: psync, O_DIRECT, O_SYNC writes (sync=1)" in lines
    assert "  cell randwrite-1m-qd1-largeblock" in lines and "  cell randread-4k-qd1-sync" in text


# --- ingest -----------------------------------------------------------------------------------------


def test_the_shipped_sample_still_ingests_with_the_new_columns():
    fio = ingest.fio_table(REPO / "data" / "raw" / "sample")
    assert len(fio) and set(fio["pattern"]) == {""}
    assert (fio["io_bs_bytes"] == fio["bs_bytes"]).all()
    columns = list(fio.columns)
    assert columns.index("pattern") == columns.index("workload") + 1
