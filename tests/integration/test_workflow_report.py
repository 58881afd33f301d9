"""`snakemake --report`: the study explained, every figure of the catalog with its caption and
family, and the paper, built from a run of the workflow on the shipped sample."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import copy_workflow

from luksbench.publish.catalog import FIGURE_FAMILIES

SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def snakemake(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(SNAKEMAKE), "--cores", "2", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1200)


@pytest.mark.slow
def test_the_report_holds_every_figure_with_its_caption_and_the_paper(tmp_path):
    # the sample under another run name: every notebook gets the run it analyses
    work = copy_workflow(tmp_path / "wf", extra=("data/raw/sample",))
    (work / "data/raw/sample").rename(work / "data/raw/small")
    result = snakemake("paper/small/index.md", cwd=work)
    assert result.returncode == 0, result.stderr[-4000:]
    result = snakemake("--report", "report.zip", "paper/small/index.md", cwd=work)
    assert result.returncode == 0, result.stderr[-4000:]

    with zipfile.ZipFile(work / "report.zip") as report:
        names = report.namelist()
        page = report.read("report/report.html").decode()
    index = json.loads((work / "figures/small/index.json").read_text())["figures"]
    assert len(index) > 10
    for entry in index:
        png = entry["files"][0]
        assert any(name.endswith(f"/{png}") for name in names), png
        assert f'"figures/small/{png}"' in page, png
        heading = FIGURE_FAMILIES[entry["family"]][0]
        assert json.dumps(heading)[1:-1] in page, heading
        caption = json.dumps(entry["caption"].replace("`", ""))[1:-1]
        assert caption.split(":")[0] in page, entry["caption"]
    # the paper, self-contained, as a report item of its own category
    assert any(name.endswith("/index.html") for name in names), names
    assert '"paper/small/index.html"' in page and '"Paper"' in page
    # report/workflow.rst, rendered with the run's config
    assert "counterbalanced pairs" in page and "<strong>default</strong>" in page
