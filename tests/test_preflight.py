"""Missing tools are found before any device is touched, with install hints for Debian and Fedora."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from luksbench.testbox.plan import plan_from_config
from luksbench.testbox.preflight import (
    MissingTools,
    NoSpace,
    check_scratch_space,
    check_tools,
    required_tools,
)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

CONFIG = {
    "run": "preflight",
    "backend": "auto",
    "device_size_mib": 64,
    "precondition": True,
    "baseline": "plain",
    "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}},
    "matrix": {"rw": ["read"], "bs": ["4k"], "iodepth": [1]},
    "fio": {"ioengine": "libaio", "direct": True, "runtime_s": 1, "ramp_time_s": 0},
    "repetitions": 1,
    "seed": 1,
}


def test_the_tools_a_backend_needs():
    plan = plan_from_config(CONFIG, "box", "/tmp")
    assert set(required_tools(plan, "userspace")) == {
        "fio",
        "cryptsetup",
        "qemu-storage-daemon",
        "fusermount3",
    }
    # precondition: true discards before the fill
    assert set(required_tools(plan, "kernel")) == {"fio", "cryptsetup", "losetup", "blkdiscard"}


def test_raid_filesystem_and_linear_layers_need_their_tools():
    config = {
        **CONFIG,
        "devices": {f"d{i}": {"size_mib": 64} for i in range(3)},
        "stacks": {
            "plain": {"kind": "plain"},
            "luks": {"kind": "luks", "over": "d0"},
            "linear": {"kind": "linear", "like": "luks"},
            "raid5": {
                "kind": "fs",
                "fstype": "xfs",
                "over": {"kind": "md", "level": 5, "members": ["d1", "d2", {"kind": "loop"}]},
            },
        },
    }
    plan = plan_from_config(config, "box", "/tmp")
    kernel = required_tools(plan, "kernel")
    assert {"mdadm", "dmsetup", "mkfs.xfs"} <= set(kernel)
    assert "md" in kernel["mdadm"]
    empty_path = "/nonexistent-bin"
    with pytest.raises(MissingTools) as error:
        check_tools(plan, path=empty_path)
    # the userspace backend cannot build md/fs/linear, so the hints are the kernel backend's
    assert "mdadm" in str(error.value) and "apt-get install" in str(error.value)
    assert "dnf install" in str(error.value) and "xfsprogs" in str(error.value)


def test_installed_tools_pass():
    plan = plan_from_config(CONFIG, "box", "/tmp")
    assert check_tools(plan)["selected"] in ("kernel", "userspace")


def test_missing_tools_are_named_with_install_hints(tmp_path):
    plan = plan_from_config(CONFIG, "box", "/tmp")
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(MissingTools) as error:
        check_tools(plan, path=str(empty))
    message = str(error.value)
    assert "fio: runs every measurement" in message
    assert "sudo apt-get install" in message and "sudo dnf install" in message
    assert "cryptsetup-bin" in message  # the Debian package name, not the tool name


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
