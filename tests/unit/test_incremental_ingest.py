"""Incremental and parallel ingest: only new or changed raw files are parsed, in worker processes,
and the tables are exactly those of a full ingest in one process.

The run folder is a copy of the shipped sample (real fio json+ output) with a second host (a copy of
the first, as a second test box would deliver it), one bad file and one file with two documents.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from simulate import rerecord

from luksbench.analysis import ingest, ingest_parse

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "raw" / "sample"


def full_ingest(raw: Path) -> dict[str, pd.DataFrame]:
    """The reference: everything parsed, in this process, no cache."""
    return ingest.ingest_run(raw, cache_dir=None, workers=1)


def assert_same_tables(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], obj=name)
    for key in ("problems", "notes"):
        assert got["fio"].attrs[key] == want["fio"].attrs[key], key


def writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the sample's results are read-only


@pytest.fixture
def raw(tmp_path) -> Path:
    raw = tmp_path / "raw" / "inc"
    shutil.copytree(SAMPLE, raw)
    writable(raw)
    shutil.copytree(raw / "vm", raw / "vm2")
    cell = raw / "vm2" / "fio" / "luks" / "read-4k-qd1"
    (cell / "rep2.json").write_text((cell / "rep2.json").read_text()[:500])  # truncated
    twice = raw / "vm" / "fio" / "plain" / "read-1m-qd1" / "rep1.json"
    twice.write_text(twice.read_text() + "\n" + twice.read_text())  # two documents: a note
    # an adaptive design on one host: per-cell targets, one cell at the cap
    (raw / "vm" / "fio" / "targets.json").write_text(
        json.dumps({"pairs": {"read-1m-qd1": 6, "write-4k-qd1": 12}, "noisy": ["write-4k-qd1"]})
    )
    return raw


@pytest.fixture
def small_chunks(monkeypatch):
    """Several chunks and a real process pool even for the sample's 192 files."""
    monkeypatch.setattr(ingest_parse, "CHUNK_FILES", 17)
    monkeypatch.setattr(ingest_parse, "PARALLEL_MIN_FILES", 1)


def test_parallel_chunks_equal_one_process(raw, small_chunks):
    want = full_ingest(raw)
    assert len(want["fio"]) == 2 * 2 * 16 * 3 - 1 and len(want["fio"].attrs["problems"]) == 1
    assert len(want["fio"].attrs["notes"]) == 1
    design = want["fio"].groupby(["host", "workload"])[["target_pairs", "hit_cap"]].first()
    assert design.loc[("vm", "write-4k-qd1")].tolist() == [12, True]
    assert design["target_pairs"].notna().sum() == 2  # vm2 has no targets.json
    got = ingest.ingest_run(raw, workers=2)
    assert_same_tables(got, want)


@pytest.mark.slow
def test_only_new_or_changed_files_are_parsed(raw, tmp_path, small_chunks):
    cache = tmp_path / "cache"
    first = ingest.ingest_run(raw, cache_dir=cache, workers=2)
    assert first["fio"].attrs["ingest"] == {"files": 192, "parsed": 192, "reused": 0}
    assert_same_tables(first, full_ingest(raw))

    again = ingest.ingest_run(raw, cache_dir=cache, workers=2)
    assert again["fio"].attrs["ingest"]["parsed"] == 0
    assert_same_tables(again, full_ingest(raw))

    # a run extended by a fourth repetition of one cell (both stacks, with CPU sidecars)
    for stack in ("plain", "luks"):
        cell = raw / "vm" / "fio" / stack / "randread-4k-qd32"
        shutil.copyfile(cell / "rep3.json", cell / "rep4.json")
        shutil.copyfile(cell / "rep3.cpu.json", cell / "rep4.cpu.json")
    rerecord(raw / "vm")  # the manifest records the new runs, as the runner's would
    extended = ingest.ingest_run(raw, cache_dir=cache, workers=2)
    assert extended["fio"].attrs["ingest"] == {"files": 194, "parsed": 2, "reused": 192}
    assert_same_tables(extended, full_ingest(raw))
    assert set(extended["fio"]["rep"]) == {1, 2, 3, 4}

    # the truncated file replaced by a good one, and a CPU sidecar rewritten beside a result:
    # both results are parsed again (their size, mtime or inode changed), nothing else
    bad = raw / "vm2" / "fio" / "luks" / "read-4k-qd1" / "rep2.json"
    good = raw / "vm" / "fio" / "luks" / "read-4k-qd1" / "rep2.json"
    bad.unlink()
    shutil.copyfile(good, bad)
    sidecar = raw / "vm2" / "fio" / "plain" / "write-1m-qd1" / "rep1.cpu.json"
    doc = json.loads(sidecar.read_text())
    sidecar.unlink()
    doc["busy_s"] = 1.0
    sidecar.write_text(json.dumps(doc))
    fixed = ingest.ingest_run(raw, cache_dir=cache, workers=2)
    assert fixed["fio"].attrs["ingest"]["parsed"] == 2
    assert fixed["fio"].attrs["problems"] == []
    assert_same_tables(fixed, full_ingest(raw))

    # a result that disappeared (raw is never deleted, but a copied run may lack files)
    (raw / "vm2" / "fio" / "plain" / "write-4k-qd1" / "rep3.json").unlink()
    fewer = ingest.ingest_run(raw, cache_dir=cache, workers=1)
    assert fewer["fio"].attrs["ingest"]["parsed"] == 0
    assert_same_tables(fewer, full_ingest(raw))


def test_a_parser_change_invalidates_the_cache(raw, tmp_path):
    cache = tmp_path / "cache"
    ingest.fio_table(raw, strict=False, cache_dir=cache, workers=1)
    meta = json.loads((cache / "meta.json").read_text())
    assert meta["code"] == ingest._IngestCache.code_digest()
    (cache / "meta.json").write_text(json.dumps({**meta, "code": "an older parser"}))
    df = ingest.fio_table(raw, strict=False, cache_dir=cache, workers=1)
    assert df.attrs["ingest"]["parsed"] == 192
    (cache / "files.parquet").write_bytes(b"not parquet")  # a damaged cache is rebuilt, not fatal
    df = ingest.fio_table(raw, strict=False, cache_dir=cache, workers=1)
    assert df.attrs["ingest"]["parsed"] == 192


def test_a_cache_save_cut_short_is_not_read(raw, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    ingest.ingest_run(raw, cache_dir=cache, workers=1)
    for stack in ("plain", "luks"):  # a new pair of results, then a save that stops half way
        cell = raw / "vm" / "fio" / stack / "randread-4k-qd32"
        shutil.copyfile(cell / "rep3.json", cell / "rep4.json")
        shutil.copyfile(cell / "rep3.cpu.json", cell / "rep4.cpu.json")
    rerecord(raw / "vm")
    write = pd.DataFrame.to_parquet

    def stop_at_the_files_table(df, path, *args, **kwargs):
        if "files" in Path(path).name:
            raise KeyboardInterrupt  # rows.parquet is new, files.parquet still the old one
        return write(df, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", stop_at_the_files_table)
    with pytest.raises(KeyboardInterrupt):
        ingest.ingest_run(raw, cache_dir=cache, workers=1)
    monkeypatch.setattr(pd.DataFrame, "to_parquet", write)
    assert_same_tables(ingest.ingest_run(raw, cache_dir=cache, workers=1), full_ingest(raw))


def test_write_processed_is_incremental_and_leaves_raw_alone(raw, tmp_path, capsys):
    before = {p: p.read_bytes() for p in raw.rglob("*") if p.is_file()}
    processed = tmp_path / "processed" / "inc"
    first = {k: pd.read_parquet(v) for k, v in ingest.write_processed(raw, processed).items()}
    assert (processed / ingest.CACHE_DIRNAME / "files.parquet").is_file()
    second = {k: pd.read_parquet(v) for k, v in ingest.write_processed(raw, processed).items()}
    for name in first:
        pd.testing.assert_frame_equal(first[name], second[name], obj=name)
    full = ingest.write_processed(raw, tmp_path / "full", incremental=False, workers=1)
    assert not (tmp_path / "full" / ingest.CACHE_DIRNAME).exists()
    for name, path in full.items():
        pd.testing.assert_frame_equal(first[name], pd.read_parquet(path), obj=name)
    assert {p: p.read_bytes() for p in raw.rglob("*") if p.is_file()} == before
    assert "vm2/fio/luks/read-4k-qd1/rep2.json" in capsys.readouterr().err


def test_schedule_comes_from_every_session_record(raw):
    sched = ingest.schedule_table(raw)
    assert list(sched.columns) == ingest.SCHEDULE_COLUMNS
    # the sample ran in one session: 16 cells x 2 stacks x 3 repetitions per host
    assert sched.groupby("host").size().to_dict() == {"vm": 96, "vm2": 96}
    assert (sched["ended"] > sched["started"]).all()
    assert (sched["started"] >= sched["session_started"]).all()
    assert set(sched["status"]) == {"ok"}
    one = sched[(sched["host"] == "vm") & (sched["rep"] == 2)]
    assert set(one["round"]) == {2}


def test_histogram_bins_travel_as_arrays_with_every_bin(raw):
    """A file's json+ bins become four arrays (no tuple per bin) holding every (ns, count)."""
    from luksbench.formats.fio import document_histograms, load_fio_document

    path = next(raw.glob("vm/fio/*/*/rep1.json"))
    histograms = document_histograms(load_fio_document(path, lambda _note: None))
    assert histograms, "the sample's results carry json+ bins"
    index, direction, ns, count = ingest_parse._histogram_arrays(histograms)
    assert all(isinstance(a, np.ndarray) for a in (index, direction, ns, count))
    got = sorted(zip(index.tolist(), direction.tolist(), ns.tolist(), count.tolist(), strict=True))
    want = sorted((i, d, x, n) for (i, d), hist in histograms.items() for x, n in hist)
    assert got == want
    frame = ingest_parse._bins_frame([path.name], [(index, direction, ns, count)])
    assert frame.columns.tolist() == ingest_parse._BIN_COLUMNS
    assert frame["ns"].dtype == "int64" and frame["_key"].eq(path.name).all()
