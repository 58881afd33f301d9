"""Snakemake workflow catalog conventions: config/README.md generated from the schema, the
catalog's YAML, workflow/Snakefile, and per-rule conda environments in step with the pip lock."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# conda-forge names of the pip lock's packages, where they differ
CONDA_NAMES = {"python-duckdb": "duckdb"}
# run_fio and run_rounds are no shell rules: they ingest between their run-fio subprocesses
TESTBOX_RULES = {
    "capture_env",
    "benchmark_ciphers",
    "stack_up",
    "run_pilot",
    "stack_down",
}


def test_config_readme_is_generated_from_the_schema():
    result = subprocess.run(
        [sys.executable, "scripts/config_readme.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    readme = (REPO / "config/README.md").read_text()
    for key in schema["properties"]:
        assert f"**`{key}`**" in readme, key


def test_the_catalog_file_declares_conda_and_the_report():
    catalog = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())
    usage = catalog["usage"]
    assert usage["software-stack-deployment"]["conda"] is True
    assert usage["report"] is True
    # the catalog's standardized layout: workflow/Snakefile, which is the top-level Snakefile
    assert 'include: "../Snakefile"' in (REPO / "workflow/Snakefile").read_text()


def pip_lock() -> dict[str, str]:
    lines = (REPO / "envs/requirements.txt").read_text().splitlines()
    return dict(line.lower().split("==") for line in lines if "==" in line)


def conda_pins(env: Path) -> dict[str, str]:
    deps = yaml.safe_load(env.read_text())["dependencies"]
    pins = dict(dep.split("=", 1) for dep in deps if isinstance(dep, str) and "=" in dep)
    return {CONDA_NAMES.get(name, name): version for name, version in pins.items()}


def rule_envs() -> dict[str, str | None]:
    """{rule: its conda env file (None: none)} for every rule that runs a shell command."""
    envs = {}
    for smk in (REPO / "workflow/rules").glob("*.smk"):
        for rule, body in re.findall(
            r"^rule (\w+):\n(.*?)(?=^\S|\Z)", smk.read_text(), re.M | re.S
        ):
            if re.search(r"^    shell:", body, re.M):
                conda = re.search(r'^    conda:\n\s+"([^"]+)"', body, re.M)
                envs[rule] = str((smk.parent / conda[1]).resolve()) if conda else None
    return envs


def test_every_conda_env_is_pinned_as_the_pip_lock():
    lock = pip_lock()
    for env in (REPO / "envs").glob("*.yaml"):
        for name, version in conda_pins(env).items():
            if name == "python":
                assert version == "3.11", env.name
            else:
                assert lock.get(name.lower()) == version, (env.name, name, version, lock.get(name))


def test_each_rule_runs_in_its_own_environment():
    envs = rule_envs()
    assert set(envs) > TESTBOX_RULES, envs
    testbox, analysis = REPO / "envs/testbox.yaml", REPO / "envs/analysis.yaml"
    for rule, env in envs.items():
        assert env == str(testbox if rule in TESTBOX_RULES else analysis), rule
    # the test-box rules need Python and the OS's tools only
    assert set(conda_pins(testbox)) == {"python"}
    # the analysis environment has what the analysis imports, and nothing of the dev tools
    pins = conda_pins(analysis)
    for needed in ("pandas", "pyarrow", "scipy", "seaborn", "papermill", "ipykernel", "duckdb"):
        assert needed in pins, needed
    assert not {"pytest", "ruff", "jupyterlab", "snakemake"} & set(pins)


def test_the_testbox_cli_runs_on_the_standard_library_from_src():
    """What a test-box rule runs under conda (workflow/rules/common.smk): `python -m luksbench.cli`
    with the workflow's src/ on PYTHONPATH, nothing installed (-S: no site-packages)."""
    result = subprocess.run(
        [sys.executable, "-S", "-m", "luksbench.cli", "testbox", "run-fio", "--help"],
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "--manifest" in result.stdout, result.stderr
