"""No absolute path of the measuring machine in a published file: the processed CSVs, the problems'
reasons (which the paper prints), the figures' metadata and the paper show paths relative to the
run's raw folder, the scratch directory as ``<scratch_dir>`` and a planned device by its block
device; the parquet files keep the recorded paths, which the paper prints only with
``paper.machine_paths: true``.

The shipped sample is copied (tmp) with a planned device that is a directory, a truncated result
(its parse error names the file), a result and a folder replaced by links out of the run."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from luksbench.analysis import ingest
from luksbench.analysis.loss import write_loss
from luksbench.analysis.tablefiles import PATHS_NOTE
from luksbench.publish import catalog
from luksbench.publish.render import render_paper

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
HOST = "vm"
TRUNCATED = "vm/fio/plain/read-4k-qd1/rep2.json"
LINKED = "vm/fio/luks/read-4k-qd1/rep3.json"
LINKED_DIR = "vm/extra"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("paths")
    raw = tmp / "machine" / "raw" / "sample"
    shutil.copytree(SAMPLE, raw)
    env_path = raw / HOST / "env.json"
    env = json.loads(env_path.read_text())
    scratch = env["plan"]["scratch_dir"]
    device = str(tmp / "machine" / "mnt" / "nvme")  # a planned device given as its mount point
    env["job_devices"] = [{"device": device, "block_device": "nvme0n1", "numa_node": 0}]
    env_path.write_text(json.dumps(env))
    (raw / TRUNCATED).chmod(0o644)
    (raw / TRUNCATED).write_text((raw / TRUNCATED).read_text()[:200])
    outside = tmp / "machine" / "elsewhere" / "rep3.json"
    outside.parent.mkdir(parents=True)
    shutil.copy(raw / LINKED, outside)
    (raw / LINKED).unlink()
    (raw / LINKED).symlink_to(outside)
    (raw / LINKED_DIR).symlink_to(outside.parent)
    processed = tmp / "processed" / "sample"
    ingest.write_processed(raw, processed, workers=1)
    write_loss(processed)
    prefixes = {str(raw), str(raw.resolve()), scratch, device, str(outside.parent)}
    return {"tmp": tmp, "processed": processed, "prefixes": prefixes, "device": device}


def _cells(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return [cell for row in csv.reader(f) for cell in row]


def test_no_csv_cell_holds_a_path_of_the_measuring_machine(run):
    csvs = sorted(run["processed"].glob("*.csv"))
    assert {p.stem for p in csvs} >= {"env", "stacks", "problems", "fio"}
    for path in csvs:
        for cell in _cells(path):
            assert not any(p in cell for p in run["prefixes"]), (path.name, cell[:300])
    stacks = pd.read_csv(run["processed"] / "stacks.csv")
    assert stacks["backing_file"].str.startswith("<scratch_dir>/luksbench-").all()
    assert pd.read_csv(run["processed"] / "env.csv")["scratch_dir"][0] == "<scratch_dir>"
    devices = pd.read_csv(run["processed"] / "job_devices.csv")
    assert devices["device"][0] == "<device nvme0n1>"
    # the parquet keeps the recorded value
    kept = pd.read_parquet(run["processed"] / "job_devices.parquet")
    assert kept["device"][0] == run["device"]
    assert PATHS_NOTE in (run["processed"] / "README.md").read_text()


def test_every_problem_is_named_relative_to_the_run_without_a_machine_path(run):
    problems = pd.read_parquet(run["processed"] / "problems.parquet")
    excluded = problems[problems["severity"] == "excluded"]
    assert {TRUNCATED, LINKED, LINKED_DIR} <= set(excluded["file"])
    for reason in problems["reason"]:
        assert not any(p in reason for p in run["prefixes"]), reason
    linked = excluded.loc[excluded["file"] == LINKED_DIR, "reason"].iloc[0]
    assert "(to elsewhere, outside the run folder)" in linked
    truncated = excluded.loc[excluded["file"] == TRUNCATED, "reason"].iloc[0]
    assert truncated.startswith(f"{TRUNCATED}: ")  # the parse error names the file, relative


def test_the_paper_prints_device_paths_only_when_asked(run):
    tmp, processed = run["tmp"], run["processed"]
    default = render_paper(processed, tmp / "nofig", tmp / "p1" / "index.md", "sample")
    text = default.read_text()
    assert not any(p in text for p in run["prefixes"])
    assert "`nvme0n1`" in text and f"{TRUNCATED}: " in text
    asked = render_paper(
        processed, tmp / "nofig", tmp / "p2" / "index.md", "sample", machine_paths=True
    )
    assert f"`{run['device']}` (nvme0n1)" in asked.read_text()


@pytest.mark.slow
def test_no_figure_metadata_holds_a_path_of_the_measuring_machine(run):
    figures = run["tmp"] / "figures"
    drawn = catalog.make_figures(run["processed"], figures, "sample", workers=1)
    assert drawn
    for png, svg in drawn.values():
        text = " ".join(f"{k}={v}" for k, v in Image.open(png).text.items())
        assert "git_commit" in text
        assert not any(p in text for p in run["prefixes"]), (png.name, text[:300])
        assert not any(p in svg.read_text() for p in run["prefixes"]), svg.name
    index = (figures / "index.json").read_text()
    assert not any(p in index for p in run["prefixes"])
