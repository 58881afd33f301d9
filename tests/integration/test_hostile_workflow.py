"""The workflow on a hostile raw run (tests/hostile.py): markup in every text the run carries, a
config whose paper title, author and front matter are markup, spreadsheet formulas, links out of
the run, links planted in the output folders, results with impossible numbers and a host folder
whose name YAML would retype. The paper, its HTML, the report and the CSVs (the processed ones and
``luksbench parse``'s) are inert, nothing behind a link is read or written, every link and every
impossible result is a problem left out, and the retyped host stays the string it is."""

from __future__ import annotations

import base64
import csv
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from hostile import (
    HOST,
    PAPER_CONFIG,
    RETYPED_HOST,
    SECRET,
    LiveMarkup,
    build_hostile_run,
    files_outside,
    plant_output_links,
)
from testkit.workflow import copy_workflow

SNAKEMAKE = Path(sys.executable).parent / "snakemake"
RUN = "hostile"
OUTPUTS = ("data/processed", "paper", "figures", "logs", ".snakemake", "report.zip")
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def snakemake(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(SNAKEMAKE), "--cores", "2", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1800)


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("hostile") / "wf")
    hostile = build_hostile_run(work, RUN)
    (work / "hostile.yaml").write_text(json.dumps(PAPER_CONFIG))
    victim = hostile.outside / "victim.txt"
    planted = plant_output_links(work, RUN, victim)
    before = files_outside(work, OUTPUTS)
    outside_before = files_outside(hostile.outside, ())
    target, config = f"paper/{RUN}/index.md", ("--configfile", "hostile.yaml")
    result = snakemake(target, *config, cwd=work)
    assert result.returncode == 0, result.stderr[-6000:]
    result = snakemake("--report", "report.zip", target, *config, cwd=work)
    assert result.returncode == 0, result.stderr[-6000:]
    return {
        "work": work,
        "hostile": hostile,
        "victim": victim,
        "planted": planted,
        "unchanged": before == files_outside(work, OUTPUTS),
        "outside_unchanged": outside_before == files_outside(hostile.outside, ()),
    }


@pytest.mark.slow
def test_the_html_holds_no_live_markup_and_only_its_own_figures(analysed):
    work = analysed["work"]
    page = (work / f"paper/{RUN}/index.html").read_text()
    live = LiveMarkup.of(page)
    assert live.found == [], live.found
    figures = {
        base64.b64encode(p.read_bytes()).decode()
        for p in (work / f"paper/{RUN}/figures").glob("*.png")
    }
    assert live.images, "no figure embedded"
    for src in live.images:
        assert src.startswith("data:image/png;base64,"), src[:80]
        assert src.removeprefix("data:image/png;base64,") in figures
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    # the payloads are there, as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;script&gt;alert(&#x27;title&#x27;)&lt;/script&gt;" in page


@pytest.mark.slow
def test_the_markdown_post_is_inert_for_a_site(analysed):
    from markdown_it import MarkdownIt

    from luksbench.publish.render import split_front_matter

    text = (analysed["work"] / f"paper/{RUN}/index.md").read_text()
    meta, body = split_front_matter(text)
    # rendered with raw HTML allowed, as a permissive site would
    live = LiveMarkup.of(MarkdownIt("commonmark").enable("table").render(body))
    assert live.found == [], live.found
    assert all(src.startswith("figures/") for src in live.images), live.images
    assert "{%" not in text and "{{" not in text  # no Liquid tag for Jekyll
    assert meta["title"] and "<script>" not in body


@pytest.mark.slow
def test_no_file_behind_a_link_reaches_any_output(analysed):
    work = analysed["work"]
    embedded = base64.b64encode(f"{SECRET}\n".encode())  # a secret file as an embedded image
    for folder in ("data/processed", "paper", "figures"):
        for path in (work / folder).rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                assert SECRET.encode() not in data and embedded not in data, path
    with zipfile.ZipFile(work / "report.zip") as report:
        for name in report.namelist():
            assert SECRET.encode() not in report.read(name), name
        paper = [n for n in report.namelist() if n.endswith("/paper.html")]
        assert paper, report.namelist()
        page = report.read(paper[0]).decode()
    # the report's copy of the paper (figures downscaled): as inert as the paper
    assert LiveMarkup.of(page).found == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.slow
def test_the_csvs_hold_no_formula(analysed):
    csvs = sorted((analysed["work"] / f"data/processed/{RUN}").glob("*.csv"))
    assert len(csvs) >= 7
    for path in csvs:
        with path.open(newline="") as f:
            for row in csv.reader(f):
                bad = [c for c in row if c.startswith(FORMULA) and not _number(c)]
                assert not bad, (path.name, bad)
    fio = pd.read_csv(analysed["work"] / f"data/processed/{RUN}/fio.csv", dtype=str)
    hostile = fio[fio["host"] != RETYPED_HOST]
    assert len(hostile) and hostile["job"].str.startswith("'=").all()  # the job names, as text


@pytest.mark.slow
def test_nothing_was_written_outside_the_output_folders_or_through_a_link(analysed):
    assert analysed["unchanged"] and analysed["outside_unchanged"]
    assert analysed["victim"].read_text() == "victim: must stay unchanged\n"
    for path in analysed["planted"]:
        assert path.is_file() and not path.is_symlink(), path


@pytest.mark.slow
def test_every_link_of_the_raw_run_is_a_problem_named_in_the_paper(analysed):
    work, hostile = analysed["work"], analysed["hostile"]
    problems = pd.read_parquet(work / f"data/processed/{RUN}/problems.parquet")
    excluded = set(problems.loc[problems["severity"] == "excluded", "file"])
    assert set(hostile.links) <= excluded, set(hostile.links) - excluded
    paper = (work / f"paper/{RUN}/index.md").read_text()
    assert paper.count("was left out: ") >= len(hostile.links)


@pytest.mark.slow
def test_every_impossible_result_is_a_problem_left_out_and_named_in_the_paper(analysed):
    work, hostile = analysed["work"], analysed["hostile"]
    processed = work / f"data/processed/{RUN}"
    problems = pd.read_parquet(processed / "problems.parquet")
    excluded = problems[problems["severity"] == "excluded"]
    assert len(hostile.impossible) == 2
    for path, why in hostile.impossible.items():
        reasons = list(excluded.loc[excluded["file"] == path, "reason"])
        assert len(reasons) == 1 and why in reasons[0], (path, reasons)
    files = set(pd.read_parquet(processed / "fio.parquet", columns=["file"])["file"])
    assert files and not files & set(hostile.impossible)  # the latency table is drawn from fio
    paper = (work / f"paper/{RUN}/index.md").read_text()
    for path in hostile.impossible:
        assert f"Raw file `{path}` was left out: numbers that cannot be true" in paper, path


@pytest.mark.slow
def test_a_host_name_yaml_would_retype_stays_the_string_it_is(analysed):
    work = analysed["work"]
    processed = work / f"data/processed/{RUN}"
    for table in ("fio", "latency", "env", "stacks", "schedule", "cryptsetup", "loss"):
        hosts = pd.read_parquet(processed / f"{table}.parquet")["host"]
        assert pd.api.types.is_string_dtype(hosts), table
        assert RETYPED_HOST in set(hosts) and HOST in set(hosts), (table, set(hosts))
        with (processed / f"{table}.csv").open(newline="") as f:
            rows = list(csv.reader(f))
        column = rows[0].index("host")
        assert RETYPED_HOST in {row[column] for row in rows[1:]}, table
    paper = (work / f"paper/{RUN}/index.md").read_text()
    assert f"`{RETYPED_HOST}`" in paper and f"| {RETYPED_HOST} | `luks` |" in paper
    assert "| 7 |" not in paper and "`7`" not in paper
    page = (work / f"paper/{RUN}/index.html").read_text()
    assert f"<td>{RETYPED_HOST}</td>" in page and "<td>7</td>" not in page


@pytest.mark.slow
def test_luksbench_parse_writes_no_formula(analysed):
    hostile = analysed["hostile"]
    reps = sorted(
        p
        for p in hostile.host_dir.glob("fio/*/*/rep*.json")
        if not p.is_symlink() and not p.name.endswith(".cpu.json")
    )
    command = [sys.executable, "-m", "luksbench.cli", "parse", "fio", *map(str, reps)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    rows = list(csv.reader(done.stdout.splitlines()))
    assert len(rows) > len(reps) // 2, done.stderr[-2000:]
    for row in rows:
        bad = [c for c in row if c.startswith(FORMULA) and not _number(c)]
        assert not bad, bad
    assert any(c.startswith("'=cmd") for row in rows for c in row)
