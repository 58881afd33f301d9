"""Impossible numbers are problems: a fio result whose json+ bins hold negative or absurd counts,
whose bandwidth io_bytes / runtime contradicts beyond fio's rounding, or whose timestamp is no
date is named in `problems` and left out of every statistic. No real fio output is flagged.

Mutations are made on copies (tmp) of the shipped sample's real json+ results.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from luksbench.analysis import ingest
from luksbench.formats.fio import (
    FioParseError,
    document_tuples,
    implausible_numbers,
    load_fio_document,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
HOST = next(p.name for p in SAMPLE.iterdir() if p.is_dir())
GOOD = SAMPLE / HOST / "fio" / "plain" / "read-4k-qd1" / "rep1.json"


def verdict(doc: dict) -> str | None:
    return implausible_numbers(doc, document_tuples("rep1.json", doc))


def first_bin(doc: dict) -> str:
    return next(iter(doc["jobs"][0]["read"]["clat_ns"]["bins"]))


def negative_bin(doc):
    doc["jobs"][0]["read"]["clat_ns"]["bins"][first_bin(doc)] = -3


def absurd_bin(doc):
    doc["jobs"][0]["read"]["clat_ns"]["bins"][first_bin(doc)] = 10**15


def fractional_bin(doc):
    doc["jobs"][0]["read"]["clat_ns"]["bins"][first_bin(doc)] = 2.5


def bandwidth_1000x(doc):
    doc["jobs"][0]["read"]["bw_bytes"] *= 1000
    doc["jobs"][0]["read"]["bw"] *= 1000


def bandwidth_half(doc):
    doc["jobs"][0]["read"]["bw_bytes"] //= 2


def timestamp_negative(doc):
    doc["timestamp"] = -5


def timestamp_far_future(doc):
    doc["timestamp"] = 10**15


def timestamp_text(doc):
    doc["timestamp"] = "yesterday"


def timestamp_ms_float(doc):
    doc["timestamp_ms"] = 1.5e12


MUTATIONS = {
    negative_bin: "json+ histogram bin count -3",
    absurd_bin: "json+ histogram counts 10000000000",
    fractional_bin: "json+ histogram bin count 2.5",
    bandwidth_1000x: "000 B/s, but io_bytes / runtime is",
    bandwidth_half: "but io_bytes / runtime is",
    timestamp_negative: "timestamp is -5, not a date",
    timestamp_far_future: "timestamp is 1000000000000000, not a date",
    timestamp_text: "timestamp is 'yesterday', not a date",
    timestamp_ms_float: "timestamp_ms is 1500000000000.0, not a date",
}


@pytest.mark.parametrize("mutate", list(MUTATIONS), ids=lambda f: f.__name__)
def test_an_impossible_number_is_named(mutate):
    doc = json.loads(GOOD.read_text())
    assert verdict(doc) is None
    mutate(doc)
    assert MUTATIONS[mutate] in verdict(doc)


def test_fio_rounding_is_not_a_problem():
    """bw in whole KiB/s and runtime in whole ms: a KiB/s off is rounding, not a lie."""
    doc = json.loads(GOOD.read_text())
    doc["jobs"][0]["read"]["bw_bytes"] += 1000
    doc["jobs"][0]["read"]["runtime"] += 1
    assert verdict(doc) is None


def real_fio_files(external_dir: Path, fixtures_dir: Path) -> list[Path]:
    found = [
        *external_dir.rglob("*.json"),
        *fixtures_dir.glob("*.json"),
        *SAMPLE.rglob("rep*.json"),
    ]
    return sorted(p for p in found if not p.name.endswith(".cpu.json"))


def test_no_real_fio_output_is_flagged(external_dir, fixtures_dir):
    checked = 0
    for path in real_fio_files(external_dir, fixtures_dir):
        try:
            doc = load_fio_document(path, lambda note: None)
            rows = document_tuples(path, doc)
        except FioParseError:
            continue  # not fio output: the parser's own tests cover these
        assert implausible_numbers(doc, rows) is None, path
        checked += 1
    assert checked >= 100


def test_ingest_names_the_file_in_problems_and_leaves_it_out(tmp_path):
    raw_dir = tmp_path / "sample"
    shutil.copytree(SAMPLE, raw_dir)
    broken = {}
    for k, (stack, mutate) in enumerate(
        [("plain", absurd_bin), ("luks", bandwidth_1000x), ("plain", timestamp_negative)], 1
    ):
        path = raw_dir / HOST / "fio" / stack / "randread-4k-qd1" / f"rep{k}.json"
        doc = json.loads(path.read_text())
        doc["jobs"][0]["read"]["clat_ns"]["bins"].setdefault("1000", 1)
        mutate(doc)
        path.chmod(0o644)
        path.write_text(json.dumps(doc))
        broken[path.relative_to(raw_dir).as_posix()] = MUTATIONS[mutate]
    tables = ingest.ingest_run(raw_dir)
    excluded = tables["problems"][tables["problems"]["severity"] == "excluded"]
    assert sorted(excluded["file"]) == sorted(broken)
    for row in excluded.itertuples():
        assert "numbers that cannot be true" in row.reason and broken[row.file] in row.reason
    assert not set(tables["fio"]["file"]) & set(broken)
    latency = tables["latency"]
    cell = latency[latency["workload"] == "randread-4k-qd1"]
    kept = {(r.stack, r.rep) for r in cell.itertuples()}
    assert not kept & {("plain", 1), ("luks", 2), ("plain", 3)}, "their bins reached the latency"
    assert kept, "the cell's other results keep their bins"
    with pytest.raises(ingest.IngestError, match="bandwidth"):
        ingest.ingest_run(raw_dir, strict=True)
