"""``luksbench parse``'s CSV is safe to open in a spreadsheet: a fio job name or a cipher name
from a raw file that starts like a formula is written as text (a leading ``'``), the same rule
as the processed CSVs; numbers, negative ones too, stay numbers."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from luksbench import cli
from luksbench.analysis.tablefiles import FORMULA_START

REPO = Path(__file__).resolve().parents[2]
REP = REPO / "data/raw/sample/vm/fio/plain/read-4k-qd1/rep1.json"
FORMULAS = ("=cmd|' /C calc'!A0", "+1+2", "-2+3", "@SUM(1)")
CRYPTSETUP = (
    "# Tests are approximate using memory only (no storage IO).\n"
    "PBKDF2-sha256    3116124 iterations per second for 256-bit key\n"
    '    =HYPERLINK("x")   512b  1000.0 MiB/s  1100.0 MiB/s\n'
)


def parse(*args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "luksbench.cli", "parse", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return list(csv.DictReader(io.StringIO(done.stdout, newline="")))


def test_the_cli_rule_is_the_dictionary_rule():
    assert cli.FORMULA_START == FORMULA_START


def test_fio_job_names_that_start_like_a_formula_are_text(tmp_path):
    files = []
    for k, name in enumerate(FORMULAS):
        doc = json.loads(REP.read_text())
        for job in doc["jobs"]:
            job["jobname"] = name
        files.append(tmp_path / f"rep{k}.json")
        files[-1].write_text(json.dumps(doc))
    rows = parse("fio", *map(str, files))
    assert [r["job"] for r in rows] == [f"'{name}" for name in FORMULAS]
    for row in rows:
        text = [v for v in row.values() if v[:1] in FORMULA_START and v[1:2] != ""]
        assert all(v.startswith("'") or _number(v) for v in text), text


def test_cryptsetup_names_that_start_like_a_formula_are_text(tmp_path):
    path = tmp_path / "cryptsetup-benchmark.txt"
    path.write_text(CRYPTSETUP)
    rows = parse("cryptsetup", str(path))
    names = [v for row in rows for v in row.values() if "HYPERLINK" in v]
    assert names and all(v.startswith("'=") for v in names), rows


def test_numbers_stay_numbers():
    assert cli.csv_text_cell(-5) == -5 and cli.csv_text_cell(-2.5) == -2.5
    assert cli.csv_text_cell("plain") == "plain" and cli.csv_text_cell("") == ""


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
