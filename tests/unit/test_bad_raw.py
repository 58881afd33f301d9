"""Bad raw data: every bad file is named with the reason, the rest is ingested, strict mode fails,
and nothing bad becomes a value (least of all a silent zero) in a table.

The run folder is a copy of the shipped sample (real fio json+ output) with files broken the ways
real files break.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from testkit.paths import SAMPLE
from testkit.raw import SAMPLE_HOST as HOST
from testkit.raw import sample_rep as rep

from luksbench.analysis import ingest
from luksbench.analysis.loss import write_loss


def replace(path: Path, text: str) -> None:
    path.chmod(0o644)  # the copy keeps raw's read-only mode
    path.write_text(text)


@pytest.fixture
def broken_run(tmp_path) -> tuple[Path, dict[str, str]]:
    raw_dir = tmp_path / "sample"
    shutil.copytree(SAMPLE, raw_dir)
    good = rep(raw_dir, "plain", "read-4k-qd1", 1).read_text()
    doc = json.loads(good)
    broken: dict[str, str] = {}

    def broke(path: Path, text: str, why: str) -> None:
        replace(path, text)
        broken[path.relative_to(raw_dir).as_posix()] = why

    broke(rep(raw_dir, "plain", "read-4k-qd1", 2), good[: len(good) // 2], "truncated")
    broke(rep(raw_dir, "luks", "read-4k-qd1", 2), "", "file is empty")
    broke(
        rep(raw_dir, "plain", "write-4k-qd1", 1),
        "fio: failed to open /dev/x: No such file or directory\n",
        "text only",
    )
    nan = json.loads(good)
    nan["jobs"][0]["read"]["bw_bytes"] = math.nan
    broke(rep(raw_dir, "luks", "write-4k-qd1", 1), json.dumps(nan), "bw_bytes is nan")
    negative = json.loads(good)
    negative["jobs"][0]["read"]["iops"] = -5.0
    broke(rep(raw_dir, "plain", "randread-4k-qd1", 3), json.dumps(negative), "iops is -5.0")
    failed = json.loads(good)
    failed["jobs"][0]["error"] = 5
    broke(rep(raw_dir, "luks", "randread-4k-qd1", 3), json.dumps(failed), "failed with error")
    # Several documents: used (the last counts), but named as a note.
    twice = rep(raw_dir, "plain", "read-1m-qd1", 1)
    replace(twice, json.dumps(doc) + "\n" + twice.read_text())
    return raw_dir, broken


def test_lenient_ingest_names_every_bad_file_and_keeps_the_rest(broken_run, tmp_path):
    raw_dir, broken = broken_run
    tables = ingest.ingest_run(raw_dir)
    problems = tables["problems"]
    excluded = problems[problems["severity"] == "excluded"]
    assert sorted(excluded["file"]) == sorted(broken)
    for row in excluded.itertuples():
        assert broken[row.file] in row.reason, (row.file, row.reason)
    notes = problems[problems["severity"] == "note"]
    assert list(notes["file"]) == [f"{HOST}/fio/plain/read-1m-qd1/rep1.json"]
    assert "2 complete fio JSON documents, using the last one" in notes["reason"].iloc[0]

    fio = tables["fio"]
    used = set(fio["file"])
    assert not used & set(broken), "a bad file reached the table"
    assert len(fio) == 2 * 16 * 3 - len(broken)
    assert (fio["bw_bytes"] > 0).all() and (fio["iops"] > 0).all(), "no zero, no NaN"


def test_strict_ingest_fails_naming_every_bad_file(broken_run):
    raw_dir, broken = broken_run
    with pytest.raises(ingest.IngestError) as error:
        ingest.ingest_run(raw_dir, strict=True)
    message = str(error.value)
    for name in broken:
        assert name in message


def test_problems_are_written_and_printed(broken_run, tmp_path, capsys):
    raw_dir, broken = broken_run
    out = ingest.write_processed(raw_dir, tmp_path / "processed")
    printed = capsys.readouterr().err
    for name in broken:
        assert name in printed
    problems = ingest.read_processed(tmp_path / "processed")["problems"]
    assert len(problems) == len(broken) + 1
    assert out["problems"].exists()


def test_the_paper_says_which_raw_files_were_left_out(broken_run, tmp_path):
    from luksbench.publish import render

    raw_dir, broken = broken_run
    processed = tmp_path / "processed"
    ingest.write_processed(raw_dir, processed)
    write_loss(processed)
    figures = tmp_path / "figures"
    figures.mkdir()
    text = render.render_paper(
        processed, figures, tmp_path / "paper" / "index.md", "sample"
    ).read_text()
    for name in broken:
        assert f"Raw file `{name}` was left out:" in text


def test_implausible_cpu_sidecars_and_results_the_manifest_does_not_record(tmp_path):
    """A CPU sidecar no /proc/stat reading can give, a stray copy of a result that no run wrote
    and a result the manifest records but that is gone: each named, none a value in the table."""
    raw_dir = tmp_path / "sample"
    shutil.copytree(SAMPLE, raw_dir)
    cell = raw_dir / HOST / "fio" / "luks" / "read-4k-qd1"
    expected = {}
    for k, (key, value) in enumerate(
        {"busy_s": -1.0, "busy_pct": 250.0, "interval_s": 0}.items(), 1
    ):
        sidecar = cell / f"rep{k}.cpu.json"
        replace(sidecar, json.dumps({**json.loads(sidecar.read_text()), key: value}))
        expected[sidecar] = f"{key} is {value}"
    stray = rep(raw_dir, "plain", "write-4k-qd1", 7)
    shutil.copyfile(rep(raw_dir, "plain", "write-4k-qd1", 2), stray)
    expected[stray] = "not a run the manifest records"
    gone = rep(raw_dir, "plain", "randread-1m-qd1", 3)
    gone.unlink()
    expected[gone] = "missing: the manifest records it as written"

    tables = ingest.ingest_run(raw_dir)
    problems = tables["problems"].set_index("file")["reason"]
    assert len(problems) == len(expected)
    for path, why in expected.items():
        assert why in problems[path.relative_to(raw_dir).as_posix()]
    fio = tables["fio"]
    assert stray.relative_to(raw_dir).as_posix() not in set(fio["file"])
    assert fio["rep"].max() == 3
    cpu = fio[["busy_cpu_s", "sys_cpu_s", "cpu_interval_s", "busy_cpu_s_per_gib"]]
    assert (cpu.dropna() > 0).all().all() and (fio["busy_cpu_pct"].dropna() <= 100).all()
    assert not (fio["stack"].eq("luks") & fio["workload"].eq("read-4k-qd1")).any()


@pytest.mark.parametrize("folder", ["empty", "raw root"])
def test_loss_on_a_folder_without_results_says_so(folder, tmp_path, capsys):
    from luksbench.cli import main

    raw_dir = tmp_path / "empty" if folder == "empty" else SAMPLE.parent  # data/raw, not a run
    raw_dir.mkdir(exist_ok=True)
    assert main(["loss", str(raw_dir)]) == 1
    assert f"luksbench loss: no fio results under {raw_dir}" in capsys.readouterr().err
