"""A fixed-rate pattern for real: loop devices here, both stacks at one rate from a pilot, the
rate held, CPU net of the idle baseline with utilisation and CPU per I/O, a resumed run keeping
its rate."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from testkit.testbox import loop_plan, run_fio_args
from testkit.testbox import testbox as tb

from luksbench.analysis import cpucost, ingest
from luksbench.analysis.loss import write_loss

pytestmark = pytest.mark.device

CELL = "randread-4k-qd1-fixedrate"
FIXED = {
    "description": "both stacks at a tenth of the slower stack's pilot IOPS",
    "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1]},
    "io_bs": "",
    "fsync_per_block": False,
    "rate_pct": 10,
    "fio": {"ioengine": "libaio", "direct": True, "sync": False},
}


def measure(tmp_path, run: str, reps: int) -> tuple[dict, str]:
    plan = loop_plan(run, tmp_path / "scratch", repetitions=reps, patterns={"fixedrate": FIXED})
    plan["fio"]["runtime_s"] = 2
    path, state = tmp_path / "plan.json", tmp_path / "state.json"
    path.write_text(json.dumps(plan))
    host_dir = tmp_path / "raw" / run / "h"
    manifest = host_dir / "fio" / "manifest.json"
    tb("stack-up", "--plan", path, "--state", state, "--describe", tmp_path / "stacks.json")
    try:
        done = tb(*run_fio_args(path, state, host_dir, manifest), timeout=600)
    finally:
        down = tb("stack-down", "--state", state, "--record", tmp_path / "down.json", check=False)
    assert down.returncode == 0, down.stderr
    return json.loads(manifest.read_text()), done.stderr


def held(runs: pd.DataFrame, rate: int) -> bool:
    """fio throttled every run to the rate (unthrottled it runs at ten times the rate), and each
    stack reached it: its fastest run within 5 %. Any one run may fall well short: on this shared
    box a load spike on the other core can cut a 2-second run to 70 % of the rate, and the I/Os
    it missed are not made up."""
    ratio = runs["iops"] / rate
    fastest = ratio.groupby(runs["stack"]).max()
    return bool((ratio <= 1.05).all() and (fastest > 0.95).all())


def test_a_fixed_rate_cell_holds_one_rate_on_both_stacks_and_reports_cpu_per_io(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("device tests need root", pytrace=False)
    run = f"rate{os.getpid()}"
    manifest, log = measure(tmp_path, run, reps=2)
    rate = manifest["fixed_rates"][CELL]
    assert rate["rate_pct"] == 10 and set(rate["pilot_iops"]) == {"plain", "other"}
    assert rate["rate_iops"] == int(0.1 * min(rate["pilot_iops"].values()))
    assert rate["rate_iops_per_job"] == rate["rate_iops"]  # one job
    assert f"fixed-rate cell {CELL}: {rate['rate_iops']} IOPS on every stack" in log
    raw = tmp_path / "raw" / run
    fio = ingest.fio_table(raw, workers=1)
    fixed = fio[(fio["workload"] == CELL) & (fio["direction"] == "read")]
    assert len(fixed) == 4  # 2 stacks x 2 repetitions
    assert held(fixed, rate["rate_iops"]), fixed[["stack", "iops"]]
    # CPU net of the session's idle baseline, utilisation and CPU per I/O beside CPU per GiB
    assert fixed["idle_busy_cpu_s"].notna().all() and fio["cpu_net"].all()
    net = fixed["busy_cpu_s"] - fixed["idle_busy_cpu_s"]
    ios = fixed["io_bytes"] / fixed["io_bs_bytes"]
    assert fixed["busy_cpu_us_per_io"].to_numpy() == pytest.approx((1e6 * net / ios).to_numpy())
    assert fixed["cpu_util_pct"].notna().all()
    processed = tmp_path / "processed"
    ingest.write_processed(raw, processed, workers=1)
    write_loss(processed, baseline="plain", variant="other")
    cpu = pd.read_parquet(processed / "cpu_loss.parquet").to_dict("records")
    per_io = [r for r in cpu if r["workload"] == CELL and r["metric"] == "busy_cpu_us_per_io"]
    # on a busy shared box a run can use less CPU than the idle baseline did: its net CPU is
    # not positive, and the cell has no interval (never an interval from the higher runs only)
    assert len(per_io) == 1 and per_io[0]["derived_from"] == "busy_cpu_s_per_gib"
    within_noise = (net <= 0).any()
    assert per_io[0]["n"] == (0 if within_noise else 2)
    assert per_io[0]["note"] == (cpucost.NOT_ABOVE_IDLE if within_noise else "")
    assert {"cpu_util_pct", "busy_cpu_s_per_gib"} <= {r["metric"] for r in cpu}
    # a resumed run (one more repetition) keeps the recorded rate: no second pilot
    manifest, log = measure(tmp_path, run, reps=3)
    assert manifest["fixed_rates"][CELL] == rate and "fixed-rate cell" not in log
    third = ingest.fio_table(raw, workers=1)
    third = third[
        (third["workload"] == CELL) & (third["rep"] == 3) & (third["direction"] == "read")
    ]
    # throttled at the recorded rate (one run per stack: whether it reached it is load's to say)
    assert len(third) == 2 and (third["iops"] <= 1.05 * rate["rate_iops"]).all(), third["iops"]
