"""Snakemake executor profiles for clusters: profiles/slurm and profiles/kubernetes dry-run.

What a dry run checks here, with the real executor plugins installed: the profile parses, every
key is an option the installed Snakemake and plugin know (a misspelt key fails the run), the
resources and the per-host group job resolve, and the whole DAG of a new run builds. What it
cannot check: submission. A dry run uses Snakemake's own dry-run executor, so sbatch is never
called and no Kubernetes API is contacted (there is no cluster here).

Kubernetes shares no filesystem between jobs, so Snakemake needs a storage provider: the profile
uses snakemake-storage-plugin-fs rooted on a persistent volume. The test stands in for that
volume with a folder holding a copy of the repository, as the profile's comment tells operators.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from testkit.workflow import copy_workflow, job_counts

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MEASURING_RULES = {
    "write_plan",
    "capture_env",
    "benchmark_ciphers",
    "stack_up",
    "run_fio",
    "stack_down",
}
ALL_JOBS = {
    **dict.fromkeys(MEASURING_RULES, 1),
    "ingest_raw": 1,
    "compute_loss": 1,
    "plot_figures": 1,
    "render_paper": 1,
    "all": 1,
}


def dry_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "snakemake"), "-n", "all", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )


def group_rules(output: str) -> set[str]:
    """Rules listed inside the dry run's 'Group job testbox' block."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "Group job testbox" in line)
    rules = set()
    for line in lines[start + 1 :]:
        if line.startswith(("[", "Job stats", "Reasons")):  # the next top-level job, the summary
            break
        if line.strip().startswith("rule "):
            rules.add(line.strip()[5:].rstrip(":"))
    return rules


@pytest.mark.parametrize("name", ["slurm", "kubernetes"])
def test_profile_declares_the_testbox_group(name):
    profile = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    assert profile["executor"] == name
    groups = dict(g.split("=") for g in profile["groups"])
    assert set(groups) >= MEASURING_RULES and set(groups.values()) == {"testbox"}
    assert "run_fio" in profile["set-resources"]


def test_slurm_profile_dry_runs(tmp_path):
    work = copy_workflow(tmp_path / "wf", extra=("profiles",))
    run = f"pytest-slurm-{uuid.uuid4().hex[:8]}"
    result = dry_run(work, "--profile", "profiles/slurm", "--config", f"run={run}")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert job_counts(out) == ALL_JOBS
    assert group_rules(out) == MEASURING_RULES  # one allocation measures a host start to end
    run_fio = out.split("rule run_fio:")[1].split("rule ")[0]
    assert "slurm_partition=batch" in run_fio and "slurm_extra=--exclusive" in run_fio
    assert "cpus_per_task=2" in run_fio and "runtime=720" in run_fio
    assert not (work / "data" / "raw" / run).exists()


def test_kubernetes_profile_dry_runs_against_its_storage(tmp_path):
    work = copy_workflow(tmp_path / "wf", extra=("profiles",))
    volume = copy_workflow(tmp_path / "volume")  # the repository cloned onto the shared volume
    run = f"pytest-k8s-{uuid.uuid4().hex[:8]}"
    args = ("--profile", "profiles/kubernetes", "--config", f"run={run}")
    result = dry_run(work, *args, "--default-storage-prefix", str(volume))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert job_counts(out) == ALL_JOBS
    assert group_rules(out) == MEASURING_RULES
    assert f"{volume}/notebooks/01-ingest.ipynb (retrieve from storage)" in out
    assert f"{volume}/paper/{run}/index.md (send to storage)" in out

    # without the repository on the volume the plan cannot start: the inputs are named
    empty = tmp_path / "empty-volume"
    empty.mkdir()
    result = dry_run(work, *args, "--default-storage-prefix", str(empty))
    assert result.returncode != 0
    assert f"{empty}/notebooks/01-ingest.ipynb (in storage)" in result.stdout + result.stderr


def test_a_misspelt_profile_key_fails(tmp_path):
    work = copy_workflow(tmp_path / "wf", extra=("profiles",))
    config = work / "profiles" / "slurm" / "config.yaml"
    config.write_text(config.read_text().replace("latency-wait:", "latency-wiat:"))
    result = dry_run(work, "--profile", "profiles/slurm")
    assert result.returncode != 0
    assert "latency-wiat" in result.stdout + result.stderr
