"""Packaging: licence, version, dependency bounds, help on every option, the extra a missing
package belongs to, and the package data that lets `luksbench plan` run outside a checkout."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from luksbench import cli

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# distribution name -> import name, where they differ
IMPORT_NAMES = {"pyyaml": "yaml", "markdown-it-py": "markdown_it"}


def test_license_file_matches_the_declared_licence():
    assert PYPROJECT["license"] == {"text": "MIT"}
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 luksbench authors" in text


def test_version_option(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"luksbench {PYPROJECT['version']}"


def _walk(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_option_of_every_command_has_help():
    actions = list(_walk(cli.build_parser(), "luksbench"))
    assert len(actions) > 60  # every command was walked, the test box's included
    bare = [f"{path} {'/'.join(a.option_strings) or a.dest}" for path, a in actions if not a.help]
    assert not bare, f"options without help text: {bare}"


def test_dependencies_have_lower_bounds_and_the_extras_are_known_to_the_cli():
    for extra in ("analysis", "workflow"):
        names = []
        for requirement in PYPROJECT["optional-dependencies"][extra]:
            name, bound = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement).groups()
            names.append(IMPORT_NAMES.get(name.lower(), name.lower().replace("-", "_")))
            if name == "scipy":
                assert tuple(map(int, bound.split("."))) >= (1, 15)  # bootstrap(rng=)
        assert set(cli.EXTRAS[extra].split()) == set(names), extra


# A fresh interpreter where pandas is not installed (as on the bare test box).
MISSING_PANDAS = """
import sys


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NotInstalled())
from luksbench import cli

sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_missing_analysis_package_names_the_extra_to_install():
    argv = [sys.executable, "-c", MISSING_PANDAS, "loss", str(REPO / "data/raw/sample")]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "pandas is not installed: pip install 'luksbench[analysis]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plan_with_an_absolute_configfile_outside_the_checkout(tmp_path):
    """Installed as pip installs it (the package into site-packages, the data files under the
    prefix) into a fresh environment, run from a folder without config/ or workflow/."""
    project = tmp_path / "project"
    for part in ("pyproject.toml", "README.md", "LICENSE", "src", "config", "workflow/schemas"):
        (project / part).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, project / part)
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env_dir], check=True)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import site; print(site.getsitepackages()[0])"], text=True
        ).strip()
    )
    # the dependencies (snakemake, PyYAML) from the test's own environment, luksbench not
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "deps.pth").write_text("\n".join(deps) + "\n")
    setup = [sys.executable, "-c", "from setuptools import setup; setup()", "-q"]
    for step in (["build_py", "-d", site], ["install_data", "-d", env_dir]):
        subprocess.run([*setup, *step], cwd=project, check=True, capture_output=True)
    shutil.rmtree(project)
    config = tmp_path / "mybox.yaml"
    config.write_text("run: elsewhere\nstudy: scs-2023\n")
    cwd = tmp_path / "anywhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [python, "-m", "luksbench.cli", "plan", "--configfile", str(config)]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "elsewhere" in proc.stdout and "luks" in proc.stdout
    where = subprocess.check_output(
        [python, "-c", "import luksbench; print(luksbench.__file__)"], cwd=cwd, env=env, text=True
    )
    assert where.startswith(str(site))
