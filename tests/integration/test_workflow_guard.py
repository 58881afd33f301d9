"""What a careless or hostile config or command line cannot do to a run: run its own commands
through a path, or rewrite the raw data of a measured run (real snakemake runs, real stacks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from testkit.workflow import copy_workflow

BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.device, pytest.mark.slow]

TINY_RUN = """\
run: guard
host: tb
device_size_mib: 64
matrix: {rw: [randread], bs: [4k], iodepth: [1]}
fio: {runtime_s: 1, ramp_time_s: 0}
repetitions: 1
"""


def snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "snakemake"), "--cores", "1", *args, "--configfile", "tiny.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )


def raw_files(work: Path) -> dict[Path, tuple[int, bytes]]:
    raw = work / "data" / "raw" / "guard"
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in raw.rglob("*") if p.is_file()}


def test_a_scratch_dir_with_a_space_and_a_command_in_it_is_only_a_path(tmp_path):
    work = copy_workflow(tmp_path / "work")
    scratch = "scratch dir $(touch pwned)"
    (work / "tiny.yaml").write_text(f"{TINY_RUN}scratch_dir: '{scratch}'\n")
    result = snakemake(work, "data/raw/guard/tb/env.json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (work / scratch / "guard" / "tb" / "plan.json").exists()
    assert not list(tmp_path.rglob("pwned")), "a command in a config path was run"


def test_forceall_re_analyses_a_measured_run_without_rewriting_its_raw_data(tmp_path):
    """Raw outputs of a measured run (env.json, the cipher benchmark, the fio results and
    manifest) have no rule that writes them once they are final: even --forceall only
    re-analyses. The scratch path has a space, as a user's home may."""
    work = copy_workflow(tmp_path / "work")
    (work / "tiny.yaml").write_text(f"{TINY_RUN}scratch_dir: 'my scratch'\n")
    fio_table = "data/processed/guard/fio.parquet"
    first = snakemake(work, fio_table)
    assert first.returncode == 0, first.stderr[-3000:]
    measured = raw_files(work)
    names = {p.name for p in measured}
    assert {"env.json", "cryptsetup-benchmark.txt", "manifest.json", "rep1.json"} <= names

    again = snakemake(work, fio_table, "--forceall")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "rule ingest_raw" in again.stderr
    for rule in ("capture_env", "benchmark_ciphers", "stack_up", "run_fio"):
        assert f"rule {rule}" not in again.stderr
    assert raw_files(work) == measured, "raw data of the measured run was rewritten"
