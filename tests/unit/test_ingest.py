"""Ingest on a raw layout built from REAL fio output (TUM-DSE/CVM_eval plain vs dm-crypt runs).

The sources under /work/shared/datasets/external are copied, never edited
(``testkit.raw.build_raw``):

* host ``tum-direct2``, cell ``randread-4k-qd32``: pair 1 = native VM (no-dmcrypt vs dm-crypt),
  pair 2 = SEV VM (no-dmcrypt vs dm-crypt); fio 3.36, 10 stonewalled jobs per file.
* host ``tum-vm``, same cell: one pair of virtio-blk runs (plain vs "encr"), fio 3.30, 4 jobs x
  numjobs=4 without group_reporting, job names differ between the stacks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from testkit.raw import TUM, WORKLOAD, build_raw

from luksbench.analysis import ingest
from luksbench.formats.envdoc import env_facts
from luksbench.formats.fio import FIO_COLUMNS


@pytest.fixture
def raw_dir(external_dir, tmp_path) -> Path:
    return build_raw(external_dir, tmp_path / "raw" / "tumrun")


def _snapshot(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def test_fio_table_columns_and_layout(raw_dir):
    fio = ingest.fio_table(raw_dir)
    expected = (
        ingest.FIO_LAYOUT_COLUMNS
        + ["fio_hostname" if c == "host" else c for c in FIO_COLUMNS]
        + ingest.FIO_DERIVED_COLUMNS
    )
    assert list(fio.columns[: len(expected)]) == expected
    assert set(fio["run"]) == {"tumrun"}
    assert set(fio["host"]) == {"tum-direct2", "tum-vm"}
    assert set(fio["stack"]) == {"plain", "luks"}
    assert set(fio["workload"]) == {WORKLOAD}
    # 10 jobs, randrw jobs give two rows: 12 rows per file on the first host
    d2 = fio[(fio["host"] == "tum-direct2") & (fio["stack"] == "plain") & (fio["rep"] == 1)]
    assert len(d2) == 12
    assert d2["job_slot"].nunique() == 10
    # the virtio pair: 16 entries (4 jobs x numjobs=4) -> 4 job slots, names differ per stack
    vm = fio[fio["host"] == "tum-vm"]
    assert vm.groupby("stack")["job_slot"].nunique().to_dict() == {"luks": 4, "plain": 4}
    assert vm.groupby("stack")["job"].nunique().to_dict() == {"luks": 4, "plain": 4}
    assert set(vm[vm["stack"] == "plain"]["job"]).isdisjoint(vm[vm["stack"] == "luks"]["job"])
    # file paths are relative to the run folder (processed tables do not depend on where raw sits)
    assert all(not Path(f).is_absolute() for f in fio["file"])
    assert (fio["io_gib"] * 2**30 == fio["io_bytes"]).all()


def test_cpu_sidecar_columns(raw_dir):
    fio = ingest.fio_table(raw_dir)
    d2 = fio[fio["host"] == "tum-direct2"]
    assert set(d2["busy_cpu_s"]) == {315.0, 325.0}
    assert set(d2["sys_cpu_s"]) == {210.0, 220.0}
    one = d2[(d2["stack"] == "plain") & (d2["rep"] == 1)]
    assert one["busy_cpu_s_per_gib"].iloc[0] == pytest.approx(315.0 / one["io_gib"].sum())
    assert (
        fio[fio["host"] == "tum-vm"][["busy_cpu_s", "sys_cpu_s", "busy_cpu_pct"]].isna().all().all()
    )


def test_env_stacks_cryptsetup(raw_dir):
    env = ingest.env_table(raw_dir).set_index("host")
    assert list(ingest.env_table(raw_dir).columns) == ingest.ENV_COLUMNS
    assert env.loc["tum-direct2", "backend"] == "kernel"
    assert env.loc["tum-direct2", "backend_reason"] == "dm-crypt available"
    assert env.loc["tum-direct2", "kernel"] == "6.6.0"
    assert env.loc["tum-direct2", "cpu_model"].startswith("AMD EPYC")
    assert bool(env.loc["tum-direct2", "vaes"]) is True
    assert env.loc["tum-direct2", "fio_version"] == "fio-3.36"
    assert bool(env.loc["tum-vm", "aes"]) is True and bool(env.loc["tum-vm", "vaes"]) is False
    stacks = ingest.stacks_table(raw_dir)
    assert len(stacks) == 4 and set(stacks["kind"]) == {"plain", "luks"}
    cs = ingest.cryptsetup_table(raw_dir)
    assert {"run", "host", "encryption_mib_s", "available", "note"} <= set(cs.columns)
    aes = cs[
        (cs["host"] == "tum-direct2") & (cs["algorithm"] == "aes-xts") & (cs["key_bits"] == 512)
    ]
    assert aes["encryption_mib_s"].iloc[0] == pytest.approx(1983.0)
    assert not cs[cs["host"] == "tum-vm"]["available"].fillna(True).all()


def test_write_processed_is_read_only_on_raw(raw_dir, tmp_path):
    before = _snapshot(raw_dir)
    out = ingest.write_processed(raw_dir, tmp_path / "processed")
    assert sorted(p.name for p in out.values()) == sorted(ingest.PROCESSED_FILES)
    assert _snapshot(raw_dir) == before
    tables = ingest.read_processed(tmp_path / "processed")
    assert len(tables["fio"]) == len(ingest.fio_table(raw_dir))
    with pytest.raises(ValueError, match="raw is read-only"):
        ingest.write_processed(raw_dir, raw_dir / "processed")


def test_latency_table_holds_the_json_plus_bins_of_every_active_row(tmp_path):
    """The sample's json+ histograms, read at ingest: per file in name order, its rows in table
    order, only directions that carry the job's I/O; bins as the parser reads them."""
    from luksbench.analysis.stats import active_rows
    from luksbench.formats.fio import clat_histogram

    sample = Path(__file__).resolve().parents[2] / "data" / "raw" / "sample"
    ingest.write_processed(sample, tmp_path / "processed")
    tables = ingest.read_processed(tmp_path / "processed")
    fio, latency = tables["fio"], tables["latency"]
    assert list(latency.columns) == ingest.LATENCY_COLUMNS
    want = []
    for file, rows in active_rows(fio).groupby("file", sort=True):
        bins = clat_histogram(sample / file)
        for r in rows.itertuples():
            for ns, count in bins.get((r.job_index, r.direction), []):
                want.append(
                    (r.host, r.stack, r.workload, r.rep, r.job_slot, r.direction, ns, count)
                )
    columns = ["host", "stack", "workload", "rep", "job_slot", "direction", "ns", "count"]
    assert list(latency[columns].itertuples(index=False, name=None)) == want
    assert len(want) > 10_000 and set(latency["direction"]) == {"read", "write"}


def test_processed_is_independent_of_raw_location(raw_dir, tmp_path):
    moved = tmp_path / "elsewhere" / raw_dir.name
    shutil.copytree(raw_dir, moved)
    a = ingest.write_processed(raw_dir, tmp_path / "p1")
    b = ingest.write_processed(moved, tmp_path / "p2")
    for name in a:
        pd.testing.assert_frame_equal(pd.read_parquet(a[name]), pd.read_parquet(b[name]))


def test_bad_files_all_named_in_one_error(raw_dir, external_dir):
    bad = {
        # not JSON at all (fio option errors saved as .json)
        raw_dir
        / "tum-vm/fio/plain/write-4k-qd1/rep1.json": "CyberHuey__System-Testing/fio_output.json",
        # a real run whose first job failed with error 2
        raw_dir / "tum-vm/fio/luks/randread-4k-qd1/rep1.json": (
            f"{TUM}/logs/sev/direct/native-no-dmcrypt-aio-io_uring-8-nvme1n1-iou-long-direct-fio-2024-02-08-11-50-00.log"
        ),
        # folder says 1m sequential write, the file ran randread 4k qd128
        raw_dir
        / "tum-vm/fio/luks/write-1m-qd1/rep1.json": f"{TUM}/io-benchmarks/baremetal-randread-4k-4-128.json",
    }
    for dst, src in bad.items():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(external_dir / src, dst)
    sidecar = raw_dir / "tum-direct2/fio/luks" / WORKLOAD / "rep1.cpu.json"
    sidecar.write_text("{not json")
    stray = raw_dir / "tum-direct2/fio/luks" / WORKLOAD / "notes.json"
    stray.write_text("{}")
    with pytest.raises(ingest.IngestError) as info:
        ingest.fio_table(raw_dir)
    message = str(info.value)
    problems = dict(info.value.problems)
    for path in [*bad, sidecar, stray]:
        assert str(path) in message
        assert path in problems
    assert len(problems) == 5
    assert "failed with error" in problems[raw_dir / "tum-vm/fio/luks/randread-4k-qd1/rep1.json"]
    assert "write-1m-qd1" in problems[raw_dir / "tum-vm/fio/luks/write-1m-qd1/rep1.json"]
    assert "CPU sidecar" in problems[sidecar]
    # non-strict: the good files still come through, the bad ones are listed
    fio = ingest.fio_table(raw_dir, strict=False)
    assert len(fio.attrs["problems"]) == 5
    assert set(fio["workload"]) == {WORKLOAD}
    assert not (fio["host"].eq("tum-direct2") & fio["stack"].eq("luks") & fio["rep"].eq(1)).any()


def test_bad_env_json_and_missing_run(raw_dir, tmp_path):
    (raw_dir / "tum-vm" / "env.json").write_text("[1, 2")
    with pytest.raises(ingest.IngestError, match=r"tum-vm/env\.json"):
        ingest.ingest_run(raw_dir, strict=True)
    problems = ingest.ingest_run(raw_dir)["problems"]
    assert list(problems["file"]) == ["tum-vm/env.json"]
    assert problems["reason"].iloc[0].startswith("not readable JSON")
    with pytest.raises(FileNotFoundError):
        ingest.fio_table(tmp_path / "does-not-exist")


def test_env_facts_of_testbox_capture():
    """The shape luksbench.testbox.capture.capture_env writes."""
    env = {
        "hostname": "box",
        "kernel": {"sysname": "Linux", "release": "6.1.0-18-amd64"},
        "cpu": {"model": "Xeon", "count": 2, "aes": True, "vaes": False, "flags": ["aes", "avx2"]},
        "tools": {"fio": "fio-3.33", "cryptsetup": "cryptsetup 2.6.1", "qemu-storage-daemon": None},
        "backend": {"requested": "auto", "selected": "userspace", "reason": "auto: no dm"},
    }
    facts = env_facts(env)
    assert facts["kernel"] == "6.1.0-18-amd64"
    assert facts["backend"] == "userspace" and facts["backend_reason"] == "auto: no dm"
    assert facts["aes"] is True and facts["vaes"] is False
    assert facts["qemu_version"] is None


def test_manifest_times_are_utc_and_malformed_ones_missing():
    from luksbench.analysis.ingest import _utc_times

    raw = ["2026-11-21T08:51:07.400Z", "2026-11-21T08:51:07", "2026-11-21T09:51:07+01:00"]
    times = _utc_times(pd.Series([*raw, "garbage", None, 5, ""], dtype=object))
    assert str(times.dtype) == "datetime64[ns, UTC]"
    assert times[:3].tolist() == [
        pd.Timestamp("2026-11-21T08:51:07.4Z"),
        pd.Timestamp("2026-11-21T08:51:07Z"),
        pd.Timestamp("2026-11-21T08:51:07Z"),
    ]
    assert times[3:].isna().all()


def test_each_json_document_is_decoded_once_per_ingest(tmp_path, monkeypatch):
    """The stacks, schedule, fleet and recorded-results steps all read the manifests (megabytes
    in a large run): one decode of each file per ingest, nothing kept after it."""
    from luksbench.formats import layout

    sample = tmp_path / "sample"
    shutil.copytree(Path(__file__).resolve().parents[2] / "data" / "raw" / "sample", sample)
    decoded, read = [], layout.read_raw_file  # what read_json_object reads with
    monkeypatch.setattr(layout, "read_raw_file", lambda p: decoded.append(str(p)) or read(p))
    ingest.ingest_run(sample, workers=1)
    assert any(p.endswith("fio/manifest.json") for p in decoded)
    assert sorted(decoded) == sorted(set(decoded))
    assert ingest._decoded_json.cache_info().currsize == 0
