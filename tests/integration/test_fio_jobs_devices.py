"""fio jobs for real: RAM-backed loop devices (files on tmpfs), one CPU-bound job flagged, several
jobs summed and their histograms merged, io_uring options the device lacks skipped with the reason."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from testkit.testbox import loop_plan, run_fio_args
from testkit.testbox import testbox as tb

from luksbench.analysis import ingest, saturation, stats
from luksbench.analysis.loss import write_loss

pytestmark = pytest.mark.device

CORES = os.cpu_count()
MATRIX = {"rw": ["read"], "bs": ["4k"], "iodepth": [1]}


def pattern(**fio) -> dict:
    base = {"ioengine": "psync", "direct": False, "sync": False}
    return {"description": "", "matrix": MATRIX, "io_bs": "", "fsync_per_block": False,
            "fio": {**base, **fio}}  # fmt: skip


def measure(tmp_path: Path, scratch: Path, run: str) -> Path:
    # Buffered reads of a device whose pages are cached (after the ramp): fio copies them itself.
    plan = loop_plan(run, scratch, repetitions=2, device_size_mib=32)
    plan["matrix"] = MATRIX
    plan["fio"].update(ioengine="psync", direct=False, runtime_s=2, ramp_time_s=1, fixedbufs=True)
    plan["patterns"] = {
        "cores": pattern(numjobs=CORES),
        "uring": pattern(ioengine="io_uring", direct=True, fixedbufs=True, hipri=True),
    }
    path, state = tmp_path / "plan.json", tmp_path / "state.json"
    path.write_text(json.dumps(plan))
    host_dir = tmp_path / "raw" / run / "h"
    tb("stack-up", "--plan", path, "--state", state, "--describe", tmp_path / "stacks.json")
    try:
        tb(*run_fio_args(path, state, host_dir, host_dir / "fio" / "manifest.json"), timeout=600)
    finally:
        down = tb("stack-down", "--state", state, "--record", tmp_path / "down.json", check=False)
    assert down.returncode == 0, down.stderr
    return tmp_path / "raw" / run


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("device tests need root", pytrace=False)
    tmp_path = tmp_path_factory.mktemp("jobs")
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="luksbench-jobs-") as scratch:
        raw = measure(tmp_path, Path(scratch), f"jobs{os.getpid()}")
    processed = tmp_path / "processed"
    ingest.write_processed(raw, processed, workers=1)
    write_loss(processed, baseline="plain", variant="other", metrics=["bw_bytes", "clat_p99_ns"])
    return raw, processed


def raw_jobs(raw: Path, cell: str) -> dict[str, list[dict]]:
    """Result file (relative to the run) -> fio's job entries, as fio wrote them."""
    files = sorted(raw.glob(f"h/fio/*/{cell}/rep*.json"))
    files = [f for f in files if not f.name.endswith(".cpu.json")]
    assert files, cell
    return {str(f.relative_to(raw)): json.loads(f.read_text())["jobs"] for f in files}


def test_one_cpu_bound_job_is_flagged_and_jobs_on_every_core_say_why(measured):
    raw, processed = measured
    fio = pd.read_parquet(processed / "fio.parquet")
    for cell in ("read-4k-qd1", "read-4k-qd1-cores"):
        for file, entries in raw_jobs(raw, cell).items():
            rows = fio[fio["file"] == file]
            sidecar = json.loads((raw / file.replace(".json", ".cpu.json")).read_text())
            busiest = max(e["usr_cpu"] + e["sys_cpu"] for e in entries)
            # the flags follow fio's own CPU per job and the machine's busy share, run by run
            assert rows["fio_bound"].eq(busiest > saturation.JOB_CPU_LIMIT_PCT).all(), file
            busy = sidecar["busy_pct"] >= saturation.BUSY_LIMIT_PCT
            assert rows["cpu_saturated"].eq(busy).all(), file
    loss = pd.read_parquet(processed / "loss.parquet")
    by_cell = loss[loss["metric"] == "bw_bytes"].set_index("workload")
    one, cores = by_cell.loc["read-4k-qd1"], by_cell.loc["read-4k-qd1-cores"]
    # one job copying cached pages is limited by its thread, or (a shared box) by the machine
    assert one["fio_bound"] or one["cpu_saturated"], one[saturation.LOSS_FLAG_COLUMNS]
    # a job per core: no thread is the limit, unless the machine was (the flag says why)
    assert not cores["fio_bound"] or cores["cpu_saturated"], cores[saturation.LOSS_FLAG_COLUMNS]
    plain = fio[(fio["workload"] == "read-4k-qd1") & (fio["stack"] == "plain")]
    assert one["baseline_job_cpu_pct"] == pytest.approx(plain["job_cpu_pct"].max())


def test_several_jobs_keep_their_rows_and_sum_to_the_run(measured):
    raw, processed = measured
    fio = pd.read_parquet(processed / "fio.parquet")
    latency = pd.read_parquet(processed / "latency.parquet")
    reps = stats.rep_values(fio, ["bw_bytes", "iops", "lat_mean_ns", "clat_p99_ns"])
    for file, entries in raw_jobs(raw, "read-4k-qd1-cores").items():
        assert len(entries) == CORES
        rows = fio[fio["file"] == file]
        assert len(rows) == CORES  # one row per job
        stack, rep = rows["stack"].iloc[0], rows["rep"].iloc[0]
        run = reps[(reps["stack"] == stack) & (reps["rep"] == rep)]
        run = run[run["workload"] == "read-4k-qd1-cores"].iloc[0]
        reads = [e["read"] for e in entries]
        assert run["bw_bytes"] == pytest.approx(sum(r["bw_bytes"] for r in reads))
        assert run["iops"] == pytest.approx(sum(r["iops"] for r in reads))
        # the pooled mean latency: every completion weighs the same
        n = np.array([r["lat_ns"]["N"] for r in reads], float)
        pooled = (np.array([r["lat_ns"]["mean"] for r in reads]) * n).sum() / n.sum()
        assert run["lat_mean_ns"] == pytest.approx(pooled, rel=0.01)
        # p99 from the jobs' merged histograms (fio's rule), not a mean of their p99s
        merged: dict[int, int] = {}
        for r in reads:
            for ns, count in r["clat_ns"]["bins"].items():
                merged[int(ns)] = merged.get(int(ns), 0) + count
        ns, counts = zip(*sorted(merged.items()), strict=True)
        p99 = ns[int(np.argmax(np.cumsum(counts) >= 0.99 * sum(counts)))]
        assert run["clat_p99_ns"] == pytest.approx(p99, rel=1e-9)
        run_bins = latency[(latency["stack"] == stack) & (latency["rep"] == rep)]
        assert run_bins[run_bins["workload"] == "read-4k-qd1-cores"]["count"].sum() == sum(counts)


def test_options_the_engine_or_device_lack_are_skipped_with_the_reason(measured):
    raw, _ = measured
    manifest = json.loads((raw / "h" / "fio" / "manifest.json").read_text())
    hipri = set()
    for run in manifest["runs"]:
        jobs, options = run["fio_jobs"], raw_jobs(raw, run["workload"])[f"h/{run['path']}"]
        options = [e["job options"] for e in options]
        if run["workload"].endswith("-uring"):
            # io_uring has fixedbufs; a loop device has no poll queues for hipri
            assert list(jobs["skipped"]) == ["hipri"] and "poll queues" in jobs["skipped"]["hipri"]
            hipri.add(jobs["skipped"]["hipri"])
            assert all(o.get("fixedbufs") == "1" and "hipri" not in o for o in options)
        else:
            assert jobs["skipped"] == {
                "fixedbufs": "ioengine psync has no fixedbufs (io_uring only)"
            }
            assert not any("fixedbufs" in o for o in options)
        assert jobs["numa_node"] is None  # a loop device: sysfs names no node, recorded as such
    # decided once for the cell: every stack's run skipped hipri for the same stack's device
    assert len(hipri) == 1 and next(iter(hipri)).startswith("stack ")
