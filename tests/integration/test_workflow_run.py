"""The whole workflow for real: a tiny run measured with fio on both arms, published, resumed,
and torn down after a failure.

These tests build real stacks (the userspace backend on this kernel, the kernel backend where
dm-crypt exists) and run real fio; they take a minute or two.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import sys
from pathlib import Path

import pytest
from testkit.workflow import (
    SMALL_RUN,
    copy_workflow,
    our_mounts,
    our_processes,
    rep_files,
    snakemake,
)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.device, pytest.mark.slow]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A copy of the workflow (not the raw data) to run in, so tests never touch the repo's data."""
    work = copy_workflow(tmp_path_factory.mktemp("workflow"))
    (work / "small.yaml").write_text(SMALL_RUN)
    return work


def test_a_small_run_is_measured_and_published(workdir):
    result = snakemake(workdir, "all")
    assert result.returncode == 0, result.stderr[-4000:]

    host_dirs = list((workdir / "data" / "raw" / "e2e").iterdir())
    assert len(host_dirs) == 1
    host_dir = host_dirs[0]
    env = json.loads((host_dir / "env.json").read_text())
    assert env["backend"]["selected"] in ("kernel", "userspace")
    assert (host_dir / "cryptsetup-benchmark.txt").stat().st_size > 0

    reps = rep_files(workdir)
    assert len(reps) == 2 * 2 * 3  # stacks x cells x repetitions
    for path in reps:
        assert not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), path
        assert path.with_name(path.name.replace(".json", ".cpu.json")).exists()

    processed = workdir / "data" / "processed" / "e2e"
    for table in ("fio", "loss", "env", "cryptsetup"):
        assert (processed / f"{table}.parquet").stat().st_size > 0
    assert list((workdir / "figures" / "e2e").glob("*.png"))
    paper = (workdir / "paper" / "e2e" / "index.md").read_text()
    assert "randread" in paper and "write" in paper
    assert not re.search(r"\bnan\b", paper, re.IGNORECASE), "a missing value leaked into the paper"
    # the digest of the raw files ingest recorded is the one after the run: nothing left to do
    again = snakemake(workdir, "-n", "all")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]

    assert our_mounts(workdir) == []
    assert our_processes(workdir) == []


def test_a_rerun_with_more_repetitions_measures_only_the_missing_ones(workdir):
    before = rep_files(workdir)
    assert before, "needs the run of the previous test"
    # up to the ingested table: the measuring is what this test is about, publishing is the first's
    target = "data/processed/e2e/fio.parquet"
    result = snakemake(workdir, target, "--config", "repetitions=4")
    assert result.returncode == 0, result.stderr[-4000:]
    after = rep_files(workdir)
    assert len(after) == 2 * 2 * 4
    for path, (mtime, content) in before.items():
        assert after[path] == (mtime, content), f"{path} was rewritten"
    assert our_mounts(workdir) == []


def test_changing_fio_options_of_a_measured_run_is_refused(workdir):
    before = rep_files(workdir)
    (workdir / "longer.yaml").write_text("fio:\n  runtime_s: 2\n")
    result = snakemake(
        workdir, "all", "--config", "repetitions=4", configfiles=("small.yaml", "longer.yaml")
    )
    assert result.returncode != 0
    assert "fio.runtime_s: 1 -> 2" in result.stderr
    assert rep_files(workdir) == before


def test_a_failed_fio_run_tears_down_and_keeps_what_was_measured(workdir, tmp_path):
    """The third measurement fails: the stacks come down, finished repetitions stay, a re-run resumes."""
    real_fio = shutil.which("fio")
    shim = tmp_path / "bin"
    shim.mkdir()
    counter = tmp_path / "calls"
    # Fault injection only: every call but the third measurement (--output=) runs the real fio.
    (shim / "fio").write_text(
        "#!/bin/sh\n"
        'case "$*" in *--output=*)\n'
        f"  echo x >> {counter}\n"
        f'  if [ "$(wc -l < {counter})" -eq 3 ]; then echo "fio: injected failure" >&2; exit 1; fi;;\n'
        "esac\n"
        f'exec {real_fio} "$@"\n'
    )
    (shim / "fio").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}

    result = snakemake(workdir, "all", "--config", "run=e2e-fail", env=env)
    assert result.returncode != 0
    assert "injected failure" in result.stderr
    assert our_mounts(workdir) == []
    assert our_processes(workdir) == []
    assert not list((workdir / "data" / "scratch" / "e2e-fail").glob("*/state.json"))
    kept = rep_files(workdir, "e2e-fail")
    assert kept, "repetitions finished before the failure must be kept"

    result = snakemake(workdir, "data/processed/e2e-fail/fio.parquet", "--config", "run=e2e-fail")
    assert result.returncode == 0, result.stderr[-4000:]
    after = rep_files(workdir, "e2e-fail")
    for path, before in kept.items():
        assert after[path] == before
    # The failed run's partner, measured in the first stack-up, stays a half pair: the re-run is
    # a new session and measures a whole new pair of that cell instead.
    assert len(after) == 2 * 2 * 3 + 1
    import pandas as pd

    fio = pd.read_parquet(workdir / "data" / "processed" / "e2e-fail" / "fio.parquet")
    pairs = fio.groupby(["workload", "session", "rep"])["stack"].nunique()
    assert (pairs == 2).sum() == 2 * 3 and (pairs == 1).sum() == 1
    assert our_mounts(workdir) == []


ADAPTIVE_RUN = """\
run: e2e-adapt
adaptive:
  enabled: true
  pilot_pairs: 2
  max_pairs: 4
  target_half_width_pct: 0.5
"""


def test_an_adaptive_run_measures_the_pilot_then_tops_cells_up_to_their_targets(workdir):
    """Two stages on real stacks: the pilot's pairs, targets from the pilot, each cell topped up;
    the loss table reports each cell's pairs and which cells hit the cap (noisy)."""
    (workdir / "adaptive.yaml").write_text(ADAPTIVE_RUN)
    host = socket.gethostname().split(".")[0]
    target = "data/processed/e2e-adapt/loss.parquet"
    result = snakemake(workdir, target, configfiles=("small.yaml", "adaptive.yaml"))
    assert result.returncode == 0, result.stderr[-4000:]
    host_dir = workdir / "data" / "raw" / "e2e-adapt" / host
    doc = json.loads((host_dir / "fio" / "targets.json").read_text())
    pairs = doc["pairs"]
    assert set(pairs) == {"randread-4k-qd4", "write-4k-qd4"}
    assert all(2 <= n <= 4 for n in pairs.values())
    assert doc["noisy"] == [w for w, c in doc["cells"].items() if c["capped"]]
    pilot = json.loads((host_dir / "fio" / "pilot-manifest.json").read_text())
    assert {r["rep"] for r in pilot["runs"]} == {1, 2}
    manifest = json.loads((host_dir / "fio" / "manifest.json").read_text())
    assert manifest["cell_repetitions"] == pairs and manifest["complete"]
    for w, n in pairs.items():
        for stack in ("plain", "luks"):
            reps = sorted(p.name for p in (host_dir / "fio" / stack / w).glob("rep?.json"))
            assert reps == [f"rep{k}.json" for k in range(1, n + 1)], (stack, w)
    import pandas as pd

    loss = pd.read_parquet(workdir / "data" / "processed" / "e2e-adapt" / "loss.parquet")
    for w, n in pairs.items():
        rows = loss[loss["workload"] == w]
        assert (rows["n"] == n).all() and (rows["target_pairs"] == n).all()
        assert (rows["noisy"] == (w in doc["noisy"])).all()
        # the workflow's loss table gives these cells Stein's interval on their 2 pilot pairs
        measured = rows[rows["n"] >= 2]
        assert len(measured) and (measured["interval"] == "stein").all()
        assert (measured["pilot_pairs"] == 2).all() and measured["decision"].notna().all()
    assert our_mounts(workdir) == []
    assert our_processes(workdir) == []


SESSIONS_RUN = """\
run: e2e-sessions
repetitions: 2
sessions: 2
"""


def test_a_two_session_run_measures_each_session_on_its_own_stacks(workdir):
    """`sessions: 2` through the workflow: two stack-ups, each with its pairs, the loss table's
    intervals over the sessions, the paper saying what they cover."""
    (workdir / "sessions.yaml").write_text(SESSIONS_RUN)
    host = socket.gethostname().split(".")[0]
    result = snakemake(workdir, "all", configfiles=("small.yaml", "sessions.yaml"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "building the stacks afresh" in result.stderr
    records = sorted(
        (workdir / "data" / "raw" / "e2e-sessions" / host / "fio" / "sessions").glob("*")
    )
    docs = [json.loads(p.read_text()) for p in records]
    assert len({d["session"] for d in docs}) == 2 and docs[-1]["complete"]
    import pandas as pd

    loss = pd.read_parquet(workdir / "data" / "processed" / "e2e-sessions" / "loss.parquet")
    bw = loss[loss["metric"] == "bw_bytes"]
    assert (bw["interval"] == "sessions").all() and (bw["sessions"] == 2).all()
    assert (bw["n"] == 4).all()
    paper = (workdir / "paper" / "e2e-sessions" / "index.md").read_text()
    assert "cover sessions" in paper
    again = snakemake(workdir, "-n", "all", configfiles=("small.yaml", "sessions.yaml"))
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
    assert our_mounts(workdir) == []
    assert our_processes(workdir) == []
