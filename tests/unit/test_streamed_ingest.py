"""Ingest streams: the fio results are parsed a chunk of files at a time and each chunk's latency
rows are appended to ``latency.parquet`` as it comes, so memory stays flat in the number of files;
the tables written are exactly those of the whole run ingested at once.

The reference is :func:`tablefiles.write_tables` of :func:`ingest.ingest_run` with one chunk
holding every file (how the tables were written before ingest streamed).
"""

from __future__ import annotations

import filecmp
import hashlib
import shutil
from pathlib import Path

import pandas as pd
import pytest
from simulate import rerecord

from luksbench.analysis import ingest, ingest_parse, tablefiles

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "raw" / "sample"
ALL_AT_ONCE = 10**9


def whole_run_tables(raw: Path, out: Path) -> Path:
    """The reference folder: every table built in memory from one chunk, then written."""
    out.mkdir(parents=True)
    tables = ingest.ingest_run(raw, workers=1, chunk_files=ALL_AT_ONCE)
    for table in tables.values():
        table.attrs = {}
    tablefiles.write_tables(
        out, tables, ingest.machine_paths(tables["env"], raw.resolve(), tables["job_devices"])
    )
    return out


def assert_same_folder(got: Path, want: Path) -> None:
    names = sorted(p.name for p in want.iterdir() if p.is_file())
    assert names == sorted(p.name for p in got.iterdir() if p.is_file())  # no spool left behind
    for name in names:
        if name.endswith(".parquet"):
            pd.testing.assert_frame_equal(
                pd.read_parquet(got / name), pd.read_parquet(want / name), obj=name
            )
        else:  # the CSV files and the column dictionary, byte for byte
            assert filecmp.cmp(got / name, want / name, shallow=False), name


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(f"{path.relative_to(folder)} {path.stat().st_mtime_ns}".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def two_hosts(tmp_path) -> Path:
    """The sample (real fio json+ results) with a copy of its host as a second test box."""
    raw = tmp_path / "raw" / "streamed"
    shutil.copytree(SAMPLE, raw)
    for p in [raw, *raw.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the sample's results are read-only
    shutil.copytree(raw / "vm", raw / "vm2")
    return raw


def test_the_latency_table_arrives_in_chunks_of_bounded_size(two_hosts):
    chunks = []
    fio = ingest.streamed_fio_table(two_hosts, chunks.append, workers=1, chunk_files=7)
    files = fio["file"].nunique()
    assert files == 192
    assert len(chunks) == -(-files // 7)
    runs = ["host", "stack", "workload", "rep"]  # one file each
    assert all(len(chunk[runs].drop_duplicates()) <= 7 for chunk in chunks)
    assert sum(map(len, chunks)) > 0
    whole = ingest.fio_and_latency_tables(two_hosts, workers=1, chunk_files=ALL_AT_ONCE)
    pd.testing.assert_frame_equal(fio, whole[0])
    pd.testing.assert_frame_equal(pd.concat(chunks, ignore_index=True), whole[1])


def test_streamed_files_equal_the_whole_run_on_the_sample(tmp_path):
    want = whole_run_tables(SAMPLE, tmp_path / "whole")
    got = tmp_path / "streamed"
    ingest.write_processed(SAMPLE, got, incremental=False, workers=1, chunk_files=5)
    assert_same_folder(got, want)


@pytest.mark.slow  # five ingests, one with a process pool
def test_streamed_files_equal_the_whole_run_in_parallel_and_from_the_cache(
    two_hosts, tmp_path, monkeypatch
):
    monkeypatch.setattr(ingest_parse, "PARALLEL_MIN_FILES", 1)  # a real pool for 192 files
    # a bad file and a two-document file: a problem and a note among the chunks
    cell = two_hosts / "vm2" / "fio" / "luks" / "read-4k-qd1"
    (cell / "rep2.json").write_text((cell / "rep2.json").read_text()[:500])
    twice = two_hosts / "vm" / "fio" / "plain" / "read-1m-qd1" / "rep1.json"
    twice.write_text(twice.read_text() + "\n" + twice.read_text())
    got = tmp_path / "streamed"
    ingest.write_processed(two_hosts, got, workers=2, chunk_files=11)
    assert_same_folder(got, whole_run_tables(two_hosts, tmp_path / "whole"))
    assert (got / ingest.CACHE_DIRNAME / "bins.parquet").is_file()

    # new results in the middle of the name order: cached bins and parsed ones, chunk by chunk
    for stack in ("plain", "luks"):
        cell = two_hosts / "vm" / "fio" / stack / "randread-4k-qd32"
        shutil.copyfile(cell / "rep3.json", cell / "rep4.json")
        shutil.copyfile(cell / "rep3.cpu.json", cell / "rep4.cpu.json")
    rerecord(two_hosts / "vm")
    ingest.write_processed(two_hosts, got, workers=2, chunk_files=11)
    want = whole_run_tables(two_hosts, tmp_path / "whole2")
    assert_same_folder(got, want)
    ingest.write_processed(two_hosts, got, workers=1, chunk_files=3)  # nothing new, other chunks
    assert_same_folder(got, want)


@pytest.mark.slow
def test_a_strict_ingest_of_a_bad_file_names_it_and_writes_nothing(two_hosts, tmp_path):
    bad = two_hosts / "vm2" / "fio" / "luks" / "read-4k-qd1" / "rep2.json"
    bad.write_text(bad.read_text()[:500])
    raw_before = digest(two_hosts)
    processed = tmp_path / "processed" / "strict"
    with pytest.raises(ingest.IngestError) as err:
        ingest.write_processed(two_hosts, processed, strict=True, workers=1, chunk_files=7)
    assert "vm2/fio/luks/read-4k-qd1/rep2.json" in str(err.value)
    assert digest(two_hosts) == raw_before
    written = [p for p in processed.rglob("*") if ingest.CACHE_DIRNAME not in p.parts]
    assert written == []  # no table, no partial latency file

    # a folder with earlier tables keeps them, byte for byte, when a later strict ingest fails
    ingest.write_processed(two_hosts, processed, workers=1, chunk_files=7)
    tables = {p.name: p.read_bytes() for p in processed.iterdir() if p.is_file()}
    assert {"latency.parquet", "latency.csv", "fio.parquet"} <= set(tables)
    (bad.parent / "rep1.json").write_text("{")
    with pytest.raises(ingest.IngestError, match=r"rep1\.json"):
        ingest.write_processed(two_hosts, processed, strict=True, workers=1, chunk_files=7)
    assert {p.name: p.read_bytes() for p in processed.iterdir() if p.is_file()} == tables
