"""Pattern cells for real: fio on a file, ingest of its results, a loop device and ext4."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from testkit.plans import KIB, LARGEBLOCK, MIB, validated
from testkit.plans import pattern_config as config
from testkit.plans import pattern_plan as plan_of
from testkit.testbox import run_fio_args
from testkit.testbox import testbox as tb

from luksbench.analysis import ingest
from luksbench.formats.layout import Workload, fio_rep_path
from luksbench.testbox.planbuild import (
    check_patterns,
    plan_from_config,
    workloads,
)
from luksbench.testbox.runner import fio_argv

# --- what fio really does (fio 3.x here, on a file) ------------------------------------------------


def run_fio_for_real(tmp_path: Path, plan: dict, w: Workload, size: int) -> tuple[dict, list]:
    """fio as the runner starts it, plus --write_iolog, on a file: (JSON job, iolog operations)."""
    target = tmp_path / "target.dat"
    with open(target, "wb") as f:
        f.truncate(size)
    out, iolog = tmp_path / f"{w.id}.json", tmp_path / f"{w.id}.iolog"
    argv = fio_argv(plan, {"device": str(target)}, "plain", w, out, size)
    subprocess.run([*argv, f"--write_iolog={iolog}"], check=True, capture_output=True, timeout=60)
    text = out.read_text()
    job = json.loads(text[text.index("{") :])["jobs"][0]
    ops = []
    for line in iolog.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 5 and fields[2] in ("read", "write", "sync"):
            ops.append((fields[2], int(fields[3]), int(fields[4])))
    return job, ops


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_writes_each_block_as_sequential_io_bs_writes_then_syncs(tmp_path):
    plan = plan_of(config())
    block, n = 64 * KIB, 8
    size = 16 * block
    w = Workload("randwrite", block, 1, "largeblock")
    job, ops = run_fio_for_real(tmp_path, plan, w, size)
    assert job["error"] == 0 and job["job options"]["rw"] == "randwrite:8"
    assert job["job options"]["bs"] == "8192" and job["job options"]["fsync"] == "8"
    # split the log at the syncs: every complete block is n writes of 8 KiB at sequential
    # offsets from a block-aligned start, inside the span; starts differ (one seek per block)
    blocks, current = [], []
    for op, offset, length in ops:
        if op == "sync":
            blocks.append(current)
            current = []
        else:
            assert op == "write" and length == 8 * KIB
            current.append(offset)
    assert len(blocks) >= 20, f"only {len(blocks)} blocks in 1 s"
    for offsets in blocks:
        start = offsets[0]
        assert start % block == 0 and start + block <= size
        assert offsets == [start + i * 8 * KIB for i in range(n)]
    assert len({b[0] for b in blocks}) > 1  # random block starts, not one sequential stream
    assert len(current) < n  # whatever follows the last sync is an unfinished block


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_reads_blocks_without_syncs_and_sync_cells_open_with_o_sync(tmp_path):
    plan = plan_of(config())
    job, ops = run_fio_for_real(
        tmp_path, plan, Workload("randread", 32 * KIB, 1, "largeblock"), MIB
    )
    assert job["error"] == 0 and ops and {op for op, _, _ in ops} == {"read"}
    starts = [offset for i, (_, offset, _) in enumerate(ops) if i % 4 == 0]
    assert all(s % (32 * KIB) == 0 for s in starts)
    assert all(ops[i + 1][1] == ops[i][1] + 8 * KIB for i in range(len(ops) - 1) if (i + 1) % 4)
    job, ops = run_fio_for_real(tmp_path, plan, Workload("randwrite", 4 * KIB, 1, "sync"), MIB)
    assert job["error"] == 0 and job["job options"]["sync"] == "1"
    assert job["job options"]["direct"] == "1" and job["job options"]["ioengine"] == "psync"
    assert {op for op, _, _ in ops} == {"write"}  # O_SYNC: no separate fsync calls


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_ingest_gives_pattern_and_io_bs_of_real_fio_results(tmp_path):
    plan = plan_of(config())
    raw = tmp_path / "raw" / "pt"
    cells = [
        Workload("randwrite", 64 * KIB, 1, "largeblock"),
        Workload("randwrite", 4 * KIB, 1, "largeblock"),
        Workload("randwrite", 4 * KIB, 1, "sync"),
        Workload("randread", 4 * KIB, 32),
    ]
    for w in cells:
        job_dir = tmp_path / w.id
        job_dir.mkdir()
        run_fio_for_real(job_dir, plan, w, MIB)
        dest = fio_rep_path(raw, "box1", "plain", w, 1)
        dest.parent.mkdir(parents=True)
        shutil.copyfile(job_dir / f"{w.id}.json", dest)
    fio = ingest.fio_table(raw).set_index("workload")
    assert str(fio["pattern"].dtype) == "string"
    got = {
        wid: (row["pattern"], row["rw"], int(row["bs_bytes"]), int(row["io_bs_bytes"]))
        for wid, row in fio.iterrows()
    }
    assert got == {
        "randwrite-64k-qd1-largeblock": ("largeblock", "randwrite", 64 * KIB, 8 * KIB),
        "randwrite-4k-qd1-largeblock": ("largeblock", "randwrite", 4 * KIB, 4 * KIB),
        "randwrite-4k-qd1-sync": ("sync", "randwrite", 4 * KIB, 4 * KIB),
        "randread-4k-qd32": ("", "randread", 4 * KIB, 4 * KIB),
    }
    assert fio.loc["randwrite-64k-qd1-largeblock", "bs"] == "8192"  # fio's own option, verbatim


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_ingest_refuses_a_pattern_result_whose_fio_job_ran_another_cell(tmp_path):
    plan = plan_of(config())
    raw = tmp_path / "raw" / "pt"
    w = Workload("randwrite", 64 * KIB, 1, "largeblock")
    run_fio_for_real(tmp_path, plan, w, MIB)
    # filed under a 1m block: fio ran 8 I/Os per block (randwrite:8), not 128
    wrong = fio_rep_path(raw, "box1", "plain", Workload("randwrite", MIB, 1, "largeblock"), 1)
    wrong.parent.mkdir(parents=True)
    shutil.copyfile(tmp_path / f"{w.id}.json", wrong)
    with pytest.raises(ingest.IngestError, match="no fio job matches the folder's workload"):
        ingest.fio_table(raw)


# --- for real: pattern cells through the testbox CLI on loop devices ------------------------------


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_a_fixed_rate_cell_of_two_jobs_runs_at_the_asked_rate_in_all(tmp_path):
    fixed = {"description": "", "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1]}}
    fixed |= {"io_bs": "", "fsync_per_block": False, "rate_pct": 50}
    fixed["fio"] = {"ioengine": "psync", "direct": False, "sync": False, "numjobs": 2}
    fio = validated({"fio": {"ioengine": "libaio", "runtime_s": 3, "ramp_time_s": 1}})["fio"]
    plan = {"fio": fio, "patterns": {"fixedrate": fixed}}
    check_patterns(plan)
    target, out = tmp_path / "target.dat", tmp_path / "out.json"
    target.write_bytes(b"\1" * MIB)  # cached after the first reads: far above the rate here
    w = Workload("randread", 4 * KIB, 1, "fixedrate")
    argv = fio_argv(plan, {"device": str(target)}, "plain", w, out, MIB, rate_iops=500)
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    text = out.read_text()
    jobs = json.loads(text[text.index("{") :])["jobs"]
    # fio holds rate_iops per job: the cell's rate is the sum over its jobs
    assert len(jobs) == 2 and sum(j["read"]["iops"] for j in jobs) == pytest.approx(500, rel=0.05)


def device_plan(tmp: Path, run: str, bs: list[str]) -> Path:
    cfg = config(
        run=run,
        backend="kernel",
        precondition={"enabled": True, "fill_passes": 1},
        baseline="loop",
        stacks={"loop": {"kind": "loop"}, "ext4": {"kind": "fs", "fstype": "ext4", "over": "d0"}},
        devices={"d0": {"size_mib": 64}},
        matrix={"rw": ["randread"], "bs": ["4k"], "iodepth": [1]},
        patterns={"largeblock": {**LARGEBLOCK, "matrix": {**LARGEBLOCK["matrix"], "bs": bs}}},
        repetitions=1,
    )
    plan = plan_from_config(cfg, "tb1", tmp / "scratch")
    path = tmp / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.device
def test_large_block_cells_run_on_a_loop_device_and_ext4(tmp_path):
    """raid5-2012's large-block pattern, small: buffered 8k I/Os per block with fsync, on a loop
    device and on a file on ext4 (md and dm-crypt are not in this kernel: the VM test box)."""
    if os.geteuid() != 0:
        pytest.fail("device tests need root", pytrace=False)
    run = f"pat{os.getpid()}"
    plan = device_plan(tmp_path, run, ["4k", "64k", "16m"])
    state, describe = tmp_path / "state.json", tmp_path / "stacks.json"
    host_dir = tmp_path / "raw" / run / "tb1"
    manifest = host_dir / "fio" / "manifest.json"
    tb("stack-up", "--plan", plan, "--state", state, "--describe", describe)
    try:
        tb(*run_fio_args(plan, state, host_dir, manifest))
    finally:
        down = tb("stack-down", "--state", state, "--record", tmp_path / "down.json", check=False)
    assert down.returncode == 0, down.stderr
    cells = {w.id for w in workloads(json.loads(plan.read_text()))}
    assert set(json.loads(manifest.read_text())["cells"]) == cells
    fio = ingest.fio_table(host_dir.parent)
    assert set(fio["stack"]) == {"loop", "ext4"} and set(fio["workload"]) == cells
    assert (fio["error"] == 0).all() and (fio["io_bytes"] > 0).all()
    big = fio[fio["workload"] == "randwrite-16m-qd1-largeblock"]
    assert set(big["io_bs_bytes"]) == {8 * KIB} and set(big["bs_bytes"]) == {16 * MIB}
    assert set(big["direct"]) == {0} and set(big["ioengine"]) == {"psync"}
    for path in host_dir.glob("fio/*/randwrite-16m-qd1-largeblock/rep1.json"):
        options = json.loads(path.read_text()[path.read_text().index("{") :])["jobs"][0]
        assert options["job options"]["fsync"] == "2048"
        assert options["job options"]["rw"] == "randwrite:2048"


@pytest.mark.device
def test_a_block_larger_than_the_real_span_stops_before_fio_runs(tmp_path):
    """The plan's estimate (90 % of 64 MiB for the ext4 file) lets a 52m block through; ext4's own
    metadata leaves less: the run stops on that cell, naming it, and writes no result for it."""
    if os.geteuid() != 0:
        pytest.fail("device tests need root", pytrace=False)
    run = f"pbig{os.getpid()}"
    plan = device_plan(tmp_path, run, ["52m"])
    state, describe = tmp_path / "state.json", tmp_path / "stacks.json"
    host_dir = tmp_path / "raw" / run / "tb1"
    tb("stack-up", "--plan", plan, "--state", state, "--describe", describe)
    try:
        io_size = json.loads(state.read_text())["io_size_bytes"]
        assert io_size < 52 * MIB
        result = tb(*run_fio_args(plan, state, host_dir, host_dir / "m.json"), check=False)
    finally:
        down = tb("stack-down", "--state", state, "--record", tmp_path / "down.json", check=False)
    assert down.returncode == 0, down.stderr
    assert result.returncode != 0
    assert "pattern largeblock: cell randwrite-52m-qd1-largeblock on stack" in result.stderr
    assert f"({io_size} bytes, the smallest device)" in result.stderr
    assert not list(host_dir.glob("fio/*/*-52m-qd1-largeblock/rep*.json"))
