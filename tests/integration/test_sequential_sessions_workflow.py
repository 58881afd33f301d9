"""The sequential design over sessions in the workflow for real: a tiny run with sessions 3,
each round measured in a fresh stack-up as its session of the cycle, looks after whole cycles,
nothing left after stack-down."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from testkit.workflow import copy_workflow, our_mounts, our_processes, snakemake

from luksbench.testbox import lock

pytestmark = [pytest.mark.device, pytest.mark.slow]

RUN = """\
run: e2e-seqs
device_size_mib: 64
matrix:
  rw: [randread]
  bs: [4k]
  iodepth: [4, 16]
fio:
  runtime_s: 1
  ramp_time_s: 0
repetitions: 3
sessions: 3
adaptive:
  enabled: true
  mode: sequential
  min_pairs: 3
  max_pairs: 6
  budget_h: 0.01
"""


def take_the_test_box(state: Path) -> dict:
    """The environment of a workflow that holds the test box for ``state``: the lock taken for
    this process's session as soon as no other run holds it (the workflow's steps then keep it,
    stack-down gives it back)."""
    session = {"pid": os.getpid(), "started": lock.started(os.getpid())}
    plan = {"run": "e2e-seqs", "host": state.parent.name, "scratch_dir": str(state.parent)}
    deadline = time.monotonic() + 1200
    while True:
        try:
            lock.acquire(plan, state, session=session)
            return {**os.environ, lock.SESSION_ENV: str(os.getpid())}
        except lock.Locked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_rounds_cycle_three_sessions_each_a_fresh_stack_up(tmp_path):
    work = copy_workflow(tmp_path / "workflow")
    (work / "seqs.yaml").write_text(RUN)
    host = socket.gethostname().split(".")[0]
    teardown = f"data/scratch/e2e-seqs/{host}/teardown.json"
    env = take_the_test_box((work / teardown).with_name("state.json").resolve())
    result = snakemake(work, teardown, env=env, configfiles=("seqs.yaml",))
    assert result.returncode == 0, result.stderr[-4000:]
    fio = work / "data" / "raw" / "e2e-seqs" / host / "fio"
    records = [json.loads(p.read_text()) for p in sorted((fio / "sessions").glob("*.json"))]
    measured = [r for r in records if any(not x["skipped_existing"] for x in r["runs"])]
    # one fresh stack-up per round, each round one session of the cycle, in turn
    ups = [r["stack_up"] for r in measured]
    assert len(set(ups)) == len(ups) >= 3
    labels = [r["session"] for r in measured]
    assert labels[:3] == ["session-1", "session-2", "session-3"]
    assert labels == [f"session-{i % 3 + 1}" for i in range(len(labels))]
    for r in measured:  # a round is one new pair per measured cell
        new = [x for x in r["runs"] if not x["skipped_existing"]]
        assert all(x["session"] == r["session"] for x in new)
        assert len({(x["workload"], x["rep"]) for x in new}) * 2 == len(new)
    doc = json.loads((fio / "targets.json").read_text())
    assert doc["done"] and doc["sessions"] == 3 and doc["boundary"] == "bonferroni"
    # a cell stops only at a look after a whole cycle (3 or 6 pairs), never between
    stops = [
        n
        for look in doc["looks"]
        for n, why in ((c["n"], c["why"]) for c in look["cells"].values())
        if why.startswith("stop")
    ]
    assert stops and set(stops) <= {3, 6}
    assert all(c["n"] in (3, 6) for c in doc["cells"].values())
    record = json.loads((work / teardown).read_text())
    assert record["ok"], record
    assert our_mounts(work) == [] and our_processes(work) == []
