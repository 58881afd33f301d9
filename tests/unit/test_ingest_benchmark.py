"""The ingest benchmark runs (at a tiny N), so it cannot rot: it builds a run of real fio json+
outputs in a temporary folder, ingests it and reports speed and peak memory."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "ingest_speed.py"


@pytest.mark.slow  # builds and ingests a run three times
def test_ingest_benchmark_reports_speed_and_memory_for_json_plus_results(capsys):
    spec = importlib.util.spec_from_file_location("ingest_speed", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["-n", "24", "--templates", "jsonplus", "--workers", "1", "--chunk-files", "5"]
    assert module.main(args) == 0
    out = capsys.readouterr().out
    full = next(line for line in out.splitlines() if line.strip().startswith("FULL"))
    assert "files/s" in full
    counts = re.search(r"\(([\d,]+) rows, ([\d,]+) latency rows", full)
    assert counts, full
    rows, latency = (int(n.replace(",", "")) for n in counts.groups())
    assert rows >= 24 and latency > rows  # json+ histograms: many bins per result
    assert "PEAK MEMORY main process" in out and "GiB" in out
    assert "NO CHANGE" in out and "+1 % FILES" in out
