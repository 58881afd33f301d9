"""Flagged runs measured again, in the workflow for real: a fixed design of 2 pairs on one cell,
measured with fio; one of its runs then reads as fio's "steady state not attained" (written into
its raw file, as nothing in a plan makes real fio flag one), the run's manifest is removed so that
run_fio runs again: it measures nothing the plan asks for, ingests, measures one new pair for the
flagged one, and the loss table uses it. The flagged run's raw file is kept as it was."""

from __future__ import annotations

import json
import stat
import time

import pandas as pd
import pytest
from testkit.workflow import copy_workflow, our_mounts, rep_files, snakemake

from luksbench.testbox import lock

pytestmark = [pytest.mark.device, pytest.mark.slow]

RUN = "e2e-flagged"
CONFIG = f"""\
run: {RUN}
device_size_mib: 64
matrix:
  rw: [randread]
  bs: [4k]
  iodepth: [4]
fio:
  runtime_s: 1
  ramp_time_s: 0
repetitions: 2
remeasure_flagged_max: 1
"""
LOSS = f"data/processed/{RUN}/loss.parquet"


def _measure(work):
    """``snakemake LOSS``, again after waiting while another run (another test) held the box."""
    for _attempt in range(3):
        result = snakemake(work, LOSS)
        logs = "".join(p.read_text() for p in (work / "logs").rglob("*.log"))
        if result.returncode == 0 or "the test box is busy" not in result.stderr + logs:
            return result
        deadline = time.monotonic() + 900
        while lock.holder() is not None and time.monotonic() < deadline:
            time.sleep(1)
    return result


def _mark_unsettled(path) -> bytes:
    """fio's steady-state criterion reported not attained in every job of ``path`` (a raw file,
    read-only as the runner leaves it); the new bytes."""
    doc = json.loads(path.read_text())
    for job in doc["jobs"]:
        job["steadystate"] = {"ss": "iops_slope", "criterion": 0.1, "attained": 0}
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    path.write_text(json.dumps(doc))
    path.chmod(stat.S_IRUSR)
    return path.read_bytes()


def test_a_flagged_run_is_measured_again_and_replaced_in_the_loss_table(tmp_path):
    work = copy_workflow(tmp_path / "workflow")
    (work / "small.yaml").write_text(CONFIG)
    first = _measure(work)
    assert first.returncode == 0, first.stderr[-4000:]
    reps = sorted(rep_files(work, RUN))
    assert len(reps) == 2 * 2, reps  # stacks x pairs: nothing flagged, nothing measured again
    host = reps[0].parents[3]
    doc = json.loads((host / "fio" / "remeasure.json").read_text())
    assert doc["done"] and doc["cells"]["randread-4k-qd4"]["remeasured_pairs"] == 0

    flagged = host / "fio" / "luks" / "randread-4k-qd4" / "rep2.json"
    flagged_bytes = _mark_unsettled(flagged)
    (host / "fio" / "manifest.json").unlink()
    again = _measure(work)
    assert again.returncode == 0, again.stderr[-4000:]

    assert flagged.read_bytes() == flagged_bytes, "the flagged run's raw file is kept"
    names = {(p.parents[1].name, p.name) for p in rep_files(work, RUN)}
    assert names == {(s, f"rep{k}.json") for s in ("plain", "luks") for k in (1, 2, 3)}
    doc = json.loads((host / "fio" / "remeasure.json").read_text())
    assert doc["done"] and doc["pairs"] == {"randread-4k-qd4": 3}
    assert doc["cells"]["randread-4k-qd4"]["remeasured_pairs"] == 1
    loss = pd.read_parquet(work / LOSS)
    row = loss[loss["metric"] == "bw_bytes"].iloc[0]
    assert (row["n"], row["n_ss_not_attained"], row["remeasured_pairs"]) == (2, 1, 1)
    assert "re-measure: 1 flagged pair(s), 1 measured again" in again.stderr
    assert not our_mounts(work)
