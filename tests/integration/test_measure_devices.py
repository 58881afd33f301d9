"""Preconditioning for real (fio on a loop device and on files); fio checks our command lines."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from testkit.plans import precondition_settings

import luksbench.testbox.precondition as precondition_module
from luksbench.testbox.precondition import (
    fill_argv,
    precondition,
    snia_steady_state,
    steady_state_round_argv,
)
from luksbench.testbox.sysutil import TestboxError

MIB = 1024 * 1024


def test_fio_accepts_the_command_lines(tmp_path):
    """fio itself parses every option we build (--parse-only), so no typo reaches a test box."""
    target = tmp_path / "t.img"
    target.write_bytes(b"\0" * MIB)
    for argv in (
        fill_argv(target, MIB),
        steady_state_round_argv(target, MIB, 1),
    ):
        proc = subprocess.run([*argv, "--parse-only"], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr


@pytest.fixture
def loop_device(tmp_path):
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.fail("precondition device tests need root and losetup", pytrace=False)
    backing = tmp_path / "pc.img"
    with open(backing, "wb") as f:
        f.truncate(64 * MIB)
    dev = subprocess.run(
        ["losetup", "--show", "-f", str(backing)], capture_output=True, text=True, check=True
    ).stdout.strip()
    yield dev
    subprocess.run(["losetup", "-d", dev], check=True)


@pytest.mark.device
def test_precondition_loop_device(loop_device, monkeypatch):
    monkeypatch.setattr(precondition_module, "FILL_HEARTBEAT_S", 0.01)
    lines: list[str] = []
    opts = precondition_settings(ss_round_s=1, ss_max_rounds=6, steady_state=True)
    rec = precondition(loop_device, 64 * MIB, opts, "libaio", lines.append)
    assert rec["device"] == loop_device and rec["options"]["ss_max_rounds"] == 6
    # loop devices over files support discard (hole punching)
    assert rec["discard"]["status"] == "done"
    assert rec["discard"]["argv"] == ["blkdiscard", loop_device]
    assert rec["fill"]["io_bytes"] == 2 * 64 * MIB  # two full passes
    ss = rec["steady_state"]
    assert 1 <= len(ss["rounds"]) <= 6
    assert [r["round"] for r in ss["rounds"]] == list(range(1, len(ss["rounds"]) + 1))
    assert all(r["iops"] > 0 and r["io_bytes"] > 0 for r in ss["rounds"])
    assert all(r["per_second_iops"] for r in ss["rounds"])  # fio's in-round samples
    # The verdict is the gate over the recorded rounds, and the loop stopped for a reason.
    assert ss["check"] == snia_steady_state([r["iops"] for r in ss["rounds"]], 5, 20.0, 10.0)
    assert ss["steady"] is ss["check"]["steady"]
    assert ss["steady"] or len(ss["rounds"]) == 6
    assert len(ss["rounds"]) >= 5 or not ss["steady"]
    assert ("steady after" if ss["steady"] else "not steady after") in ss["verdict"]
    assert rec["seconds"] >= ss["seconds"] >= sum(r["seconds"] for r in ss["rounds"]) * 0.99
    assert any("steady-state round 1" in line for line in lines)
    # the fill says it is running; each round the time left if the gate never passes
    assert any(re.fullmatch(rf"  {loop_device}: filling: elapsed \d+s", line) for line in lines)
    assert re.search(r"round 1: .*; elapsed \d+s, ETA [1-9]\d*s if it never", "\n".join(lines))
    json.dumps(rec)  # the record goes into the stack description as it is


@pytest.mark.device
def test_precondition_without_discard_support(tmp_path):
    """A regular file (the userspace backend's FUSE export is one) records why it was not
    discarded and is still filled."""
    target = tmp_path / "file.img"
    with open(target, "wb") as f:
        f.truncate(8 * MIB)
    rec = precondition(target, 8 * MIB, precondition_settings(fill_passes=1), "psync", print)
    assert rec["discard"]["status"].startswith("discard unsupported: ")
    assert "not a block device" in rec["discard"]["status"]
    assert rec["fill"]["io_bytes"] == 8 * MIB and rec["steady_state"] is None
    off = precondition(target, 8 * MIB, precondition_settings(enabled=False), "psync", print)
    assert off["fill"] is None and off["discard"] is None


@pytest.mark.device
def test_precondition_failure_carries_fio_stderr(tmp_path):
    target = tmp_path / "file.img"
    with open(target, "wb") as f:
        f.truncate(MIB)
    opts = precondition_settings(discard=False, steady_state=False)
    with pytest.raises(TestboxError, match=r"fill: `fio .*` exited 1: .*no-such-engine"):
        precondition(target, MIB, opts, "no-such-engine", print)
