"""Each analysis rule's code inputs come from the imports (orchestrate/imports.py): every
luksbench module a notebook imports, transitively, and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testkit.paths import REPO as REPO_DIR
from testkit.workflow import copy_workflow

from luksbench.orchestrate.imports import notebook_modules, package_sources

SRC = REPO_DIR / "src"
BIN = Path(sys.executable).parent


def test_ingest_runs_the_tablefiles_and_saturation_modules_it_imports():
    files = package_sources(["luksbench.analysis.ingest"], SRC)
    analysis = SRC / "luksbench" / "analysis"
    for module in ("ingest", "tablefiles", "saturation", "stats", "cells", "tails", "cpucost"):
        assert str(analysis / f"{module}.py") in files
    assert str(SRC / "luksbench" / "__init__.py") in files
    assert str(analysis / "__init__.py") in files
    assert not any("/publish/" in f or "/testbox/" in f for f in files), "ingest imports neither"


def test_the_ingest_notebook_runs_the_same_code():
    modules = notebook_modules(REPO_DIR / "notebooks" / "01-ingest.ipynb")
    assert "luksbench.analysis.ingest" in modules
    files = package_sources(modules, SRC)
    assert str(SRC / "luksbench" / "analysis" / "tablefiles.py") in files
    assert str(SRC / "luksbench" / "analysis" / "saturation.py") in files


def test_the_template_belongs_to_the_paper_not_to_every_user_of_its_package():
    template = str(SRC / "luksbench" / "publish" / "templates" / "paper.md.j2")
    paper = package_sources(notebook_modules(REPO_DIR / "notebooks" / "04-paper.ipynb"), SRC)
    assert template in paper
    loss = package_sources(notebook_modules(REPO_DIR / "notebooks" / "02-loss.ipynb"), SRC)
    assert str(SRC / "luksbench" / "publish" / "text.py") in loss and template not in loss


def write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def package(tmp_path):
    """A small luksbench package: a imports b (inside a function, relatively), b imports no
    luksbench module and reads its package's templates/."""
    root = tmp_path / "src" / "luksbench"
    write(root / "__init__.py")
    write(root / "steps" / "__init__.py")
    write(root / "steps" / "a.py", "import json\n\ndef run():\n    from . import b\n")
    write(root / "steps" / "b.py", 'import numpy as np\n\nPAGES = "templates/page.j2"\n')
    write(root / "other.py")
    write(root / "steps" / "templates" / "page.j2", "{{ x }}")
    return tmp_path / "src"


def relative(files, src):
    return sorted(str(p).removeprefix(f"{src}/") for p in files)


def test_a_new_import_is_followed_without_editing_any_list(package):
    before = relative(package_sources(["luksbench.steps.a"], package), package)
    assert before == [
        "luksbench/__init__.py",
        "luksbench/steps/__init__.py",
        "luksbench/steps/a.py",
        "luksbench/steps/b.py",
        "luksbench/steps/templates/page.j2",
    ]
    b = package / "luksbench" / "steps" / "b.py"
    write(b, f"from luksbench.other import thing\n{b.read_text()}")
    after = relative(package_sources(["luksbench.steps.a"], package), package)
    assert after == sorted([*before, "luksbench/other.py"])


def test_relative_paths_stay_relative(package, monkeypatch):
    monkeypatch.chdir(package.parent)
    files = package_sources(["luksbench.steps.b"], "src")
    package_dir = "src/luksbench/steps"
    assert files == [
        "src/luksbench/__init__.py",
        f"{package_dir}/__init__.py",
        f"{package_dir}/b.py",
        f"{package_dir}/templates/page.j2",
    ]


def test_an_unknown_module_is_named(package):
    with pytest.raises(ValueError, match=r"luksbench\.nowhere\.x: no such module"):
        package_sources(["luksbench.nowhere.x"], package)
    # a name imported from a module is not a module, and no error
    assert package_sources(["luksbench.steps.b.np"], package)


def test_a_notebook_import_added_is_an_input(tmp_path):
    cells = [
        {"cell_type": "markdown", "source": ["import luksbench.nothing"]},
        {"cell_type": "code", "source": ["%matplotlib inline\n", "from luksbench import cli\n"]},
        {"cell_type": "code", "source": ["import pandas as pd\n", "!ls\n"]},
    ]
    notebook = tmp_path / "n.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    assert notebook_modules(notebook) == ["luksbench", "luksbench.cli"]
    cells[2]["source"].append("import luksbench.studies\n")
    notebook.write_text(json.dumps({"cells": cells}))
    assert "luksbench.studies" in notebook_modules(notebook)


def filegraph(target, cwd):
    """What Snakemake lists as the inputs of the jobs that make ``target`` (its file graph)."""
    env = {**os.environ, "PYTHONPATH": str(cwd / "src")}
    argv = [str(BIN / "snakemake"), "--cores", "1", "--filegraph", target]
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_the_ingest_rule_reruns_for_a_module_imported_anew(tmp_path):
    """Through Snakemake: the ingest rule's inputs have tablefiles.py and saturation.py, and a
    module that tablefiles.py starts to import joins them without editing the rules."""
    work = copy_workflow(tmp_path / "work")
    target = "data/processed/none/notebooks/01-ingest.ipynb"
    before = filegraph(target, work)
    assert "analysis/tablefiles.py" in before and "analysis/saturation.py" in before
    analysis = work / "src" / "luksbench" / "analysis"
    (analysis / "newly_imported.py").write_text("")
    tablefiles = analysis / "tablefiles.py"
    assert "newly_imported" not in before
    tablefiles.write_text(
        f"{tablefiles.read_text()}\nfrom luksbench.analysis import newly_imported\n"
    )
    assert "analysis/newly_imported.py" in filegraph(target, work)
