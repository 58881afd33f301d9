"""Tail latency from a real fio run here with two job entries (numjobs=2, no group_reporting):
ingest gives both entries the percentile of their summed json+ histograms (fio's own rule), not
the mean of the entries' percentiles, and withholds the percentiles too few I/Os lie beyond."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import numpy as np
import pytest

from luksbench.analysis import ingest, tails
from luksbench.formats import fio as fio_format
from luksbench.formats.layout import Workload, fio_rep_path

pytestmark = pytest.mark.device


def test_two_job_entries_are_merged_into_one_run(tmp_path):
    if not shutil.which("fio"):
        pytest.fail("fio is needed", pytrace=False)
    target = tmp_path / "device.img"
    w = Workload("randread", 4096, 1)
    path = fio_rep_path(tmp_path / "raw" / "tails", "box", "plain", w, 1)
    path.parent.mkdir(parents=True)
    argv = ["fio", "--name=tails", f"--filename={target}", "--size=16m", "--rw=randread"]
    argv += ["--bs=4k", "--ioengine=psync", "--numjobs=2", "--time_based", "--runtime=2s"]
    argv += ["--output-format=json+", f"--output={path}"]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    doc = json.loads(path.read_text())
    assert len(doc["jobs"]) == 2
    fio, _ = ingest.fio_and_latency_tables(path.parents[4], workers=1)
    rows = fio[fio["direction"] == "read"]
    assert len(rows) == 2 and rows["job_slot"].nunique() == 1
    hist = fio_format.document_histograms(doc)
    ns, counts = np.array(sorted(b for (_, d), h in hist.items() if d == "read" for b in h)).T
    total = counts.sum()
    assert (rows["clat_ios"] == total).all()
    for column, percent in tails.PERCENTILES.items():
        if total * (100 - percent) / 100 >= tails.MIN_BEYOND:
            merged = ns[np.argmax(np.cumsum(counts) >= percent / 100.0 * total)]
            assert (rows[column] == merged).all(), column
        else:
            assert rows[column].isna().all(), column
    assert not math.isnan(rows["clat_p50_ns"].iloc[0])
