"""Fuzzing the parsers: any input gives rows or the parser's own clear error, never another exception.

Inputs are arbitrary text, real outputs cut at arbitrary bytes, and real fio documents whose values
and keys are mutated into the shapes a broken tool or a careless edit produces.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luksbench.formats.cryptsetup import CryptsetupParseError, parse_cryptsetup_text
from luksbench.formats.fio import FioParseError, parse_fio_file

EXTERNAL = Path(__file__).resolve().parents[2].parent / "shared/datasets/external"
FIO_SEED = EXTERNAL / "TUM-DSE__CVM_eval/io-benchmarks/baremetal-randread-4k-4-128.json"
FIO2_SEED = (
    EXTERNAL
    / "GoogleCloudPlatform__PerfKitBenchmarker/tests/data/fio/fio-parser-sample-result.json"
)
CLIENT_SERVER_SEED = (
    EXTERNAL / "distributed-system-analysis__pbench/agent/tool-scripts/postprocess/samples"
    "/fio-0/result/reference-result/fio-result.txt"
)
CRYPTSETUP_SEED = EXTERNAL / "Kright__my-articles/cryptsetup_benchmark_ryzen5950x_comma_decimal.txt"

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

junk_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def parse_fio_text(tmp_path: Path, text: str | bytes) -> list[dict]:
    path = tmp_path / "fuzz.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        rows = parse_fio_file(path, warn=lambda _message: None)
    except FioParseError as exc:
        assert str(path) in str(exc), "the error names the file"
        return []
    assert isinstance(rows, list) and rows, "a parsed document gives at least one row"
    return rows


def check_rows(rows: list[dict]) -> None:
    """What a row promises: numbers are numbers (or absent), never NaN dressed as a value."""
    for row in rows:
        for key in ("bw_bytes", "iops", "io_bytes", "clat_p99_ns", "runtime_ms"):
            value = row.get(key)
            assert value is None or isinstance(value, int | float), (key, value)
            if isinstance(value, float):
                assert not math.isnan(value), (key, row)


def all_paths(doc, prefix=()):
    """Every (container, key) in a JSON document, depth first."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield doc, key
            yield from all_paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield doc, index
            yield from all_paths(value, (*prefix, index))


@FUZZ
@given(text=st.text(max_size=400))
def test_fio_parser_on_arbitrary_text(tmp_path, text):
    check_rows(parse_fio_text(tmp_path, text))


@FUZZ
@given(data=st.binary(max_size=300))
def test_fio_parser_on_arbitrary_bytes(tmp_path, data):
    check_rows(parse_fio_text(tmp_path, data))


@pytest.mark.parametrize("seed", [FIO_SEED, FIO2_SEED, CLIENT_SERVER_SEED], ids=lambda p: p.name)
@FUZZ
@given(cut=st.floats(min_value=0, max_value=1))
def test_fio_parser_on_real_output_cut_anywhere(tmp_path, seed, cut):
    raw = seed.read_bytes()
    check_rows(parse_fio_text(tmp_path, raw[: int(len(raw) * cut)]))


@pytest.mark.parametrize("seed", [FIO_SEED, FIO2_SEED, CLIENT_SERVER_SEED], ids=lambda p: p.name)
@FUZZ
@given(data=st.data())
def test_fio_parser_on_mutated_real_documents(tmp_path, seed, data):
    text = seed.read_text()
    document = json.loads(text[text.index("{") :]) if seed != CLIENT_SERVER_SEED else None
    if document is None:  # pbench's file has text before the JSON: keep it, mutate the JSON
        start = text.index("{\n")
        document = json.JSONDecoder().raw_decode(text[start:])[0]
    mutated = copy.deepcopy(document)
    places = list(all_paths(mutated))
    for _ in range(data.draw(st.integers(min_value=1, max_value=8))):
        container, key = places[data.draw(st.integers(min_value=0, max_value=len(places) - 1))]
        try:
            if data.draw(st.booleans()):
                container[key] = data.draw(junk_values)
            elif isinstance(container, dict):
                del container[key]
        except (KeyError, IndexError):
            continue  # an earlier mutation already replaced this place's parent
        places = list(all_paths(mutated))
        if not places:
            break
    check_rows(parse_fio_text(tmp_path, json.dumps(mutated, allow_nan=True)))


@FUZZ
@given(text=st.text(max_size=600))
def test_cryptsetup_parser_on_arbitrary_text(text):
    try:
        rows = parse_cryptsetup_text(text, Path("fuzz.txt"))
    except CryptsetupParseError as exc:
        assert "fuzz.txt" in str(exc)
        return
    assert rows


@FUZZ
@given(data=st.data())
def test_cryptsetup_parser_on_mutated_real_output(data):
    lines = CRYPTSETUP_SEED.read_text().splitlines()
    for _ in range(data.draw(st.integers(min_value=1, max_value=6))):
        index = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
        line = lines[index]
        cut = data.draw(st.integers(min_value=0, max_value=len(line)))
        lines[index] = line[:cut] + data.draw(st.text(max_size=10)) + line[cut:]
    try:
        rows = parse_cryptsetup_text("\n".join(lines), Path("fuzz.txt"))
    except CryptsetupParseError as exc:
        assert "fuzz.txt" in str(exc)
        return
    for row in rows:
        for key in ("encryption_mib_s", "decryption_mib_s", "iterations_per_s"):
            value = row.get(key)
            assert value is None or (isinstance(value, int | float) and value >= 0), (key, row)
