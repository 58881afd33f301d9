"""`snakemake --report`: the study explained, every figure of the catalog with its caption and
family, and the paper, built from a run of the workflow on the shipped sample; the paper page
opened in headless Chromium from the report as the report opens it (a data: URI in a frame)."""

from __future__ import annotations

import base64
import html as html_lib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from testkit.workflow import copy_workflow

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
    # the paper (the report's copy), as a report item of its own category
    assert any(name.endswith("/paper.html") for name in names), names
    assert '"data/processed/small/report/paper.html"' in page and '"Paper"' in page
    # report/workflow.rst, rendered with the run's config
    assert "counterbalanced pairs" in page and "<strong>default</strong>" in page
    # job parameters as values, paths relative to the checkout
    params = re.findall(r'"params": "([^"]*)"', page)
    assert params and "figure_index=figures/small/index.json" in params[-1], params[-1]
    assert not [p for p in params if " object at 0x" in p or str(work) in p], params

    # the single-file report (the default of `snakemake --report`): the paper opens in Chromium
    result = snakemake("--report", "report.html", "paper/small/index.md", cwd=work)
    assert result.returncode == 0, result.stderr[-4000:]
    paper = paper_in_a_frame(report_uri((work / "report.html").read_text()), tmp_path)
    figures = len(re.findall(r"<img ", (work / "paper/small/index.html").read_text()))
    assert paper["images"] == paper["loaded"] == figures > 10, paper
    assert paper["h1"] == "What does luks cost? luksbench run small", paper
    assert paper["text"] > 10000 and "downscaled" in paper["note"], paper

    # a copied checkout (times kept) has nothing to re-run: no absolute path in any param
    copy = tmp_path / "copied"
    shutil.copytree(work, copy, symlinks=True)
    result = snakemake("--dry-run", "paper/small/index.md", cwd=copy)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]


def report_uri(report_html: str) -> str:
    """The data: URI of the report's Paper entry, as the report's frame loads it."""
    uris = re.findall(r'"data_uri": "(data:text/html[^"]*)"', report_html)
    assert len(uris) == 1, f"{len(uris)} HTML entries in the report"
    return uris[0]


# in the paper's frame: what loaded, posted to the page holding the frame
FRAME_CHECK = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const note = document.querySelector(".report-note");
  parent.postMessage(JSON.stringify({
    images: imgs.length,
    loaded: imgs.filter((i) => i.complete && i.naturalWidth > 0).length,
    h1: document.querySelector("h1") ? document.querySelector("h1").textContent : null,
    text: document.body.innerText.length,
    note: note ? note.textContent : "",
  }), "*");
});
</script>"""


def paper_in_a_frame(uri: str, tmp_path: Path) -> dict:
    """Open ``uri`` (the paper, a data: URI) in a frame of a page in headless Chromium, as the
    report does, with a script added that reports what loaded; {} if the frame stays empty."""
    head, _, data = uri.partition(";base64,")
    page = base64.b64decode(data).decode()
    # the page's policy forbids every script, this check's too: the check runs without it (the
    # images it counts are data: URIs the policy allows)
    policy = re.compile(r"<meta http-equiv='Content-Security-Policy'[^>]*>\n?")
    assert policy.search(page), "the report's paper page carries its Content-Security-Policy"
    page = policy.sub("", page).replace("</body>", FRAME_CHECK + "</body>")
    framed = f"{head};base64,{base64.b64encode(page.encode()).decode()}"
    holder = tmp_path / "frame.html"
    holder.write_text(
        '<!doctype html><html><body><pre id="posted"></pre><script>window.addEventListener('
        '"message", (e) => { document.getElementById("posted").textContent = e.data; });'
        f'</script><iframe src="{framed}" width="1280" height="2000"></iframe></body></html>'
    )
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "no chromium: install it (scripts/setup.sh does: apt-get install chromium)"
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu"]
    argv += [f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=20000"]
    done = subprocess.run(
        [*argv, "--dump-dom", holder.as_uri()], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    posted = re.search(r'<pre id="posted">(.*?)</pre>', done.stdout, re.S)
    return json.loads(html_lib.unescape(posted.group(1))) if posted and posted.group(1) else {}
