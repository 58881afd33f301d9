"""The analysis notebooks: committed clean, parameterised, and runnable end to end.

The regression run proper is nbval over notebooks/ (configured in pyproject.toml, so a plain
``pytest`` runs it: kernel cwd = notebooks/, defaults = the shipped sample). The papermill test below runs
the four notebooks in order with every output redirected to tmp_path, the way Snakemake runs them.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
from testkit.workflow import copy_workflow

from luksbench.analysis.loss import LOSS_TABLES
from luksbench.analysis.tails import TOO_FEW

REPO = Path(__file__).parents[2]
NOTEBOOKS = REPO / "notebooks"
ORDER = ["01-ingest", "02-loss", "03-figures", "04-paper"]
# the shipped sample; LUKSBENCH_NOTEBOOK_RAW points the papermill test at another run folder
SAMPLE_RAW = Path(os.environ.get("LUKSBENCH_NOTEBOOK_RAW", REPO / "data" / "raw" / "sample"))

# the run's folders default to "": derived from `run` in the notebook (data/raw/<run>, ...)
DEFAULTS = {
    "run": "sample",
    "raw_dir": "",
    "processed_dir": "",
    "figures_dir": "",
    "paper_dir": "",
    "reference_dir": "../data/reference",
    "title": "",
    "author": "luksbench",
    # the loss settings: None = the run's (as recorded beside its loss tables, else the default
    # config's, printed); the workflow passes every one from the run's config
    "baseline": None,
    "variant": None,
    "comparisons": None,
    "decision_regions": None,
    "confidence": None,
    "equivalence_margin_pct": None,
    "strict": False,
    "workers": 2,
    "loss_dir": "",
    "per_host_figures_max": None,  # None: the schema default (the workflow passes the config's)
}
RUN_DIRS = {"run", "raw_dir", "processed_dir"}
PARAMS = {
    "01-ingest": {*RUN_DIRS, "strict", "workers"},
    "02-loss": {
        *RUN_DIRS,
        "baseline",
        "variant",
        "comparisons",
        "confidence",
        "equivalence_margin_pct",
        "decision_regions",
        "min_pairs",
        "loss_dir",
    },
    "03-figures": {*RUN_DIRS, "figures_dir", "workers", "per_host_figures_max"},
    "04-paper": {*RUN_DIRS, "figures_dir", "paper_dir", "reference_dir", "title", "author"}
    | {"front_matter", "machine_paths"},
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
        assert "def " not in code, f"{name}: logic belongs in the package"


@pytest.mark.parametrize("name", ORDER)
def test_each_notebook_ends_with_a_short_sanity_check_a_reader_understands(name):
    """One or two asserts under a "Check" heading that says in a sentence what they check; the
    invariants that are really tests live in tests/ (test_sample_tables, test_published_sample)."""
    cells = load(name)["cells"]
    heading = max(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## Check"))
    sentence, check = "".join(cells[heading]["source"]), "".join(cells[heading + 1]["source"])
    assert len(sentence.split("\n\n", 1)[-1]) > 40, f"{name}: say what the check checks"
    asserts = check.count("assert ")
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert 1 <= asserts <= 2 and code.count("assert ") == asserts, name
    assert len(check.splitlines()) <= 8, f"{name}: a sanity check, not a test suite"


def test_the_loss_notebook_names_every_table_it_writes():
    story = "".join(
        "".join(c["source"]) for c in load("02-loss")["cells"] if c["cell_type"] == "markdown"
    )
    for table in LOSS_TABLES:
        assert f"{table}.parquet`" in story, table


def execute(name: str, out: Path, cwd: Path = NOTEBOOKS, **parameters):
    import papermill

    return papermill.execute_notebook(
        str(cwd / f"{name}.ipynb"),
        str(out),
        parameters=parameters,
        kernel_name="python3",
        cwd=str(cwd),
        progress_bar=False,
    )


def run_notebooks(raw: Path, tmp_path: Path) -> dict[str, float]:
    """The four notebooks in order on run folder ``raw`` as Snakemake runs them; their timings."""
    params = {
        "run": raw.name,
        "raw_dir": str(raw),
        "processed_dir": str(tmp_path / "processed"),
        "loss_dir": str(tmp_path / "processed"),
        "figures_dir": str(tmp_path / "figures"),
        "paper_dir": str(tmp_path / "paper" / raw.name),
    }
    timings = {}
    for name in ORDER:
        wanted = {k: v for k, v in params.items() if k in PARAMS[name]}
        start = time.monotonic()
        execute(name, tmp_path / f"{name}.out.ipynb", **wanted)
        timings[name] = time.monotonic() - start
    return timings


@pytest.mark.slow
def test_papermill_runs_all_notebooks(tmp_path):
    assert SAMPLE_RAW.is_dir(), f"the shipped sample is missing: {SAMPLE_RAW}"
    timings = run_notebooks(SAMPLE_RAW, tmp_path)
    assert (tmp_path / "processed" / "loss.parquet").exists()
    assert (tmp_path / "figures" / "loss.png").exists()
    assert (tmp_path / "paper" / "sample" / "index.md").exists()
    assert (tmp_path / "paper" / "sample" / "index.html").exists()
    print(timings)


@pytest.mark.slow
def test_the_analysis_finishes_on_tampered_raw_and_names_the_files(tmp_path):
    """A cell left with one usable pair, a deleted rep, a stray copy no manifest records and an
    implausible CPU sidecar: the notebooks finish, the cell is insufficient, the paper names each
    file."""
    raw = tmp_path / "sample"
    shutil.copytree(REPO / "data" / "raw" / "sample", raw)
    fio = raw / "vm" / "fio"
    bad = {
        "luks/read-4k-qd1/rep2.json": "",
        "luks/read-4k-qd1/rep3.json": "",
        "plain/write-1m-qd1/rep3.json": None,
        "plain/read-1m-qd1/rep1.cpu.json": "busy_pct",
        "luks/randread-4k-qd1/rep7.json": (fio / "luks/randread-4k-qd1/rep2.json").read_text(),
    }
    for name, text in bad.items():
        path = fio / name
        if path.exists():
            path.chmod(0o644)
        if text is None:
            path.unlink()
        elif text == "busy_pct":
            path.write_text(json.dumps({**json.loads(path.read_text()), "busy_pct": 250.0}))
        else:
            path.write_text(text)
    run_notebooks(raw, tmp_path)
    paper = (tmp_path / "paper" / "sample" / "index.md").read_text()
    for name in bad:
        assert f"`vm/fio/{name}`" in paper, name
    loss = pd.read_parquet(tmp_path / "processed" / "loss.parquet")
    short = loss[loss["workload"] == "read-4k-qd1"]
    withheld = short["note"].str.startswith(TOO_FEW)  # p99.9: a plain rep has 9,303 I/Os
    assert (short["verdict"] == "insufficient").all() and (short.loc[~withheld, "n"] == 1).all()
    assert (short.loc[withheld, "n"] == 0).all()


@pytest.mark.parametrize("name", ORDER)
def test_a_notebook_pointed_at_a_run_that_does_not_exist_refuses_naming_it(name, tmp_path):
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError, match="run 'nosuchrun' does not exist"):
        execute(name, tmp_path / "out.ipynb", run="nosuchrun")
    assert not (REPO / "data" / "processed" / "nosuchrun").exists()
    assert not (REPO / "figures" / "nosuchrun").exists()


def test_another_runs_tables_are_refused_not_relabelled(tmp_path):
    """`-p run default` on the sample's tables: refused, never figures of the sample as `default`."""
    from papermill.exceptions import PapermillExecutionError

    processed = tmp_path / "processed"
    execute("01-ingest", tmp_path / "01.ipynb", processed_dir=str(processed))
    with pytest.raises(PapermillExecutionError, match="not 'default'"):
        execute(
            "03-figures",
            tmp_path / "03.ipynb",
            run="default",
            processed_dir=str(processed),
            figures_dir=str(tmp_path / "figures"),
        )
    assert not (tmp_path / "figures").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ORDER[1:])
def test_each_notebook_runs_alone_in_a_fresh_clone(name, tmp_path):
    """A checkout with the sample's raw data only (no processed tables, no figures): the notebook
    computes the inputs it lacks into the sample's own folders, with its default parameters, and
    writes what it makes (loss tables, figures, paper) to a folder of its own, never to the
    workflow's outputs."""
    clone = copy_workflow(tmp_path / "clone", extra=("data/raw/sample",))
    execute(name, tmp_path / "out.ipynb", cwd=clone / "notebooks")
    explore = clone / "data/processed/sample/explore"
    assert [p.name for p in (clone / "data/processed").iterdir()] == ["sample"]
    assert not (clone / "figures/sample").exists() and not (clone / "paper/sample").exists()
    if name == "02-loss":
        assert (explore / "02-loss/loss.parquet").exists()
        assert not (clone / "data/processed/sample/loss.parquet").exists()
    else:  # the default loss tables, an input of the figures, computed where they were missing
        assert (clone / "data/processed/sample/loss.parquet").exists()
        assert (explore / "03-figures/index.json").exists()
    if name == "04-paper":
        assert (explore / "04-paper/index.html").exists()


def test_the_loss_notebook_with_other_settings_leaves_the_run_tables_alone(tmp_path):
    """02 run by hand with another confidence on a run the workflow analysed: its tables go to its
    own folder; the run's loss.parquet is left as it was, byte for byte."""
    processed = tmp_path / "processed"
    execute("01-ingest", tmp_path / "01.ipynb", processed_dir=str(processed))
    execute("02-loss", tmp_path / "02.ipynb", processed_dir=str(processed), loss_dir=str(processed))
    before = (processed / "loss.parquet").read_bytes()
    execute("02-loss", tmp_path / "02b.ipynb", processed_dir=str(processed), confidence=0.8)
    assert (processed / "loss.parquet").read_bytes() == before
    explored = pd.read_parquet(processed / "explore/02-loss/loss.parquet")
    assert set(explored["confidence"]) == {0.8}
    assert set(pd.read_parquet(processed / "loss.parquet")["confidence"]) == {0.95}
