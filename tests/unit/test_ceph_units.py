"""The Ceph pieces that need no cluster: the conf keeps everything under the run's folder and
on loopback, the connection-mode reader, the refusal of a mismatched arm, the hard timeout, and
the osd/rbd layer checks."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from testkit.plans import plan_stacks

from luksbench.testbox import ceph, cephrun
from luksbench.testbox.planbuild import check_stacks
from luksbench.testbox.sysutil import TestboxError, pid_alive

# Lines as Ceph 16.2.15's client logs them at --debug_ms=1 (from a run on this machine).
CRC_READY = (
    "2026-11-28T05:09:54.136+0000 7fb739a446c0  1 --2- 127.0.0.1:0/2482491965 >> "
    "v2:127.0.0.1:51357/0 conn(0x56158249f6f0 0x56158249fac0 crc :-1 s=READY pgs=37 cs=0 l=1 "
    "rev1=1 rx=0 tx=0).ready entity=mon.0 client_cookie=dafa975c87e78758 server_cookie=0 "
    "in_seq=0 out_seq=0"
)
SECURE_READY = (
    "2026-11-28T05:16:23.096+0000 7f9b133a36c0  1 --2- 127.0.0.1:0/3168486254 >> "
    "v2:127.0.0.1:6800/10380 conn(0x55f1b2008ff0 0x55f1b200b3d0 secure :-1 s=READY pgs=4 cs=0 "
    "l=1 rev1=1 rx=0x7fc4ac00a5e0 tx=0x7fc4ac01d8f0).ready entity=osd.0 client_cookie=0 "
    "server_cookie=0 in_seq=0 out_seq=0"
)


def test_conf_keeps_every_path_under_its_folder_and_every_address_on_loopback(tmp_path):
    top = tmp_path / "ceph"
    text = ceph.conf_text(top, "fsid", 4567, "crc secure")
    paths = [v.strip() for line in text.splitlines() for v in line.split("=")[1:] if "/" in v]
    assert paths and all(p.startswith(str(top)) or p.startswith("$") for p in paths), paths
    for system in ("/etc/ceph", "/var/lib/ceph", "/var/log/ceph", "/var/run/ceph"):
        assert system not in text
    assert "mon_host = [v2:127.0.0.1:4567]" in text
    assert "public_addr = 127.0.0.1" in text and "cluster_addr = 127.0.0.1" in text
    assert "ms_cluster_mode = crc secure" in text and "ms_service_mode = crc secure" in text
    assert "ms_cluster_mode = secure\n" in ceph.conf_text(top, "fsid", 1, "secure")
    assert f"osd_memory_target = {896 * 2**20}" in text


def test_connection_modes_reads_each_peer_and_checks_the_ciphers():
    assert cephrun.connection_modes(f"{CRC_READY}\n{SECURE_READY}\n") == {
        "mon.0": "crc",
        "osd.0": "secure",
    }
    # "secure" without a cipher is not secure
    fake = SECURE_READY.replace("rx=0x7fc4ac00a5e0 tx=0x7fc4ac01d8f0", "rx=0 tx=0")
    assert cephrun.connection_modes(fake)["osd.0"] == "secure (rx=0 tx=0)"


def test_a_run_whose_connections_differ_from_its_arm_is_refused_naming_both():
    probe = {"asked": "secure", "connections": {"mon.0": "secure", "osd.0": "crc"}, "log": "L"}
    with pytest.raises(TestboxError, match=r"asks messenger mode secure .* osd\.0 used crc"):
        cephrun.check_mode(probe, [0])
    with pytest.raises(TestboxError, match=r"no ready connection to osd\.1"):
        cephrun.check_mode(probe | {"connections": {"mon.0": "secure"}}, [1])
    cephrun.check_mode(probe | {"connections": {"mon.0": "secure", "osd.0": "secure"}}, [0])


def test_the_client_environment_carries_the_arm_mode(tmp_path):
    env = cephrun.client_env(str(tmp_path / "ceph.conf"), "secure")
    assert env["CEPH_CONF"] == str(tmp_path / "ceph.conf")
    assert env["CEPH_ARGS"] == "--ms_client_mode=secure --ms_mon_client_mode=secure"
    with pytest.raises(TestboxError, match="'tls' is not one of"):
        cephrun.client_env("c", "tls")


def test_a_client_ignoring_sigterm_is_killed_with_its_process_group(tmp_path):
    pids = tmp_path / "pids"
    script = f"trap '' TERM; sleep 60 & echo $$ $! > {pids}; wait"
    t0 = time.monotonic()
    with pytest.raises(
        TestboxError, match=r"did not finish within 1 s .* killed its process group"
    ):
        cephrun.run_killable(
            ["sh", "-c", script], {"CEPH_ARGS": "x"}, 1.0, stdout=subprocess.DEVNULL
        )
    assert time.monotonic() - t0 < 10
    shell, child = map(int, Path(pids).read_text().split())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (pid_alive(shell) or pid_alive(child)):
        time.sleep(0.05)
    assert not pid_alive(shell) and not pid_alive(child)


def test_osd_and_rbd_layer_checks():
    osd = {"kind": "osd", "over": {"kind": "luks", "over": "d0"}}
    assert ceph.check_ceph_layer(osd, "stacks.a") == []
    assert ceph.check_ceph_layer({"kind": "osd"}, "stacks.a") == [
        "stacks.a: an osd layer sits on exactly one layer ('over')"
    ]
    assert ceph.check_ceph_layer({"kind": "rbd", "mode": "secure", "over": osd}, "s") == []
    assert (
        "sits on osd layers only"
        in ceph.check_ceph_layer({"kind": "rbd", "over": {"kind": "plain"}}, "s")[0]
    )
    assert "mode" in ceph.check_ceph_layer({"kind": "rbd", "mode": "tls", "over": osd}, "s")[0]


def test_a_too_deep_scratch_folder_is_refused_before_anything_starts(tmp_path):
    deep = tmp_path / ("x" * 90)
    with pytest.raises(TestboxError, match="too deep for Ceph's admin sockets"):
        ceph.cluster_up(
            deep, [{"block": "/nonexistent", "group": "g"}], image_mib=16, daemon_modes="crc"
        )
    assert not (deep / "ceph").exists()


def test_split_plan_shares_one_osd_group_between_arms_over_the_same_osd_layers():
    from luksbench.testbox import cephstack

    on_plain = {"kind": "osd", "over": {"kind": "plain"}}
    on_luks = {"kind": "osd", "over": {"kind": "luks"}}
    stacks = {
        "rbd-crc": {"kind": "rbd", "mode": "crc", "over": on_plain},
        "rbd-secure": {"kind": "rbd", "mode": "secure", "over": on_plain},
        "luks-crc": {"kind": "rbd", "mode": "crc", "over": on_luks},
        "local": {"kind": "plain"},
    }
    plan = {"baseline": "rbd-crc", "device_size_mib": 1024, "stacks": plan_stacks(stacks)}
    backend_plan, part = cephstack.split_plan(plan)
    # the layers under the OSDs as stacks of their own, as the plan holds a stack
    under = {"osd0o0": "rbd-crc", "osd1o0": "luks-crc"}
    assert backend_plan["stacks"] == {
        "local": plan["stacks"]["local"],
        **{
            h: {**plan["stacks"][arm]["over"]["over"], "optional": False}
            for h, arm in under.items()
        },
    }
    assert [s["kind"] for s in backend_plan["stacks"].values()] == ["plain", "plain", "luks"]
    check_stacks({**backend_plan, "devices": {}})
    assert backend_plan["baseline"] == "osd0o0"  # the arms and their baseline come back after
    groups = {g["name"]: (g["arms"], g["encrypted"]) for g in part["groups"]}
    assert groups == {"osd0": (["rbd-crc", "rbd-secure"], False), "osd1": (["luks-crc"], True)}
    assert cephstack.split_plan({"stacks": {"a": {"kind": "plain"}}}) == (
        {"stacks": {"a": {"kind": "plain"}}},
        None,
    )
    bad = {**plan, "stacks": {"x": {"kind": "rbd", "mode": "tls", "over": on_plain}}}
    with pytest.raises(TestboxError, match=r"stacks\.x\.mode"):
        cephstack.split_plan(bad)
