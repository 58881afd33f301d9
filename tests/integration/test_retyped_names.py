"""A run folder whose name YAML or papermill would read as a number (data/raw/007, copied from
another box) is analysed as the run '007': the notebooks get names as raw strings (papermill -r)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from testkit.workflow import copy_workflow

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_a_run_named_007_stays_the_string_007(tmp_path):
    work = copy_workflow(tmp_path / "work", extra=("data/raw/sample",))
    (work / "data/raw/sample").rename(work / "data/raw/007")
    result = subprocess.run(
        [str(BIN / "snakemake"), "--cores", "1", "data/processed/007/loss.parquet"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    fio = pd.read_parquet(work / "data/processed/007/fio.parquet")
    assert set(fio["run"]) == {"007"}
    assert len(pd.read_parquet(work / "data/processed/007/loss.parquet")) > 0
