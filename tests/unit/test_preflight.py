"""Missing tools are found before any device is touched, with install hints for Debian and Fedora."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from testkit.plans import validated
from testkit.testbox import small_config

from luksbench.testbox.planbuild import plan_from_config
from luksbench.testbox.preflight import (
    MissingTools,
    check_tools,
    required_tools,
)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

CONFIG = small_config("preflight", precondition=True)


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
    plan = plan_from_config(validated(config), "box", "/tmp")
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
