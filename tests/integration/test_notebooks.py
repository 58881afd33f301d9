"""The analysis notebooks: committed clean, parameterised, and runnable end to end.

The regression run proper is nbval over notebooks/ (configured in pyproject.toml, so a plain
``pytest`` runs it: kernel cwd = notebooks/, defaults = the shipped sample). The papermill test below runs
the four notebooks in order with every output redirected to tmp_path, the way Snakemake runs them.
"""

from __future__ import annotations

import ast
import json
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
NOTEBOOKS = REPO / "notebooks"
ORDER = ["01-ingest", "02-loss", "03-figures", "04-paper"]
# the shipped sample; LUKSBENCH_NOTEBOOK_RAW points the papermill test at another run folder
SAMPLE_RAW = Path(os.environ.get("LUKSBENCH_NOTEBOOK_RAW", REPO / "data" / "raw" / "sample"))

DEFAULTS = {
    "run": "sample",
    "raw_dir": "../data/raw/sample",
    "processed_dir": "../data/processed/sample",
    "figures_dir": "../figures/sample",
    "paper_dir": "../paper/sample",
    "reference_dir": "../data/reference",
    "title": "",
    "author": "luksbench",
    "baseline": "plain",
    "variant": "luks",
    "comparisons": "[]",
    "decision_regions": "{}",
    "confidence": 0.95,
    "strict": False,
    "workers": 2,
}
PARAMS = {
    "01-ingest": {"run", "raw_dir", "processed_dir", "strict", "workers"},
    "02-loss": {
        "processed_dir",
        "baseline",
        "variant",
        "comparisons",
        "confidence",
        "equivalence_margin_pct",
        "decision_regions",
        "min_pairs",
    },
    "03-figures": {"run", "processed_dir", "figures_dir", "workers"},
    "04-paper": {
        "run",
        "processed_dir",
        "figures_dir",
        "paper_dir",
        "reference_dir",
        "title",
        "author",
    },
}


def load(name: str) -> dict:
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())


def parameters(nb: dict) -> dict:
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, "exactly one cell tagged 'parameters'"
    tree = ast.parse("".join(cells[0]["source"]))
    return {t.id: ast.literal_eval(node.value) for node in tree.body for t in node.targets}


@pytest.mark.parametrize("name", ORDER)
def test_notebook_committed_clean(name):
    nb = load(name)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert nb["cells"][0]["cell_type"] == "markdown", "start with the story"
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, (
                "commit notebooks without outputs"
            )


@pytest.mark.parametrize("name", ORDER)
def test_notebook_parameters_default_to_the_sample(name):
    params = parameters(load(name))
    assert set(params) == PARAMS[name]
    for key, value in params.items():
        if key in DEFAULTS:
            assert value == DEFAULTS[key], key


def test_notebooks_thin_and_asserting():
    for name in ORDER:
        code = "\n".join(
            "".join(c["source"]) for c in load(name)["cells"] if c["cell_type"] == "code"
        )
        assert "from luksbench" in code, f"{name}: the work is done by the package"
        assert code.count("assert ") >= 3, f"{name}: invariants for nbval"
        assert "def " not in code, f"{name}: logic belongs in the package"


@pytest.mark.slow
def test_papermill_runs_all_notebooks(tmp_path):
    assert SAMPLE_RAW.is_dir(), f"the shipped sample is missing: {SAMPLE_RAW}"
    import papermill

    params = {
        "run": "sample",
        "raw_dir": str(SAMPLE_RAW),
        "processed_dir": str(tmp_path / "processed"),
        "figures_dir": str(tmp_path / "figures"),
        "paper_dir": str(tmp_path / "paper" / "sample"),
    }
    timings = {}
    for name in ORDER:
        wanted = {k: v for k, v in params.items() if k in PARAMS[name]}
        start = time.monotonic()
        papermill.execute_notebook(
            str(NOTEBOOKS / f"{name}.ipynb"),
            str(tmp_path / f"{name}.out.ipynb"),
            parameters=wanted,
            kernel_name="python3",
            cwd=str(NOTEBOOKS),
            progress_bar=False,
        )
        timings[name] = time.monotonic() - start
    assert (tmp_path / "processed" / "loss.parquet").exists()
    assert (tmp_path / "figures" / "loss.png").exists()
    assert (tmp_path / "paper" / "sample" / "index.md").exists()
    assert (tmp_path / "paper" / "sample" / "index.html").exists()
    print(timings)
