"""A throwaway Ceph cluster for real: stack-up builds a plain and a luks layer (userspace backend
here), one OSD on each, fio's rbd engine in crc and in secure mode with the mode read back from
the client's own connections, and stack-down (also after a kill -9 of the builder) leaves no
daemon, socket, folder or loop device. A cluster-side secure run (``ceph.daemon_modes: secure``)
starts its daemons in secure mode only and records it with every run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from testkit.plans import fio_settings
from testkit.testbox import run_fio_args
from testkit.testbox import testbox as tb

from luksbench.formats.plan import migrated_plan_document
from luksbench.testbox import ceph, cephdown, cephrun, cephstack, safety
from luksbench.testbox.stacks import stack_down, stack_up
from luksbench.testbox.sysutil import TestboxError, cmdline, pid_alive

pytestmark = [pytest.mark.device, pytest.mark.slow]

TOOLS = ("fio", "cryptsetup", "qemu-storage-daemon", "fusermount3", "ceph-mon", "ceph-osd", "rbd")
DEVICE_MIB = 1024
IMAGE_MIB = 256
MEMORY_LIMIT = 4 * 1024**3


@pytest.fixture(scope="module", autouse=True)
def _need_tools():
    missing = [t for t in TOOLS if not (shutil.which(t) or os.path.exists(f"/usr/sbin/{t}"))]
    if missing or os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.fail(
            f"Ceph tests need root, /dev/fuse and {TOOLS}; missing: {missing}", pytrace=False
        )


@pytest.fixture
def short_tmp():
    """A short folder: Ceph's admin sockets must fit AF_UNIX's 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="lbceph-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_plan(tmp: Path, run: str, stacks: dict, daemon_modes: str = "crc secure") -> Path:
    """A plan file of the current version: ``stacks``, one randread 4k qd1 cell, 1 s runs, the
    run's cluster (if its stacks need one) started with ``daemon_modes``."""
    plan = {
        "run": run,
        "host": "tb1",
        "backend": "userspace",
        "scratch_dir": str(tmp / "s"),
        "device_size_mib": DEVICE_MIB,
        "precondition": False,
        "baseline": "plain",
        "stacks": stacks,
        "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1]},
        "fio": fio_settings(),
        "repetitions": 1,
        "seed": 1,
    }
    plan = {**migrated_plan_document(plan), "ceph": {"daemon_modes": daemon_modes}}
    path = tmp / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def fio_rbd(cluster: dict, arm: dict, rw: str, tmp: Path) -> tuple[dict, dict]:
    """A 2 s fio run of ``arm`` through cephrun (verified, timed out, CPU per daemon)."""
    pool = next(p for p in cluster["pools"] if p["group"] == arm["group"])
    out = tmp / f"{arm['group']}-{arm['mode']}.json"
    argv = ["fio", f"--name={arm['group']}", *cephrun.fio_rbd_target(pool), f"--rw={rw}"]
    argv += ["--bs=4k", "--iodepth=16", "--time_based", "--runtime=2s", "--output-format=json"]
    argv.append(f"--output={out}")
    probe_log = tmp / f"probe-{arm['group']}-{arm['mode']}.log"
    proc, record = cephrun.run_rbd_fio(
        cluster,
        arm,
        argv,
        cephrun.fio_timeout(2),
        probe_log,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())["jobs"][0], record


def loop_devices_over(state: dict) -> list[str]:
    return safety.loop_devices_backed_by(
        [e["backing_file"] for e in state["stacks"].values() if e.get("backing_file")]
    )


def assert_ceph_gone(top: Path, daemons: list[dict]) -> None:
    assert not top.exists(), f"{top} left behind"
    assert not cephdown.cluster_processes(top)
    for d in daemons:
        assert not pid_alive(d["pid"]) or d["started"] != cephdown.start_time(d["pid"])
    assert not list(top.parent.rglob("*.asok"))


def test_cluster_over_plain_and_luks_layers(short_tmp):
    tmp = short_tmp
    plan = write_plan(tmp, "cephx", {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}})
    state_path, describe = tmp / "s" / "state.json", tmp / "stacks.json"
    tb("stack-up", "--plan", plan, "--state", state_path, "--describe", describe, timeout=600)
    state = json.loads(state_path.read_text())
    try:
        t0 = time.monotonic()
        cluster = cephstack.ceph_up(
            state_path,
            {"plain": ["plain"], "luks": ["luks"]},
            image_mib=IMAGE_MIB,
            daemon_modes="crc secure",
        )
        up_s = time.monotonic() - t0
        top = Path(cluster["dir"])
        assert top.parent == Path(state["scratch_dir"])
        assert json.loads(state_path.read_text())["ceph"]["dir"] == str(top)
        assert {o["group"]: o["encryption"] for o in cluster["osds"]} == {
            "plain": None,
            "luks": "luks (qemu luks driver)",
        }
        assert all(o["bluestore_label"] for o in cluster["osds"])
        # Daemons listen on loopback only, and every file is under the run's scratch folder.
        conf = Path(cluster["conf"]).read_text()
        assert (
            "/etc/ceph" not in conf and "/var/lib/ceph" not in conf and "/var/log/ceph" not in conf
        )
        assert "ms_service_mode = crc secure" in conf
        assert not any(any(Path(p).iterdir()) for p in ("/var/lib/ceph/osd", "/var/lib/ceph/mon"))

        results = {}
        for group in ("plain", "luks"):
            osd = next(o["id"] for o in cluster["osds"] if o["group"] == group)
            for mode in ceph.MODES:
                arm = {"group": group, "mode": mode, "encrypted": group == "luks"}
                job, record = fio_rbd(cluster, arm, "randwrite", tmp)
                assert record["mode_probe"]["connections"][f"osd.{osd}"] == mode
                assert record["mode_probe"]["connections"]["mon.0"] == mode
                assert record["osd_devices"][0]["encryption"] == (
                    "luks (qemu luks driver)" if group == "luks" else None
                )
                assert job["error"] == 0 and job["write"]["total_ios"] > 0
                assert record["daemon_cpu_s"][f"ceph-osd.{osd}"] > 0
                results[(group, mode)] = round(job["write"]["iops"])
        usage = cephrun.daemon_usage(cluster)
        peak = sum(u["peak_rss_bytes"] for u in usage.values())
        assert peak < MEMORY_LIMIT, usage
        print(f"cluster up {up_s:.1f} s; peak RSS {peak / 2**20:.0f} MiB; IOPS {results}")

        # A run whose arm says otherwise is refused, naming both.
        with pytest.raises(TestboxError, match=r"encrypted but osd.0 .* has no encryption"):
            cephrun.check_encryption(cluster, "plain", True)
        pool = next(p for p in cluster["pools"] if p["group"] == "plain")
        probe = cephrun.probe_mode(cluster, pool, "crc", tmp / "probe-again.log")
        probe["asked"] = "secure"
        with pytest.raises(TestboxError, match=r"asks messenger mode secure .* used crc"):
            cephrun.check_mode(probe, [0])
    finally:
        down = tb("stack-down", "--state", state_path, "--record", tmp / "down.json", check=False)
    record = json.loads((tmp / "down.json").read_text())
    assert down.returncode == 0 and record["ok"], record
    assert record["checks"]["no_ceph"] and record["checks"]["no_processes"]
    assert_ceph_gone(top, cluster["daemons"])
    assert not loop_devices_over(state)
    assert not state_path.exists()


def test_stack_down_after_the_builder_is_killed(short_tmp):
    """kill -9 of the process building the cluster: stack-down finds it from STATE and the
    cluster's own record, and stops every daemon."""
    tmp = short_tmp
    plan = write_plan(tmp, "cephk", {"plain": {"kind": "plain"}})
    state_path, describe = tmp / "s" / "state.json", tmp / "stacks.json"
    tb("stack-up", "--plan", plan, "--state", state_path, "--describe", describe, timeout=600)
    scratch = Path(json.loads(state_path.read_text())["scratch_dir"])
    builder = (
        "import sys; from luksbench.testbox import cephstack; "
        "cephstack.ceph_up(sys.argv[1], {'plain': ['plain']}, image_mib=64, "
        "daemon_modes='crc secure')"
    )
    proc = subprocess.Popen([sys.executable, "-c", builder, str(state_path)])
    record_path = ceph.cluster_dir(scratch) / cephdown.RECORD_NAME
    daemons: list = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            cluster = cephdown.load_cluster(record_path.parent) or {}
            daemons = cluster.get("daemons", [])
            if any(d["tool"] == "ceph-osd" for d in daemons):
                break
            time.sleep(0.2)
        assert any(d["tool"] == "ceph-osd" for d in daemons), "no OSD started within 120 s"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert any(pid_alive(d["pid"]) for d in daemons), "the daemons should outlive their builder"
    down = tb("stack-down", "--state", state_path, "--record", tmp / "down.json", check=False)
    record = json.loads((tmp / "down.json").read_text())
    assert down.returncode == 0 and record["ok"], record
    assert any("ceph-osd" in a for a in record["actions"]), record["actions"]
    assert_ceph_gone(record_path.parent, daemons)


LUKS_LAYER = {
    "kind": "luks",
    "cipher": "aes-xts-plain64",
    "key_bits": 512,
    "hash": "sha256",
    "luks_type": "luks1",
    "sector_size": 512,
    "pbkdf_iterations": 1000,
}


def test_stack_up_builds_rbd_arms_over_osd_layers(short_tmp):
    """Four arms as the Ceph study needs them (crc and secure clients over an OSD on a plain
    layer and over one on a luks layer): stack-up builds one OSD per distinct osd layer, the
    arms share them, each arm's run is verified, and stack-down leaves nothing."""
    tmp = short_tmp
    on_plain = {"kind": "osd", "over": {"kind": "plain"}}
    on_luks = {"kind": "osd", "over": LUKS_LAYER}
    arms = {
        "rbd-crc": {"kind": "rbd", "mode": "crc", "over": on_plain},
        "rbd-secure": {"kind": "rbd", "mode": "secure", "over": on_plain},
        "luks-crc": {"kind": "rbd", "mode": "crc", "over": on_luks},
        "luks-secure": {"kind": "rbd", "mode": "secure", "over": on_luks},
    }
    plan = json.loads(write_plan(tmp, "cephs", arms).read_text())
    plan["baseline"] = "rbd-crc"
    state_path = tmp / "s" / "state.json"
    description = stack_up(plan, state_path, tmp / "stacks.json")
    try:
        state = json.loads(state_path.read_text())
        assert list(state["stacks"]) == list(arms) and state["order"][0] == "rbd-crc"
        assert sorted(state["ceph_layers"]) == ["osd0o0", "osd1o0"]
        cluster = cephdown.load_cluster(state["ceph"]["dir"])
        assert len(cluster["osds"]) == 2  # crc and secure arms share their OSD
        assert description["stacks"]["luks-secure"]["osd_encrypted"] is True
        assert description["stacks"]["rbd-secure"]["osd_devices"][0]["encryption"] is None
        for name in arms:
            entry = state["stacks"][name]
            out = tmp / f"{name}.json"
            argv = ["fio", f"--name={name}", *cephrun.fio_target_for(entry), "--rw=randread"]
            argv += ["--bs=4k", "--iodepth=8", "--time_based", "--runtime=1s"]
            argv += ["--output-format=json", f"--output={out}"]
            proc, record = cephrun.run_entry_fio(
                entry,
                argv,
                cephrun.fio_timeout(1),
                tmp / f"{name}.probe.log",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            assert proc.returncode == 0, proc.stderr
            assert set(record["mode_probe"]["connections"].values()) == {arms[name]["mode"]}
            assert json.loads(out.read_text())["jobs"][0]["read"]["total_ios"] > 0
    finally:
        record = stack_down(state_path)
    assert record["ok"], record
    assert record["checks"]["no_ceph"] and record["checks"]["no_mounts"]
    assert_ceph_gone(Path(state["ceph"]["dir"]), cluster["daemons"])
    assert not safety.loop_devices_backed_by(
        [e["mountpoint"] for e in state["ceph_layers"].values()]
    )
    assert not loop_devices_over({"stacks": state["ceph_layers"]})


def test_a_mode_the_daemons_refuse_fails_without_hanging(short_tmp):
    """Daemons started crc-only (``daemon_modes``): a client asking for secure is refused at
    once or killed at the probe's timeout; nothing of it keeps running."""
    tmp = short_tmp
    plan = write_plan(tmp, "cephm", {"plain": {"kind": "plain"}})
    state_path, describe = tmp / "s" / "state.json", tmp / "stacks.json"
    tb("stack-up", "--plan", plan, "--state", state_path, "--describe", describe, timeout=600)
    try:
        cluster = cephstack.ceph_up(
            state_path, {"plain": ["plain"]}, image_mib=64, daemon_modes="crc"
        )
        assert "ms_service_mode = crc\n" in Path(cluster["conf"]).read_text()
        pool = cluster["pools"][0]
        t0 = time.monotonic()
        with pytest.raises(TestboxError, match="secure") as refused:
            cephrun.probe_mode(cluster, pool, "secure", tmp / "refused.log")
        print(f"refused after {time.monotonic() - t0:.1f} s: {refused.value}")
        assert time.monotonic() - t0 < cephrun.PROBE_TIMEOUT_S + 10
        running = [cmdline(p)[0] for p in cephdown.cluster_processes(cluster["dir"])]
        assert all(os.path.basename(c) in ceph.DAEMONS for c in running), running
        probe = cephrun.probe_mode(cluster, pool, "crc", tmp / "accepted.log")
        assert set(probe["connections"].values()) == {"crc"}
    finally:
        down = tb("stack-down", "--state", state_path, "--record", tmp / "down.json", check=False)
    assert down.returncode == 0, down.stderr
    assert_ceph_gone(Path(cluster["dir"]), cluster["daemons"])


def daemon_config(cluster: dict, daemon: str, key: str) -> str:
    """A running daemon's value of ``key``, asked through its admin socket."""
    asok = Path(cluster["dir"]) / "run" / f"{daemon}.asok"
    argv = ["ceph", "-c", cluster["conf"], "--admin-daemon", str(asok), "config", "get", key]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)[key]


def test_a_cluster_side_secure_run_starts_its_daemons_in_secure_mode_only(short_tmp):
    """``ceph.daemon_modes: secure`` with one secure arm, through the test box's commands: the
    daemons run with every messenger mode secure (a crc client is refused, without hanging), the
    run's sidecar records the daemons' modes and the secure connections its probe made."""
    tmp = short_tmp
    arm = {"kind": "rbd", "mode": "secure", "over": {"kind": "osd", "over": {"kind": "plain"}}}
    plan = write_plan(tmp, "cephcs", {"secure": arm}, daemon_modes="secure")
    doc = json.loads(plan.read_text())
    doc["baseline"] = "secure"
    plan.write_text(json.dumps(doc))
    state_path, describe = tmp / "s" / "state.json", tmp / "stacks.json"
    host_dir = tmp / "raw" / "cephcs" / "tb1"
    tb("stack-up", "--plan", plan, "--state", state_path, "--describe", describe, timeout=900)
    cluster = cephdown.load_cluster(json.loads(state_path.read_text())["ceph"]["dir"])
    try:
        assert cluster["daemon_modes"] == "secure"
        conf = Path(cluster["conf"]).read_text()
        for key in ("ms_cluster_mode", "ms_service_mode", "ms_mon_cluster_mode"):
            assert f"\t{key} = secure\n" in conf, key
        for daemon in ("mon.a", "osd.0"):  # what the running daemons took, not only the file
            assert daemon_config(cluster, daemon, "ms_cluster_mode") == "secure", daemon
            assert daemon_config(cluster, daemon, "ms_service_mode") == "secure", daemon
        described = json.loads(describe.read_text())["stacks"]["secure"]
        assert described["daemon_modes"] == "secure" and described["messenger_mode"] == "secure"
        pool = cluster["pools"][0]
        t0 = time.monotonic()
        with pytest.raises(TestboxError, match="crc"):
            cephrun.probe_mode(cluster, pool, "crc", tmp / "refused.log")
        assert time.monotonic() - t0 < cephrun.PROBE_TIMEOUT_S + 10

        tb(*run_fio_args(plan, state_path, host_dir, host_dir / "fio" / "manifest.json"))
        sidecars = sorted((host_dir / "fio" / "secure").glob("*/rep*.cpu.json"))
        assert sidecars, list(host_dir.rglob("*"))
        for path in sidecars:
            record = json.loads(path.read_text())["ceph"]
            assert record["daemon_modes"] == "secure", path
            assert record["messenger_mode"] == "secure", path
            connections = record["mode_probe"]["connections"]
            assert set(connections.values()) == {"secure"} and "osd.0" in connections, record
    finally:
        down = tb("stack-down", "--state", state_path, "--record", tmp / "down.json", check=False)
    assert down.returncode == 0, down.stderr
    assert_ceph_gone(Path(cluster["dir"]), cluster["daemons"])
