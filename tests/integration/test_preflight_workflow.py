"""Preflight for real: the workflow without fio stops early; a real tmpfs that is too small."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from testkit.paths import BIN, REPO
from testkit.testbox import small_config

from luksbench.testbox.planbuild import plan_from_config
from luksbench.testbox.preflight import (
    NoSpace,
    check_scratch_space,
)

CONFIG = small_config("preflight", precondition=True)


def test_the_workflow_stops_before_touching_anything_when_fio_is_missing(tmp_path):
    """PATH without fio: the first rule fails naming fio; no scratch file, no raw data."""
    path_dir = tmp_path / "bin"
    path_dir.mkdir()
    fio = "fio"
    for tool_dir in os.environ["PATH"].split(os.pathsep):
        for tool in Path(tool_dir).glob("*") if Path(tool_dir).is_dir() else []:
            target = path_dir / tool.name
            if tool.name != fio and not target.exists():
                target.symlink_to(tool)
    run = f"pytest-preflight-{uuid.uuid4().hex[:8]}"
    scratch = tmp_path / "scratch"
    result = subprocess.run(
        [
            str(BIN / "snakemake"),
            "--cores",
            "1",
            "all",
            "--config",
            f"run={run}",
            f"scratch_dir={scratch}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(path_dir)},
        timeout=300,
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "fio: runs every measurement" in output
    assert "apt-get install fio" in output
    assert not (REPO / "data" / "raw" / run).exists()
    assert not scratch.exists() or not list(scratch.rglob("*.img"))


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A real 8 MiB tmpfs (we are root on the test machines)."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_a_scratch_dir_too_small_is_refused_with_the_numbers(tiny_filesystem):
    plan = plan_from_config(CONFIG, "box", tiny_filesystem / "run" / "box")
    with pytest.raises(
        NoSpace,
        match=r"scratch_dir .* has 8 MiB free, but the backing files of 2 stacks .*need 128 MiB",
    ):
        check_scratch_space(plan)
    check_scratch_space({**plan, "device_size_mib": 2})  # fits: no error
