"""luksbench.formats.fio against the 29 real fio outputs of ../shared/datasets/external (see PROVENANCE.md)
plus hand-made negative inputs."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from luksbench.formats.fio import (
    FIO_COLUMNS,
    FioParseError,
    clat_histogram,
    load_fio_document,
    parse_fio_file,
)

REQUIRED_COLUMNS = [
    "file", "host", "job", "job_index", "direction", "rw", "bs_bytes", "iodepth", "numjobs",
    "runtime_ms", "io_bytes", "bw_bytes", "iops", "lat_mean_ns", "clat_mean_ns", "clat_p50_ns",
    "clat_p99_ns", "clat_p999_ns", "usr_cpu", "sys_cpu", "error", "fio_version",
]  # fmt: skip

PBENCH_CS = "distributed-system-analysis__pbench/agent/tool-scripts/postprocess/samples/fio-0/result/reference-result/fio-result.txt"
PBENCH_8 = "distributed-system-analysis__pbench/agent/tool-scripts/postprocess/samples/perf-fio-0/result/reference-result/fio-result.txt"
PKB_214 = "GoogleCloudPlatform__PerfKitBenchmarker/tests/data/fio/fio-parser-sample-result.json"
PKB_217 = "GoogleCloudPlatform__PerfKitBenchmarker/tests/data/fio/hist/pkb-7fb0c9d8-0_fio.json"
FIO_218 = "louwrentius__fio-plot/example_data/randread-01.json"
FAILED_22 = "louwrentius__fio-plot/party/fio/1m/run-1/write-64-1.json"
SIGINT_334 = "louwrentius__fio-plot/deleteme/fio/4k/randread-1-1.json"
RANDRW_316 = "louwrentius__fio-plot/benchmark_data/SERVER/HIGHPOINT/RAID5_RW/randrw-1-1.json"
FLOPPY = "louwrentius__fio-plot/benchmark_data/FLOPPY/random/randread-1-1.json"
TUM_QUICK = "TUM-DSE__CVM_eval/logs/sev/direct-2/{}-fio-2024-02-13-{}.log"
TUM_QUICK_FILES = [
    TUM_QUICK.format("native-aio-io_uring-8-nvme1n1-iou-quick-direct", "12-23-39"),
    TUM_QUICK.format("native-no-dmcrypt-aio-io_uring-8-nvme1n1-iou-quick-direct", "12-42-24"),
    TUM_QUICK.format("sev-aio-io_uring-8-nvme1n1-iou-quick-direct", "12-33-10"),
    TUM_QUICK.format("sev-no-dmcrypt-aio-io_uring-8-nvme1n1-iou-quick-direct", "12-51-40"),
]
TUM_LONG_ERROR_2 = "TUM-DSE__CVM_eval/logs/sev/direct/native-no-dmcrypt-aio-io_uring-8-nvme1n1-iou-long-direct-fio-2024-02-08-11-50-00.log"
TUM_BM_CRYPT = "TUM-DSE__CVM_eval/logs/baremetal/bm-crypt.json"
TUM_NUMJOBS4 = "TUM-DSE__CVM_eval/io-benchmarks/baremetal-randread-4k-4-128.json"
TUM_ARCHIVE = "TUM-DSE__CVM_eval/tools/archive/bm-results-archive/native-vm"
TUM_ARCHIVE_PLAIN = f"{TUM_ARCHIVE}/virtio-blk/iops/fio-result-iops-nosev-blk-q5h680yt5w.json"
TUM_ARCHIVE_ENCR = (
    f"{TUM_ARCHIVE}/encr/virtio-blk/iops/fio-result-iops-nosev-encr-blk-bvuo3oghsu.json"
)
JBERNSTEIN = "JBernsteinIV__disk_test/fio-results.json"
BENSON = "bensonjohnson__FIO-tests/fio.json"
NOT_JSON = "CyberHuey__System-Testing/fio_output.json"
BRAHIAM = "BrahiamAcosta__SO-Kernel-trace-extraction/fio_output.json"
ARAU = "Arau__fio-results-tmp/longterm-tests/bench-results"
ARAU_TWO_DOCS = f"{ARAU}/t1-writes/writes-100-0"
ARAU_STRAY_GT = f"{ARAU}/t1-reads/reads-100-2"
ARAU_RANDRW_32K = f"{ARAU}/t2-rand/out-rand-50rw32k.fio-0"
SS_IOPS = "vincentkfu__fio-blog/0001-steadystate/iops_mean.json"
SS_BW = "vincentkfu__fio-blog/0001-steadystate/bw_slope.json"
SS_THREE_DOCS = "vincentkfu__fio-blog/0001-steadystate/Figure1.json"
FIO_340 = "styliteag__fio-analyzer/scripts/fio_results_example_readwrite.json"

# Per file: rows, distinct job entries, directions of the rows, fio version, documents in file.
EXPECTED = {
    FIO_218: dict(rows=1, entries=1, directions={"read"}, version="fio-2.18-59-g618e"),
    SIGINT_334: dict(rows=1, entries=1, directions={"read"}, version="fio-3.34"),
    FAILED_22: dict(rows=1, entries=1, directions={"write"}, version="fio-3.33"),
    RANDRW_316: dict(rows=2, entries=1, directions={"read", "write"}, version="fio-3.16"),
    FLOPPY: dict(rows=1, entries=1, directions={"read"}, version="fio-3.1"),
    PKB_214: dict(rows=5, entries=5, directions={"read", "write"}, version="fio-2.1.4"),
    PKB_217: dict(rows=2, entries=2, directions={"read", "write"}, version="fio-2.17"),
    PBENCH_CS: dict(rows=10, entries=10, directions={"read"}, version="fio-3.7"),
    PBENCH_8: dict(rows=16, entries=8, directions={"read", "write"}, version="fio-3.19"),
    **{
        path: dict(rows=12, entries=10, directions={"read", "write"}, version="fio-3.36")
        for path in TUM_QUICK_FILES
    },
    TUM_LONG_ERROR_2: dict(rows=12, entries=10, directions={"read", "write"}, version="fio-3.36"),
    # Interrupted with signal 2 after the first job: 21 entries moved no data (placeholder rows;
    # the mixed randrw ones have direction "").
    TUM_BM_CRYPT: dict(rows=22, entries=22, directions={"read", "write", ""}, version="fio-3.36"),
    TUM_NUMJOBS4: dict(rows=4, entries=4, directions={"read"}, version="fio-3.33"),
    TUM_ARCHIVE_PLAIN: dict(rows=16, entries=16, directions={"read", "write"}, version="fio-3.30"),
    TUM_ARCHIVE_ENCR: dict(rows=16, entries=16, directions={"read", "write"}, version="fio-3.30"),
    JBERNSTEIN: dict(rows=8, entries=8, directions={"read"}, version="fio-3.1"),
    BENSON: dict(rows=2, entries=1, directions={"read", "write"}, version="fio-3.33"),
    BRAHIAM: dict(rows=1, entries=1, directions={"read"}, version="fio-3.36"),
    ARAU_TWO_DOCS: dict(rows=1, entries=1, directions={"write"}, version="fio-3.12", docs=2),
    ARAU_STRAY_GT: dict(rows=1, entries=1, directions={"read"}, version="fio-3.12"),
    ARAU_RANDRW_32K: dict(rows=2, entries=1, directions={"read", "write"}, version="fio-3.12"),
    SS_IOPS: dict(rows=1, entries=1, directions={"write"}, version="fio-3.30"),
    SS_BW: dict(rows=1, entries=1, directions={"read"}, version="fio-3.30"),
    SS_THREE_DOCS: dict(rows=1, entries=1, directions={"write"}, version="fio-3.30", docs=3),
    FIO_340: dict(rows=2, entries=1, directions={"read", "write"}, version="fio-3.40"),
}
PARSEABLE = sorted(EXPECTED)


# --------------------------------------------------------------------------- helpers


def _raw_documents(path: Path) -> list[dict]:
    """Independent oracle: every JSON object starting in column 0 (or right after a stray '>')."""
    text = path.read_text()
    decoder = json.JSONDecoder()
    documents, end = [], 0
    for match in re.finditer(r"^>?\{", text, re.MULTILINE):
        if match.end() - 1 < end:
            continue
        try:
            doc, end = decoder.raw_decode(text, match.end() - 1)
        except json.JSONDecodeError:
            continue
        documents.append(doc)
    return documents


def _raw_entries(doc: dict) -> list[dict]:
    return doc["client_stats"] if "client_stats" in doc else doc["jobs"]


def _parse(path: Path) -> tuple[list[dict], list[str]]:
    warnings: list[str] = []
    return parse_fio_file(path, warn=warnings.append), warnings


def _only(rows: list[dict], **match) -> dict:
    found = [row for row in rows if all(row[key] == value for key, value in match.items())]
    assert len(found) == 1, f"expected one row matching {match}, got {len(found)}"
    return found[0]


# --------------------------------------------------------------------------- the file list


def test_every_provenance_fio_file_is_covered(external_dir):
    provenance = (external_dir / "PROVENANCE.md").read_text()
    fio_section = provenance.split("## 1. fio JSON outputs")[1].split("## 2.")[0]
    listed = set(re.findall(r"^\| `([^`]+)`", fio_section, re.MULTILINE))
    assert len(listed) == 29
    assert listed == set(EXPECTED) | {NOT_JSON}
    for relative in listed:
        assert (external_dir / relative).is_file(), relative


def test_columns_start_with_the_contract():
    assert FIO_COLUMNS[: len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS
    assert len(set(FIO_COLUMNS)) == len(FIO_COLUMNS)


# --------------------------------------------------------------------------- generic checks


@pytest.mark.parametrize("relative", PARSEABLE)
def test_generic_shape_units_and_raw_values(external_dir, relative):
    path = external_dir / relative
    expected = EXPECTED[relative]
    rows, warnings = _parse(path)
    raw_doc = _raw_documents(path)[-1]
    raw_entries = _raw_entries(raw_doc)

    assert len(rows) == expected["rows"]
    assert len({(row["host"], row["job_index"]) for row in rows}) == expected["entries"]
    assert {row["direction"] for row in rows} == expected["directions"]
    assert len(warnings) == (1 if expected.get("docs", 1) > 1 else 0)

    for row in rows:
        assert list(row) == FIO_COLUMNS
        assert row["file"] == str(path)
        assert row["fio_version"] == expected["version"]
        assert row["job"] != "All clients"
        for column in ("io_bytes", "bw_bytes", "iops", "runtime_ms", "usr_cpu", "sys_cpu"):
            assert row[column] is None or row[column] >= 0, column

        raw_entry = raw_entries[row["job_index"]]
        assert row["error"] == raw_entry["error"]
        if row["io_bytes"] == 0:
            # A job that moved nothing: visible, but with no fake latencies.
            assert row["clat_mean_ns"] is None and row["clat_p99_ns"] is None
            continue

        raw = raw_entry[row["direction"]]
        assert row["iops"] == raw["iops"]
        assert row["runtime_ms"] == raw["runtime"]
        if "io_kbytes" in raw:  # fio 3: bytes as written
            assert row["io_bytes"] == raw["io_bytes"]
        else:  # fio 2: "io_bytes" is KiB
            assert row["io_bytes"] == raw["io_bytes"] * 1024
        if "bw_bytes" in raw:
            assert row["bw_bytes"] == raw["bw_bytes"]
        else:
            assert row["bw_bytes"] == raw["bw"] * 1024
        if "clat_ns" in raw:
            assert row["clat_mean_ns"] == raw["clat_ns"]["mean"]
            assert row["lat_mean_ns"] == raw["lat_ns"]["mean"]
        else:
            assert row["clat_mean_ns"] == pytest.approx(raw["clat"]["mean"] * 1000)
            assert row["lat_mean_ns"] == pytest.approx(raw["lat"]["mean"] * 1000)

        # Unit plausibility independent of the raw keys: bytes/s = IOPS x block size, and
        # bytes = bytes/s x seconds (fio rounds bw to whole KiB/s in old versions).
        tolerance = max(0.02 * row["bw_bytes"], 1024)
        if row["bs_bytes"] is not None:
            assert row["bw_bytes"] == pytest.approx(row["iops"] * row["bs_bytes"], abs=tolerance)
        seconds = row["runtime_ms"] / 1000
        assert row["io_bytes"] == pytest.approx(
            row["bw_bytes"] * seconds, abs=tolerance * seconds + 1
        )
        assert row["lat_mean_ns"] >= row["clat_mean_ns"] * 0.999
        percentiles = [row["clat_p50_ns"], row["clat_p99_ns"], row["clat_p999_ns"]]
        if all(value is not None for value in percentiles):
            assert percentiles == sorted(percentiles)
            assert percentiles[0] > 0


# --------------------------------------------------------------------------- per-file checks


def test_pbench_client_server_has_per_host_rows_without_all_clients(external_dir):
    rows, _ = _parse(external_dir / PBENCH_CS)
    hosts = [row["host"] for row in rows]
    assert sorted(set(hosts)) == ["perf36", "perf84"]
    assert hosts.count("perf36") == 5 and hosts.count("perf84") == 5
    assert all(row["job"] == "job-/tmp/fio" for row in rows)
    # rw from the job options; bs and iodepth only in the top-level global options.
    assert {(row["rw"], row["bs_bytes"], row["iodepth"], row["numjobs"]) for row in rows} == {
        ("read", 4096, 32, 5)
    }
    first = _only(rows, job_index=0)
    assert first["io_bytes"] == 488804352
    assert first["clat_p99_ns"] == 6193152


def test_fio_2_1_4_converts_kib_and_usec_and_leaves_unrecorded_options_empty(external_dir):
    rows, _ = _parse(external_dir / PKB_214)
    assert [row["job"] for row in rows] == [
        "sequential_write",
        "sequential_read",
        "random_write_test",
        "random_read_test",
        "random_read_test_parallel",
    ]
    seq_write = _only(rows, job="sequential_write")
    # Raw: "write": {"io_bytes": 361984, "bw": 68118, "clat": {"mean": 477734.84,
    # "percentile": {"99.000000": 823296, ...}}, "lat": {"mean": 478737.47}} (KiB, KiB/s, µs).
    assert seq_write["direction"] == "write"
    assert seq_write["bw_bytes"] == 68118 * 1024 == 69752832
    assert seq_write["io_bytes"] == 361984 * 1024
    assert seq_write["clat_mean_ns"] == pytest.approx(477734840)
    assert seq_write["clat_p99_ns"] == 823296000
    assert seq_write["lat_mean_ns"] == pytest.approx(478737470)
    # fio 2.1.4 records no options: rw/bs are unknown, not fio's defaults (rw=read would be wrong).
    assert seq_write["rw"] is None and seq_write["bs_bytes"] is None


def test_fio_2_17_and_2_18_usec_latencies(external_dir):
    pkb, _ = _parse(external_dir / PKB_217)
    randread = _only(pkb, direction="read")
    assert (randread["rw"], randread["bs_bytes"], randread["numjobs"]) == ("randread", 16384, 2)
    assert randread["clat_p99_ns"] == 1352 * 1000
    assert randread["bw_bytes"] == 129386 * 1024

    (row,) = _parse(external_dir / FIO_218)[0]
    assert row["iodepth"] == 1  # written as "01"
    assert row["clat_p50_ns"] == 13504 * 1000
    assert row["clat_p999_ns"] == 24960 * 1000


def test_failed_job_is_visible_with_error_22(external_dir):
    (row,) = _parse(external_dir / FAILED_22)[0]
    assert row["error"] == 22
    assert (row["direction"], row["rw"], row["bs_bytes"]) == ("write", "write", 1048576)
    assert (row["io_bytes"], row["bw_bytes"], row["iops"]) == (0, 0, 0)
    assert row["clat_p99_ns"] is None and row["lat_mean_ns"] is None


def test_job_with_error_2_among_successful_jobs(external_dir):
    rows, _ = _parse(external_dir / TUM_LONG_ERROR_2)
    failed = _only(rows, job_index=0)
    assert (failed["error"], failed["io_bytes"], failed["direction"]) == (2, 0, "read")
    assert failed["clat_p50_ns"] is None
    assert all(row["error"] == 0 and row["io_bytes"] > 0 for row in rows if row["job_index"])


def test_interrupted_bm_crypt_keeps_every_entry(external_dir):
    rows, _ = _parse(external_dir / TUM_BM_CRYPT)
    moved = [row for row in rows if row["io_bytes"] > 0]
    assert [(row["job"], row["direction"]) for row in moved] == [("alat randread", "read")]
    mixed = [row for row in rows if row["rw"] == "randrw"]
    assert len(mixed) == 8 and all(row["direction"] == "" for row in mixed)


@pytest.mark.parametrize("relative", [SS_THREE_DOCS, ARAU_TWO_DOCS])
def test_several_documents_use_the_last_and_warn(external_dir, relative):
    path = external_dir / relative
    rows, warnings = _parse(path)
    documents = _raw_documents(path)
    assert len(documents) == EXPECTED[relative]["docs"]
    assert len(warnings) == 1
    assert str(path) in warnings[0] and f"{len(documents)} complete" in warnings[0]
    assert rows[0]["timestamp"] == documents[-1]["timestamp"]
    last_write = _raw_entries(documents[-1])[0]["write"]["io_bytes"]
    assert rows[0]["io_bytes"] == last_write


def test_three_status_dumps_pick_the_final_totals(external_dir):
    (row,) = _parse(external_dir / SS_THREE_DOCS)[0]
    assert row["io_bytes"] == 919326867456  # the third dump; the first had 493412679680
    assert row["ss_attained"] == 1


def test_default_warn_prints_one_line_on_stderr(external_dir, capsys):
    parse_fio_file(external_dir / SS_THREE_DOCS)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Figure1.json" in err and "3 complete" in err


def test_steadystate_attained(external_dir):
    assert _parse(external_dir / SS_BW)[0][0]["ss_attained"] == 1
    assert _parse(external_dir / SS_IOPS)[0][0]["ss_attained"] == 1
    assert _parse(external_dir / RANDRW_316)[0][0]["ss_attained"] is None


def test_duplicate_percentile_keys_parse(external_dir):
    rows, _ = _parse(external_dir / JBERNSTEIN)
    assert len(rows) == 8
    assert {row["job"] for row in rows} == {"job /dev/sdb", "job /dev/sda"}  # trailing space gone
    assert {(row["rw"], row["bs_bytes"], row["iodepth"], row["numjobs"]) for row in rows} == {
        ("read", 4096, 32, 4)  # rw from the global options, bs written as "4096"
    }
    assert all(row["clat_p99_ns"] > row["clat_p50_ns"] > 0 for row in rows)


def test_tum_sixteen_entries_and_options_from_globals(external_dir):
    for relative in (TUM_ARCHIVE_PLAIN, TUM_ARCHIVE_ENCR):
        rows, _ = _parse(external_dir / relative)
        assert len(rows) == 16 and {row["groupid"] for row in rows} == {0}
        assert {(row["bs_bytes"], row["iodepth"], row["numjobs"]) for row in rows} == {
            (4096, 32, 4)
        }
        assert {row["rw"] for row in rows} == {"randread", "randwrite"}


@pytest.mark.parametrize("relative", [RANDRW_316, ARAU_RANDRW_32K, BENSON, FIO_340, PBENCH_8])
def test_mixed_workloads_give_read_and_write_rows(external_dir, relative):
    rows, _ = _parse(external_dir / relative)
    for job_index in {row["job_index"] for row in rows}:
        directions = sorted(row["direction"] for row in rows if row["job_index"] == job_index)
        assert directions == ["read", "write"]


def test_randrw_32k_options_only_in_globals(external_dir):
    rows, _ = _parse(external_dir / ARAU_RANDRW_32K)
    assert {(row["rw"], row["bs_bytes"], row["iodepth"]) for row in rows} == {("randrw", 32768, 16)}


def test_leading_noise_is_skipped(external_dir):
    for relative in (SIGINT_334, ARAU_STRAY_GT, TUM_BM_CRYPT, BENSON, PBENCH_CS):
        text = (external_dir / relative).read_text()
        assert not text.startswith("{")  # the premise: real noise before the JSON
        assert parse_fio_file(external_dir / relative, warn=pytest.fail)


def test_floppy_extreme_values(external_dir):
    (row,) = _parse(external_dir / FLOPPY)[0]
    assert row["iops"] == pytest.approx(2.657297)
    assert row["bw_bytes"] == 10 * 1024  # fio 3.1 has no bw_bytes: "bw" is KiB/s
    assert row["clat_mean_ns"] == pytest.approx(376e6, rel=0.01)


def test_brahiam_options_from_globals(external_dir):
    (row,) = _parse(external_dir / BRAHIAM)[0]
    assert (row["rw"], row["bs_bytes"], row["iodepth"], row["numjobs"]) == ("read", 131072, 4, 2)
    assert (row["ioengine"], row["direct"]) == ("libaio", 1)


def test_not_json_file_raises_naming_the_file(external_dir):
    path = external_dir / NOT_JSON
    with pytest.raises(FioParseError) as caught:
        parse_fio_file(path)
    message = str(caught.value)
    assert str(path) in message
    assert "text only" in message and "C is not a directory" in message


# --------------------------------------------------------------------------- json+ fixture


def test_jsonplus_per_direction_block_size_and_histogram(fixtures_dir):
    # Made on this machine: fio-3.33 --ioengine=null --size=1m --bs=4k,8k --rw=randrw
    # --output-format=json+ (real json+ output with "bins").
    path = fixtures_dir / "fio-3.33_jsonplus_null_randrw_bs4k8k.json"
    rows, warnings = _parse(path)
    assert not warnings
    read, write = _only(rows, direction="read"), _only(rows, direction="write")
    assert (read["bs"], read["bs_bytes"], write["bs_bytes"]) == ("4k,8k", 4096, 8192)
    assert read["io_bytes"] == 62 * 4096 and write["io_bytes"] == 66 * 8192

    histograms = clat_histogram(path)
    assert set(histograms) == {(0, "read"), (0, "write")}
    raw = json.loads(path.read_text())["jobs"][0]
    for direction in ("read", "write"):
        bins = histograms[(0, direction)]
        assert bins == sorted(bins)
        assert sum(count for _, count in bins) == raw[direction]["clat_ns"]["N"]
        assert bins[-1][0] >= raw[direction]["clat_ns"]["max"] * 0.9


def test_clat_histogram_is_empty_for_plain_json(external_dir):
    assert clat_histogram(external_dir / RANDRW_316) == {}


def test_clat_histogram_fio2_bucket_indices(tmp_path):
    # fio 2.x json+ writes bucket indices; fio's plat_idx_to_val() maps them to µs.
    doc = {
        "fio version": "fio-2.99",
        "jobs": [
            {
                "jobname": "x",
                "error": 0,
                "read": {
                    "io_bytes": 4,
                    "clat": {
                        "mean": 100.0,
                        "bins": {
                            "FIO_IO_U_PLAT_BITS": 6,
                            "FIO_IO_U_PLAT_VAL": 64,
                            "FIO_IO_U_PLAT_NR": 1216,
                            "5": 3,
                            "128": 1,
                            "200": 2,
                            "300": 0,
                        },
                    },
                },
            }
        ],
    }
    path = tmp_path / "fio2plus.json"
    path.write_text(json.dumps(doc))
    # idx 128: base 2^7 + 0.5 * 2 = 129 µs; idx 200: 2^8 + (8 + 0.5) * 4 = 290 µs.
    assert clat_histogram(path) == {(0, "read"): [(5000, 3), (129000, 1), (290000, 2)]}


# --------------------------------------------------------------------------- negative inputs


@pytest.mark.parametrize("relative", [RANDRW_316, PBENCH_CS, TUM_BM_CRYPT, PKB_214])
def test_truncated_copy_raises_naming_the_file(external_dir, tmp_path, relative):
    data = (external_dir / relative).read_bytes()
    path = tmp_path / "truncated.json"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FioParseError) as caught:
        parse_fio_file(path)
    message = str(caught.value)
    assert str(path) in message
    assert f"truncated at byte {len(data[: len(data) // 2].rstrip())}" in message


def test_truncated_fixture(fixtures_dir):
    path = fixtures_dir / "fio_truncated_inside_string.json"
    with pytest.raises(FioParseError, match=r"fio_truncated_inside_string\.json.*truncated"):
        parse_fio_file(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    with pytest.raises(
        FioParseError, match=r"empty\.json: no complete fio JSON document \(file is empty\)"
    ):
        parse_fio_file(path)


def test_text_only_file(tmp_path):
    path = tmp_path / "text.json"
    path.write_text("\nfio: failed parsing rw=foo\nfio: job global dropped\n")
    with pytest.raises(FioParseError) as caught:
        parse_fio_file(path)
    assert str(caught.value) == (
        f"{path}: no complete fio JSON document (text only: first line 'fio: failed parsing rw=foo')"
    )


def test_json_that_is_not_fio_output(fixtures_dir):
    path = fixtures_dir / "not_fio.json"
    with pytest.raises(FioParseError, match=r"not_fio\.json: JSON document is not fio output"):
        parse_fio_file(path)


def test_invalid_json_in_the_middle(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "fio version" : "fio-3.36",\n  "jobs" : [ oops ],\n  "x" : 1\n}\n')
    with pytest.raises(FioParseError, match=r"broken\.json: .*invalid JSON at byte \d+, line 3"):
        parse_fio_file(path)


def test_fio_document_without_jobs(tmp_path):
    path = tmp_path / "nojobs.json"
    path.write_text('{"fio version": "fio-3.36", "jobs": []}')
    with pytest.raises(
        FioParseError, match=r"nojobs\.json: fio JSON document lists no job entries"
    ):
        parse_fio_file(path)


def test_missing_file_raises_parse_error(tmp_path):
    with pytest.raises(FioParseError, match=r"missing\.json: cannot read file"):
        parse_fio_file(tmp_path / "missing.json")


def test_text_after_json_and_defaults(tmp_path):
    # --output-format=json,normal: the normal report follows the JSON document.
    doc = {
        "fio version": "fio-3.36",
        "jobs": [
            {
                "jobname": "d",
                "groupid": 0,
                "error": 0,
                "job options": {"name": "d"},
                "read": {"io_bytes": 8192, "io_kbytes": 8, "bw_bytes": 8192, "iops": 2.0,
                         "runtime": 1000, "clat_ns": {"mean": 5.0, "N": 2}},
            }
        ],
    }  # fmt: skip
    path = tmp_path / "json_normal.txt"
    path.write_text(
        json.dumps(doc, indent=2) + "\nd: (groupid=0, jobs=1): err= 0: pid=1\n  read: IOPS=2\n"
    )
    (row,) = parse_fio_file(path, warn=pytest.fail)
    # Options absent everywhere but recorded: fio's defaults apply.
    assert (row["rw"], row["bs_bytes"], row["iodepth"], row["numjobs"]) == ("read", 4096, 1, 1)
    assert row["clat_p99_ns"] is None  # no percentile object: empty, not 0
    assert load_fio_document(path)["fio version"] == "fio-3.36"


# --------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "luksbench.cli", "parse", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_cli_parse_fio_writes_csv(external_dir):
    result = _cli("fio", str(external_dir / RANDRW_316), str(external_dir / PBENCH_CS))
    assert result.returncode == 0, result.stderr
    table = list(csv.reader(io.StringIO(result.stdout)))
    assert table[0] == FIO_COLUMNS
    assert len(table) == 1 + 2 + 10


def test_cli_parse_fio_not_json_fails_naming_the_file(external_dir):
    bad = external_dir / NOT_JSON
    result = _cli("fio", str(external_dir / FLOPPY), str(bad))
    assert result.returncode == 1
    assert str(bad) in result.stderr
    table = list(csv.reader(io.StringIO(result.stdout)))
    assert table[0] == FIO_COLUMNS and len(table) == 2  # the good file's row is still written


EDGE_CASES = {
    "glued.json": b'>{"jobs": []}\n',
    "indented.json": b'  {"jobs": []}\n',
    "two.json": b'{"jobs": [], "x": 1}\n\n{"jobs": [], "x": 2}\n',
    "trailing.json": b'{"jobs": []}\nfio: terminating on signal 2\n',
    "truncated.json": b'{"jobs": [{"jobname": "a"',
    "nan.json": b'{"jobs": [{"jobname": "a", "read": {"io_bytes": NaN}}]}',
    "not_utf8.json": b'{"jobs": [{"jobname": "\xff"}]}',
    "huge_int.json": b'{"jobs": [{"jobname": "a", "ctx": 123456789012345678901234567890}]}',
    "huge_negative.json": b'{"jobs": [{"jobname": "a", "ctx": -9999999999999999999}]}',
    "control_prefix.json": b'\x1c{"jobs": []}\n',
    "not_fio.json": b'{"a": 1}\n',
    "empty.json": b"",
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_faster_json_decoder_gives_the_same_documents_and_messages(tmp_path, name):
    orjson = pytest.importorskip("orjson")
    path = tmp_path / name
    path.write_bytes(EDGE_CASES[name])

    def outcome(**kwargs):
        notes = []
        try:
            return repr(load_fio_document(path, notes.append, **kwargs)), notes
        except FioParseError as exc:
            return str(exc), notes

    assert outcome(loads=orjson.loads) == outcome()


def test_faster_json_decoder_on_every_external_file(external_dir):
    orjson = pytest.importorskip("orjson")
    for path in sorted(p for p in external_dir.rglob("*") if p.is_file()):
        outcomes = []
        for loads in (orjson.loads, None):
            notes = []
            try:
                outcomes.append((repr(load_fio_document(path, notes.append, loads)), notes))
            except FioParseError as exc:
                outcomes.append((str(exc), notes))
        assert outcomes[0] == outcomes[1], path
