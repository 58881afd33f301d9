"""Raw files that would stall or exhaust a reader: a FIFO or device in place of a file, a file over
the size limit, a large file of garbage. Every reader refuses them at once, naming the file, and
ingest goes on with the rest."""

from __future__ import annotations

import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time

import pytest
from testkit.paths import SAMPLE
from testkit.raw import sample_rep as rep

from luksbench.analysis import ingest
from luksbench.formats.cryptsetup import parse_cryptsetup_file
from luksbench.formats.envdoc import read_env
from luksbench.formats.fio import FioParseError, load_fio_document
from luksbench.formats.manifest import read_manifest
from luksbench.formats.sidecar import read_cpu_sidecar
from luksbench.formats.targets import read_targets

MAX_RAW_BYTES_VARIABLE = "LUKSBENCH_MAX_RAW_BYTES"  # docs/troubleshooting.md names it

READERS = {
    "fio": load_fio_document,
    "cryptsetup": parse_cryptsetup_file,
    "env": read_env,
    "manifest": read_manifest,
    "sidecar": read_cpu_sidecar,
    "targets": read_targets,
}


def outcome_without_waiting(read, fifo):
    """What ``read()`` returned or raised; fails the test when it waits on ``fifo`` for a writer
    (then releases it, so no thread is left behind)."""
    outcome = []

    def run():
        try:
            outcome.append(read())
        except Exception as exc:  # the test looks at what was raised
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader sees EOF
        thread.join()
        pytest.fail(f"reading {fifo} waited for a writer")
    return outcome[0]


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_raw_reader_refuses_a_fifo_at_once_naming_it(tmp_path, reader):
    fifo = tmp_path / "rep1.json"
    os.mkfifo(fifo)
    exc = outcome_without_waiting(lambda: READERS[reader](fifo), fifo)
    assert isinstance(exc, ValueError | OSError), exc
    assert str(fifo) in str(exc) and "not a regular file" in str(exc)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_raw_reader_refuses_a_file_over_the_limit(tmp_path, monkeypatch, reader):
    path = tmp_path / "big.json"
    path.write_text(" " * 2048 + "{}")
    monkeypatch.setenv(MAX_RAW_BYTES_VARIABLE, "1k")
    with pytest.raises((ValueError, OSError)) as raised:
        READERS[reader](path)
    assert str(path) in str(raised.value)
    assert f"2050 bytes, over the limit for a raw file (${MAX_RAW_BYTES_VARIABLE}=1024)" in str(
        raised.value
    )


def test_a_bad_limit_is_refused_naming_the_variable(tmp_path, monkeypatch):
    path = tmp_path / "env.json"
    path.write_text("{}")
    monkeypatch.setenv(MAX_RAW_BYTES_VARIABLE, "lots")
    with pytest.raises(ValueError, match=f"{MAX_RAW_BYTES_VARIABLE}: not a size: 'lots'"):
        read_env(path)


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (2**31, 2**31))  # a reader of /dev/zero fails fast


@pytest.mark.parametrize("kind", ["fio", "cryptsetup"])
def test_cli_parse_of_dev_zero_is_refused_at_once(kind):
    result = subprocess.run(
        [sys.executable, "-m", "luksbench.cli", "parse", kind, "/dev/zero"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert result.returncode == 1
    assert "/dev/zero: cannot read file (not a regular file)" in result.stderr


def _cpu_seconds_to_refuse(path, loads) -> float:
    """The least CPU time of three refusals of ``path`` (CPU time: the machine's load does not
    count)."""
    times = []
    for _ in range(3):
        start = time.process_time()
        with pytest.raises(FioParseError):
            load_fio_document(path, lambda _note: None, loads)
        times.append(time.process_time() - start)
    return min(times)


GARBAGE = {
    "random bytes": lambda size: random.Random(16).randbytes(size),
    "one line of x{": lambda size: b"x{" * (size // 2),
}


@pytest.mark.parametrize("decoder", ["json", "orjson"])
@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_is_refused_in_time_linear_in_its_size(tmp_path, kind, decoder):
    loads = pytest.importorskip("orjson").loads if decoder == "orjson" else None
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    small.write_bytes(GARBAGE[kind](2**19))
    large.write_bytes(GARBAGE[kind](2**23))
    ratio = _cpu_seconds_to_refuse(large, loads) / _cpu_seconds_to_refuse(small, loads)
    # 16 times the bytes: quadratic 256 times the time, linear 16 times, measured up to 3 times
    # that (the large file's memory, fresh and past the CPU caches, costs more per byte)
    assert ratio < 96, f"{kind}: 16x the bytes took {ratio:.0f}x the time"


def test_json_nested_too_deep_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_bytes(b"{" + b'"a":{' * 100_000)
    with pytest.raises(FioParseError, match=str(path)):
        load_fio_document(path, lambda _note: None)


def test_ingest_names_a_fifo_a_huge_and_a_garbage_result_and_keeps_the_rest(tmp_path, monkeypatch):
    raw_dir = tmp_path / "sample"
    shutil.copytree(SAMPLE, raw_dir)
    fifo, huge, garbage = (rep(raw_dir, "plain", "read-4k-qd1", k) for k in (1, 2, 3))
    for path in (fifo, huge, garbage):
        path.unlink()
    os.mkfifo(fifo)
    huge.write_bytes(b" " * 2**20 + b"{}")
    garbage.write_bytes(random.Random(1).randbytes(2**20 - 1))
    monkeypatch.setenv(MAX_RAW_BYTES_VARIABLE, "1m")

    df = outcome_without_waiting(lambda: ingest.fio_table(raw_dir, strict=False), fifo)
    problems = dict(df.attrs["problems"])
    assert "not a regular file" in problems[str(fifo)]
    assert "over the limit for a raw file" in problems[str(huge)]
    assert "no complete fio JSON document" in problems[str(garbage)]
    assert len(problems) == 3
    assert (
        len(df) > 0 and not df["file"].str.contains("plain/read-4k-qd1/rep[123]", regex=True).any()
    )
