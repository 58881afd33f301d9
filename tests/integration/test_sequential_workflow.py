"""The sequential design in the workflow for real: a tiny run measured in rounds with a budget,
interrupted and resumed, published; the dry run shows the budget and the worst case."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import pytest
from testkit.paths import BIN
from testkit.workflow import SMALL_RUN, copy_workflow, our_mounts, rep_files, snakemake

pytestmark = [pytest.mark.device, pytest.mark.slow]

SEQUENTIAL_RUN = """\
run: e2e-seq
adaptive:
  enabled: true
  mode: sequential
  min_pairs: 2
  max_pairs: 5
  budget_h: 0.01
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("workflow"))
    (work / "small.yaml").write_text(SMALL_RUN)
    (work / "sequential.yaml").write_text(SEQUENTIAL_RUN)
    return work


CONFIGS = ("small.yaml", "sequential.yaml")


def test_the_dry_run_shows_the_budget_and_the_worst_case(workdir):
    result = snakemake(workdir, "-n", "all", configfiles=CONFIGS)
    assert result.returncode == 0, result.stderr[-3000:]
    # 2 cells x 5 pairs x 2 stacks x 1 s
    line = "sequential: rounds until every cell is decided; budget 0.01 h, worst case 0.01 h"
    assert line in result.stdout + result.stderr


def test_rounds_resume_after_an_interruption_and_publish(workdir):
    host_dir = workdir / "data" / "raw" / "e2e-seq" / socket.gethostname().split(".")[0]
    targets = host_dir / "fio" / "targets.json"
    cmd = [str(BIN / "snakemake"), "--cores", "1", "all", "--configfile", *CONFIGS]
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if targets.exists() and len(json.loads(targets.read_text())["looks"]) >= 2:
            break  # the second look was taken: stop during its round
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    before = rep_files(workdir, "e2e-seq")
    assert before and not json.loads(targets.read_text())["done"], err.decode()[-3000:]
    assert our_mounts(workdir) == []

    result = snakemake(workdir, "all", configfiles=CONFIGS)
    assert result.returncode == 0, result.stderr[-4000:]
    after = rep_files(workdir, "e2e-seq")
    assert all(after[p] == v for p, v in before.items())  # nothing measured twice
    doc = json.loads(targets.read_text())
    from luksbench.analysis.boundary import level_at

    level = level_at("pocock", 0.95, 2, 5, 5)  # the default boundary's level, 4 looks
    assert doc["done"] and doc["budget_s"] == 36 and doc["look_confidence"] == pytest.approx(level)
    assert all(c["why"].startswith("stop") for c in doc["cells"].values())
    assert all(2 <= c["n"] <= 5 for c in doc["cells"].values())
    assert "device time spent" in result.stderr and "cells decided" in result.stderr
    import pandas as pd

    loss = pd.read_parquet(workdir / "data" / "processed" / "e2e-seq" / "loss.parquet")
    assert (loss["interval"] == "sequential").all()
    assert loss["fixed3_pairs"].between(2, 3).all() and loss["device_seconds"].gt(0).all()
    paper = (workdir / "paper" / "e2e-seq" / "index.md").read_text()
    assert "Sequential design" in paper and "default design, 3 pairs at its plain" in paper
    again = snakemake(workdir, "-n", "all", configfiles=CONFIGS)
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
    assert our_mounts(workdir) == []
