"""The Snakemake workflow: lint, config validation, the DAG, and the plan it hands the test box."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest
from testkit.workflow import copy_workflow, job_counts
from testkit.workflow import snakemake_cli as snakemake

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# the jobs of one run: measuring it (one session), then publishing it
MEASURE_JOBS = {"write_plan": 1, "capture_env": 1, "benchmark_ciphers": 1, "stack_up": 1}
MEASURE_JOBS |= {"run_fio": 1, "stack_down": 1}
ANALYSIS_JOBS = {"ingest_raw": 1, "compute_loss": 1, "plot_figures": 1, "render_paper": 1}


def test_lint_is_clean():
    result = snakemake("--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


def test_dry_run_of_a_new_run_measures_then_publishes():
    run = f"pytest-dry-{uuid.uuid4().hex[:8]}"
    result = snakemake("-n", "all", "--config", f"run={run}")
    assert result.returncode == 0, result.stderr
    assert job_counts(result.stdout + result.stderr) == MEASURE_JOBS | ANALYSIS_JOBS | {"all": 1}
    assert not (REPO / "data" / "raw" / run).exists(), "a dry run must not create raw data"


def test_dry_run_with_adaptive_repetitions_adds_pilot_and_targets(tmp_path):
    """adaptive.enabled: pilot, targets from the pilot, then run_fio tops every cell up."""
    run = f"pytest-dry-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "adaptive.yaml"
    config.write_text("adaptive:\n  enabled: true\n")
    result = snakemake("-n", "all", "--config", f"run={run}", "--configfile", str(config))
    assert result.returncode == 0, result.stderr
    adaptive = {"run_pilot": 1, "plan_repetitions": 1}
    assert job_counts(result.stdout + result.stderr) == (
        MEASURE_JOBS | adaptive | ANALYSIS_JOBS | {"all": 1}
    )
    assert not (REPO / "data" / "raw" / run).exists(), "a dry run must not create raw data"


def test_an_adaptive_cap_below_the_pilot_is_refused(tmp_path):
    config = tmp_path / "adaptive.yaml"
    config.write_text("adaptive:\n  enabled: true\n  pilot_pairs: 6\n  max_pairs: 4\n")
    result = snakemake("-n", "all", "--configfile", str(config))
    assert result.returncode != 0
    assert "max_pairs" in result.stderr + result.stdout


def test_dry_run_of_the_sample_only_analyses():
    """The shipped sample is analysed as it is: no benchmark rule may run for it."""
    result = snakemake("-n", "--forceall", "paper/sample/index.md")
    assert result.returncode == 0, result.stderr
    assert job_counts(result.stdout + result.stderr) == ANALYSIS_JOBS


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("device_size_mib=1", "device_size_mib"),
        ("backend=dmcrypt", "backend"),
        ("no_such_key=1", "no_such_key"),
        ("repetitions=zero", "repetitions"),
        ("analysis={'equivalence_margin_pct': -1}", "equivalence_margin_pct"),
    ],
)
def test_a_malformed_config_is_refused_naming_the_key(override, named):
    result = snakemake("-n", "all", "--config", override)
    assert result.returncode != 0
    assert named in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("config_text", "named"),
    [
        # a stack on a disk that is not in the allowlist: names the key and the allowlist
        (
            "devices: {d0: {size_mib: 64}}\nstacks:\n  plain: {kind: plain}\n"
            "  luks: {kind: luks, over: sdb}\n",
            "stacks.luks.over: device 'sdb' is not in devices (the allowlist: ['d0'])",
        ),
        # a real disk by an unstable name is refused by the schema before any check
        ("devices: {d0: {path: sdb}}\n", "devices"),
        # md claims its members: a raw arm on the same disk is refused
        (
            "devices: {d0: {size_mib: 64}, d1: {size_mib: 64}}\nbaseline: raw\n"
            "analysis: {variant: raid0}\nstacks:\n  raw: {kind: raw, device: d0}\n"
            "  raid0: {kind: md, members: [d0, d1]}\n",
            "claim(s) it exclusively",
        ),
        ("stacks:\n  plain: {kind: plain}\n  luks: {kind: luks, level: 5}\n", "stacks.luks.level"),
        ("study: nope\n", "config key 'study': no study 'nope'"),
        # decision margins the wrong way round
        (
            "analysis: {decision_regions: {latency: {lower_pct: 60, upper_pct: 50}}}\n",
            "decision_regions.latency: need 0 < lower < upper",
        ),
        ("profile: scs-2023\n", "config key 'profile' is now 'study'"),
    ],
)
def test_a_bad_device_or_stack_is_refused_before_anything_runs(tmp_path, config_text, named):
    config = tmp_path / "bad.yaml"
    config.write_text(config_text)
    result = snakemake("-n", "all", "--configfile", str(config))
    assert result.returncode != 0
    assert named in result.stderr + result.stdout
    assert "luksbench plan:" not in result.stderr  # stopped before the plan was even shown


def test_the_dry_run_lists_the_matrix_and_the_destructive_actions():
    result = snakemake("-n", "all")
    assert result.returncode == 0, result.stderr
    assert "2 stacks x 16 cells x 3 repetitions = 96 fio runs" in result.stderr
    assert "luks: luksFormat its scratch file (destroys its data)" in result.stderr
    assert "  cell randwrite-4k-qd32" in result.stderr


def test_a_bad_block_size_is_refused(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("matrix:\n  bs: [4k, huge]\n")
    result = snakemake("-n", "all", "--configfile", str(config))
    assert result.returncode != 0
    assert "huge" in result.stderr + result.stdout


def test_write_plan_writes_the_resolved_plan(tmp_path):
    run = f"pytest-plan-{uuid.uuid4().hex[:8]}"
    scratch = tmp_path / "scratch"
    result = snakemake(
        f"{scratch}/{run}/pytest/plan.json",
        "--config",
        f"run={run}",
        f"scratch_dir={scratch}",
        "host=pytest",
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads((scratch / run / "pytest" / "plan.json").read_text())
    assert plan["run"] == run
    assert plan["host"] == "pytest"
    assert plan["stacks"]["luks"] == {
        "kind": "luks",
        "cipher": "aes-xts-plain64",
        "key_bits": 512,
        "hash": "sha256",
        "luks_type": "luks2",
        "sector_size": 512,
        "pbkdf_iterations": 1000,
        "perf_flags": [],
        "allow_discards": False,
        "optional": False,
    }
    # Only the plain kind's own keys: the schema's luks defaults are not carried into it.
    assert plan["stacks"]["plain"] == {"kind": "plain", "size_mib": 0, "optional": False}
    assert plan["precondition"]["enabled"] is True and plan["precondition"]["fill_passes"] == 1
    assert plan["fio"]["output_format"] == "json+"


@pytest.mark.slow
def test_the_sample_is_re_analysed_without_fio(tmp_path):
    """README's command for the sample: tables, figures and paper from raw alone; raw untouched."""
    work = tmp_path / "work"
    copy_workflow(work, extra=("data/raw/sample",))
    raw_before = {
        p: p.read_bytes() for p in sorted((work / "data/raw/sample").rglob("*")) if p.is_file()
    }

    # margins other than the defaults reach the loss table through the shell command
    regions = {"decision_regions": {"throughput": {"lower_pct": 3, "upper_pct": 30}}}
    (work / "regions.yaml").write_text(json.dumps({"analysis": regions}))
    regions_file = ("--configfile", "regions.yaml")
    result = snakemake("--forceall", "paper/sample/index.md", *regions_file, cwd=work)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "run_fio" not in result.stderr and "stack_up" not in result.stderr

    for table in ("fio", "loss", "env", "cryptsetup", "stacks"):
        assert (work / "data/processed/sample" / f"{table}.parquet").stat().st_size > 0
    loss = pd.read_parquet(work / "data/processed/sample/loss.parquet")
    bw = loss[loss["metric"] == "bw_bytes"]
    assert set(bw["decision_lower_pct"]) == {3} and set(bw["decision_upper_pct"]) == {30}
    assert list((work / "figures/sample").glob("*.png"))
    paper = (work / "paper/sample/index.md").read_text()
    assert "## Results" in paper and "95 % CI" in paper
    assert "not dm-crypt" in paper or "dm-crypt" in paper
    raw_after = {
        p: p.read_bytes() for p in sorted((work / "data/raw/sample").rglob("*")) if p.is_file()
    }
    assert raw_after == raw_before

    # raw files are inputs: nothing to do while they stand, the whole analysis once one is gone
    # (the manifest, an input by itself, unchanged)
    result = snakemake("-n", "paper/sample/index.md", *regions_file, cwd=work)
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]
    (work / "data/raw/sample/vm/fio/luks/read-4k-qd1/rep3.json").unlink()
    result = snakemake("-n", "paper/sample/index.md", *regions_file, cwd=work)
    out = result.stdout + result.stderr
    assert "Job stats" in out and {"ingest_raw", "render_paper"} <= set(job_counts(out)), out


@pytest.mark.parametrize(
    ("changed", "reruns"),
    [
        ("formats/fio.py", {"ingest_raw", "compute_loss", "plot_figures", "render_paper"}),
        ("analysis/ingest.py", {"ingest_raw", "compute_loss", "plot_figures", "render_paper"}),
        # ingest imports it: a change must re-run ingest too
        ("analysis/cells.py", {"ingest_raw", "compute_loss", "plot_figures", "render_paper"}),
        # imported by ingest (the code inputs follow the imports: no hand-kept list)
        ("analysis/tablefiles.py", {"ingest_raw", "compute_loss", "plot_figures", "render_paper"}),
        ("analysis/saturation.py", {"ingest_raw", "compute_loss", "plot_figures", "render_paper"}),
        ("analysis/contrasts.py", {"compute_loss", "plot_figures", "render_paper"}),
        # read by publish/render.py, which only the paper's step imports
        ("publish/templates/paper.md.j2", {"render_paper"}),
        ("testbox/runner.py", set()),
        ("cli.py", set()),
    ],
)
def test_an_analysis_step_reruns_when_the_code_it_runs_changes(tmp_path, changed, reruns):
    """Each analysis rule lists the package code it runs, not all of src/."""
    import os

    from luksbench.analysis.ingest import PROCESSED_TABLES
    from luksbench.analysis.loss import LOSS_TABLES

    work = copy_workflow(tmp_path / "wf", extra=("data/raw/sample",))
    outputs = [
        *(f"data/processed/sample/{table}.parquet" for table in PROCESSED_TABLES),
        "data/processed/sample/notebooks/01-ingest.ipynb",
        *(f"data/processed/sample/{table}.parquet" for table in LOSS_TABLES),
        "data/processed/sample/paper_numbers.parquet",
        "data/processed/sample/notebooks/02-loss.ipynb",
        "figures/sample",
        "data/processed/sample/notebooks/03-figures.ipynb",
        "paper/sample/index.md",
        "paper/sample/index.html",
        "data/processed/sample/notebooks/04-paper.ipynb",
    ]
    later = max(p.stat().st_mtime for p in work.rglob("*")) + 10
    for step, name in enumerate(outputs):  # every output up to date, in the order of the steps
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if name == "figures/sample" else path.touch()
        os.utime(path, (later + step, later + step))
    os.utime(work / "src/luksbench" / changed, (later + 100, later + 100))
    result = snakemake("-n", "paper/sample/index.md", "--rerun-triggers", "mtime", cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    ran = set(job_counts(out)) if "Job stats" in out else set()
    assert ran == reruns, out[-3000:]
