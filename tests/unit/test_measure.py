"""What a run measures beside fio's JSON (CPU, RAPL, system facts) and preconditioning.

Real /proc/stat, real fio, real loop devices; RAPL is read from a sysfs-shaped directory tree
(the reader only reads files) and from /sys/class/powercap where this machine has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from testkit.plans import precondition_settings

from luksbench.testbox import probes, runner, sysinfo
from luksbench.testbox.planbuild import precondition_options
from luksbench.testbox.precondition import (
    blkdiscard_argv,
    fill_argv,
    precondition,
    snia_steady_state,
    steady_state_round_argv,
)
from luksbench.testbox.probes import idle_baseline, rapl_delta, read_rapl
from luksbench.testbox.sysinfo import KEY_STRIPPED, parse_scheduler, strip_dm_table_keys
from luksbench.testbox.sysutil import TestboxError

MIB = 1024 * 1024

# --- CPU -----------------------------------------------------------------------------------------


def test_idle_baseline_on_real_proc_stat():
    t0 = time.monotonic()
    b = idle_baseline(0.5)
    elapsed = time.monotonic() - t0
    assert 0.5 <= b["interval_s"] <= elapsed
    assert set(b["delta_s"]) == set(probes.STAT_FIELDS)
    assert b["busy_s"] == pytest.approx(sum(b["delta_s"][k] for k in probes.BUSY_FIELDS), abs=1e-5)
    # Every CPU's time is counted: all fields together cover about cpu_count x the interval.
    counted = sum(b["delta_s"].values())
    assert counted == pytest.approx(b["cpu_count"] * b["interval_s"], rel=0.25)
    assert 0 <= b["busy_pct"] <= 100
    assert b["busy_pct"] == pytest.approx(100 * b["busy_s"] / counted, abs=0.01)
    assert "idle interval" in b["window"]
    assert "rapl" in b  # None on machines without readable RAPL


def test_idle_baseline_sees_a_busy_cpu():
    """A process spinning during the baseline shows up as about one CPU's worth of busy time."""
    spin = subprocess.Popen(["python3", "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        b = idle_baseline(1.0)
    finally:
        spin.kill()
        spin.wait()
    assert b["busy_s"] >= 0.7 * b["interval_s"]


def test_read_proc_stat_pads_and_rejects(tmp_path):
    old = tmp_path / "stat"
    old.write_text("cpu  10 20 30 40\ncpu0 10 20 30 40\n")
    assert probes.read_proc_stat(old) == {
        "user": 10,
        "nice": 20,
        "system": 30,
        "idle": 40,
        "iowait": 0,
        "irq": 0,
        "softirq": 0,
        "steal": 0,
    }
    (tmp_path / "bad").write_text("intr 1 2 3\n")
    with pytest.raises(TestboxError, match="no aggregate cpu line"):
        probes.read_proc_stat(tmp_path / "bad")


def test_cpu_sidecar_keeps_its_keys_and_adds_rapl():
    before = probes.read_proc_stat()
    after = dict(before, user=before["user"] + os.sysconf("SC_CLK_TCK"))
    rapl = {"package_joules": 1.0}
    s = runner.cpu_sidecar(before, after, 2.0, rapl)
    assert list(s) == [
        "version",
        "interval_s",
        "clk_tck",
        "cpu_count",
        "delta_s",
        "busy_s",
        "busy_pct",
        "window",
        "rapl",
    ]
    assert s["busy_s"] == pytest.approx(1.0) and s["busy_pct"] == pytest.approx(100.0)
    assert s["rapl"] is rapl
    assert runner.cpu_sidecar(before, after, 2.0)["rapl"] is None


# --- RAPL ----------------------------------------------------------------------------------------


def make_zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int) -> None:
    d = root / zone
    d.mkdir(parents=True, exist_ok=True)
    (d / "name").write_text(name + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_read_rapl_from_sysfs_tree(tmp_path):
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type, not a zone
    make_zone(root, "intel-rapl:0", "package-0", 1_000_000, 262_143_328_850)
    make_zone(root, "intel-rapl:0:0", "core", 400_000, 262_143_328_850)
    make_zone(root, "intel-rapl:1", "package-1", 2_000_000, 262_143_328_850)
    make_zone(root, "intel-rapl-mmio:0", "package-0", 5, 10)  # duplicate MMIO view: ignored
    zones = read_rapl(root)
    assert [z["zone"] for z in zones] == ["intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1"]
    assert zones[0] == {
        "zone": "intel-rapl:0",
        "name": "package-0",
        "energy_uj": 1_000_000,
        "max_energy_range_uj": 262_143_328_850,
    }
    assert probes.rapl_unavailable_reason(root) is None


def test_read_rapl_absent_or_unreadable(tmp_path):
    assert read_rapl(tmp_path / "nothing") is None
    assert "no RAPL zones" in probes.rapl_unavailable_reason(tmp_path / "nothing")
    root = tmp_path / "powercap"
    make_zone(root, "intel-rapl:0", "package-0", 1, 100)
    (root / "intel-rapl:0" / "energy_uj").write_text("not a number\n")
    assert read_rapl(root) is None
    assert "not readable" in probes.rapl_unavailable_reason(root)


def test_rapl_delta_watts_and_package_total(tmp_path):
    root = tmp_path / "powercap"
    make_zone(root, "intel-rapl:0", "package-0", 1_000_000, 10**12)
    make_zone(root, "intel-rapl:0:0", "core", 500_000, 10**12)
    make_zone(root, "intel-rapl:1", "package-1", 0, 10**12)
    make_zone(root, "intel-rapl:2", "psys", 0, 10**12)
    before = read_rapl(root)
    make_zone(root, "intel-rapl:0", "package-0", 41_000_000, 10**12)  # +40 J
    make_zone(root, "intel-rapl:0:0", "core", 20_500_000, 10**12)  # +20 J
    make_zone(root, "intel-rapl:1", "package-1", 10_000_000, 10**12)  # +10 J
    make_zone(root, "intel-rapl:2", "psys", 90_000_000, 10**12)  # +90 J, not a package
    d = rapl_delta(before, read_rapl(root), 2.0)
    by_name = {z["name"]: z for z in d["zones"]}
    assert by_name["package-0"]["joules"] == pytest.approx(40.0)
    assert by_name["package-0"]["watts"] == pytest.approx(20.0)
    assert by_name["core"]["joules"] == pytest.approx(20.0)
    assert d["package_joules"] == pytest.approx(50.0)  # package-0 + package-1 only
    assert d["package_watts"] == pytest.approx(25.0)
    assert not any(z["wrapped"] for z in d["zones"])


def test_rapl_delta_counter_wrap(tmp_path):
    root = tmp_path / "powercap"
    max_uj = 262_143_328_850
    make_zone(root, "intel-rapl:0", "package-0", max_uj - 3_000_000, max_uj)
    before = read_rapl(root)
    make_zone(root, "intel-rapl:0", "package-0", 7_000_000, max_uj)  # wrapped past the range
    d = rapl_delta(before, read_rapl(root), 5.0)
    (z,) = d["zones"]
    assert z["wrapped"] is True
    assert z["joules"] == pytest.approx(10.0)
    assert z["watts"] == pytest.approx(2.0)
    assert d["package_joules"] == pytest.approx(10.0)


def test_rapl_delta_without_readings():
    zone = [{"zone": "intel-rapl:0", "name": "package-0", "energy_uj": 1, "max_energy_range_uj": 9}]
    assert rapl_delta(None, zone, 1.0) is None
    assert rapl_delta(zone, None, 1.0) is None
    other = [dict(zone[0], zone="intel-rapl:1")]
    assert rapl_delta(zone, other, 1.0) is None  # no zone in common


def test_rapl_on_this_machine():
    """The real powercap tree: a reading with sane counters, or None with a reason."""
    zones = read_rapl()
    if zones is None:
        assert probes.rapl_unavailable_reason()
        return
    assert all(0 <= z["energy_uj"] <= z["max_energy_range_uj"] for z in zones)
    time.sleep(0.2)
    d = rapl_delta(zones, read_rapl(), 0.2)
    assert all(z["joules"] >= 0 for z in d["zones"])


# --- the steady-state gate (hand-computed windows) -----------------------------------------------


def test_snia_steady_window():
    # mean 100, range 4; slope: sum((x-2)(y-100)) = -3, Sxx = 10 -> -0.3; excursion 1.2
    r = snia_steady_state([100, 102, 98, 101, 99])
    assert r["steady"] is True and r["range_ok"] and r["slope_ok"]
    assert r["mean"] == pytest.approx(100.0)
    assert r["range"] == pytest.approx(4.0) and r["range_limit"] == pytest.approx(20.0)
    assert r["slope"] == pytest.approx(-0.3) and r["excursion"] == pytest.approx(1.2)
    assert r["excursion_limit"] == pytest.approx(10.0)
    assert r["intercept"] == pytest.approx(100.6)
    assert r["first_round"] == 1 and r["window_values"] == [100, 102, 98, 101, 99]


def test_snia_uses_only_the_last_window():
    r = snia_steady_state([10, 500, 100, 102, 98, 101, 99])
    assert r["steady"] is True and r["first_round"] == 3 and r["rounds"] == 7


def test_snia_range_fails():
    # mean 100, range 40 > 20; slope: (-2)(-20) + (-1)(20) = 20 / 10 = 2 -> excursion 8 <= 10
    r = snia_steady_state([80, 120, 100, 100, 100])
    assert r["steady"] is False and r["range_ok"] is False and r["slope_ok"] is True
    assert r["range"] == pytest.approx(40.0) and r["excursion"] == pytest.approx(8.0)
    assert "range 40.0% of mean > 20%" in r["reason"]


def test_snia_slope_fails():
    # mean 100, range 18 <= 20; slope: 18 + 5 + 5 + 18 = 46 / 10 = 4.6 -> excursion 18.4 > 10
    r = snia_steady_state([91, 95, 100, 105, 109])
    assert r["steady"] is False and r["range_ok"] is True and r["slope_ok"] is False
    assert r["slope"] == pytest.approx(4.6) and r["excursion"] == pytest.approx(18.4)
    assert "slope excursion 18.4% of mean > 10%" in r["reason"]


def test_snia_limits_are_parameters():
    assert snia_steady_state([91, 95, 100, 105, 109], slope_pct=20.0)["steady"] is True
    assert snia_steady_state([100, 102, 98, 101, 99], range_pct=3.0)["steady"] is False
    assert snia_steady_state([100, 102, 98], window=3)["steady"] is True


def test_snia_too_few_rounds():
    r = snia_steady_state([100, 100, 100, 100])
    assert r["steady"] is False and r["mean"] is None and r["rounds"] == 4
    assert "the window needs 5" in r["reason"]
    assert snia_steady_state([0, 0, 0, 0, 0])["steady"] is False  # no I/O is not steady
    with pytest.raises(ValueError, match="window"):
        snia_steady_state([1, 2], window=1)


# --- command lines -------------------------------------------------------------------------------


def test_blkdiscard_argv_keeps_exclusive_open():
    assert blkdiscard_argv("/dev/loop7") == ["blkdiscard", "/dev/loop7"]


def test_fill_argv_two_sequential_passes():
    assert fill_argv("/dev/loop7", 64 * MIB, ioengine="io_uring") == [
        "fio",
        "--output-format=json",
        "--name=precondition-fill",
        "--filename=/dev/loop7",
        "--rw=write",
        "--bs=128k",
        "--iodepth=32",
        "--ioengine=io_uring",
        "--direct=1",
        f"--size={64 * MIB}",
        "--loops=2",
        "--numjobs=1",
        "--group_reporting",
    ]
    assert "--loops=3" in fill_argv("/dev/x", MIB, passes=3, bs="1m")
    assert "--bs=1m" in fill_argv("/dev/x", MIB, passes=3, bs="1m")


def test_steady_state_round_argv():
    argv = steady_state_round_argv("/dev/loop7", 64 * MIB, 60, iodepth=16, deviation_pct=10)
    assert argv[:2] == ["fio", "--output-format=json"]
    for opt in (
        "--filename=/dev/loop7",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--ioengine=libaio",
        "--direct=1",
        f"--size={64 * MIB}",
        "--time_based",
        "--runtime=60s",
        "--randrepeat=0",
        "--norandommap",
        "--steadystate=iops:10%",
        "--steadystate_duration=60s",
    ):
        assert opt in argv, opt


def test_precondition_options_are_the_plans_and_checked():
    full = precondition_settings(ss_round_s=1)
    assert precondition_options(full) == full
    for bad, key in (
        ({"fill_pases": 2}, "fill_pases"),
        ({"fill_passes": None}, "missing \\['fill_passes'\\]"),
        ({"discard": "yes"}, "precondition.discard"),
        ({"ss_window": 1}, "precondition.ss_window"),
        ({"ss_iodepth": 2.5}, "precondition.ss_iodepth"),
        ({"ss_rw": "trim"}, "precondition.ss_rw"),
        ({"ss_max_rounds": 3}, "precondition.ss_max_rounds"),
    ):
        opts = {k: v for k, v in {**full, **bad}.items() if v is not None}
        with pytest.raises(TestboxError, match=key):
            precondition_options(opts)
    with pytest.raises(TestboxError, match="precondition must be an object"):
        precondition_options(True)  # a plan's true/false is migrated before the test box reads it


# --- precondition for real -----------------------------------------------------------------------


def test_precondition_refuses_missing_and_odd_targets(tmp_path):
    """fio would create a missing target (directories too); precondition must not."""
    missing = tmp_path / "no-such-dir" / "dev"
    with pytest.raises(TestboxError, match="no-such-dir/dev: No such file"):
        precondition(missing, MIB, precondition_settings(), "psync", print)
    assert not (tmp_path / "no-such-dir").exists()
    with pytest.raises(TestboxError, match="neither a block device nor a file"):
        precondition(tmp_path, MIB, precondition_settings(), "psync", print)


# --- dm tables -----------------------------------------------------------------------------------

HEX_KEY = "a" * 64 + "0123456789abcdef" * 4
KEYRING = ":64:logon:cryptsetup:0e1f5e3b-8c1e-4c8e-9f4e-3f2a3c9d1b7a-d0"


def test_strip_hex_key_with_optional_params():
    line = f"0 2093056 crypt aes-xts-plain64 {HEX_KEY} 0 7:0 32768 2 no_read_workqueue no_write_workqueue"
    out = strip_dm_table_keys(line + "\n")
    assert out == (
        f"0 2093056 crypt aes-xts-plain64 {KEY_STRIPPED} 0 7:0 32768 "
        "2 no_read_workqueue no_write_workqueue\n"
    )
    assert HEX_KEY not in out


def test_strip_keyring_reference_and_named_lines():
    text = (
        f"luksbench-r1-luks: 0 2093056 crypt aes-xts-plain64 {KEYRING} 0 7:0 32768 "
        "1 sector_size:4096\n"
        "luksbench-r1-null: 0 2097152 crypt cipher_null-ecb - 0 7:1 0\n"
        "luksbench-r1-linear: 0 2093056 linear 7:2 32768\n"
    )
    out = strip_dm_table_keys(text)
    lines = out.splitlines()
    assert lines[0] == (
        f"luksbench-r1-luks: 0 2093056 crypt aes-xts-plain64 {KEY_STRIPPED} 0 7:0 32768 "
        "1 sector_size:4096"
    )
    assert lines[1] == f"luksbench-r1-null: 0 2097152 crypt cipher_null-ecb {KEY_STRIPPED} 0 7:1 0"
    assert lines[2] == "luksbench-r1-linear: 0 2093056 linear 7:2 32768"  # untouched
    assert "logon:cryptsetup" not in out


def test_strip_multi_target_table():
    key2 = "f" * 64
    text = (
        f"0 1000 crypt aes-cbc-essiv:sha256 {HEX_KEY} 0 8:16 4096\n"
        "1000 500 linear 8:32 0\n"
        f"1500 1000 crypt capi:xts(aes)-plain64 {key2} 1000 8:48 4096 1 allow_discards\n"
        "0 2000 striped 2 128 8:16 0 8:32 0\n"
    )
    out = strip_dm_table_keys(text)
    assert HEX_KEY not in out and key2 not in out
    assert out.count(KEY_STRIPPED) == 2
    assert "1000 500 linear 8:32 0\n" in out and "0 2000 striped 2 128 8:16 0 8:32 0\n" in out
    assert "capi:xts(aes)-plain64 <key stripped> 1000 8:48 4096 1 allow_discards" in out


def test_strip_integrity_keys_and_unparsable_crypt_lines():
    text = (
        "0 100 integrity 7:0 0 32 J 3 journal_sectors:1024 "
        f"internal_hash:hmac(sha256):{HEX_KEY} journal_crypt:ctr(aes):{HEX_KEY}\n"
        f"weird line mentioning crypt {HEX_KEY}\n"
        "No devices found\n"
    )
    out = strip_dm_table_keys(text)
    assert HEX_KEY not in out
    assert f"internal_hash:hmac(sha256):{KEY_STRIPPED}" in out
    assert f"journal_crypt:ctr(aes):{KEY_STRIPPED}" in out and "journal_sectors:1024" in out
    assert "No devices found" in out
    assert (
        strip_dm_table_keys("0 8 crypt aes\n") == "0 8 crypt <crypt arguments withheld: unparsed>\n"
    )


# --- capture_system ------------------------------------------------------------------------------


def test_parse_scheduler():
    assert parse_scheduler("[none] mq-deadline kyber bfq\n") == {
        "selected": "none",
        "available": ["none", "mq-deadline", "kyber", "bfq"],
    }
    assert parse_scheduler("none mq-deadline [bfq]")["selected"] == "bfq"
    assert parse_scheduler("none")["selected"] is None


def test_capture_system_on_this_machine(tmp_path):
    info = sysinfo.capture_system(paths=[str(tmp_path / "not-yet" / "scratch")])
    json.dumps(info)
    assert info["lsblk"]["status"] == "ok"
    lsblk_names = {d["name"] for d in info["lsblk"]["data"]["blockdevices"]}
    assert lsblk_names and lsblk_names <= set(info["block_queues"])
    for name, q in info["block_queues"].items():
        sched = Path(f"/sys/block/{name}/queue/scheduler")
        if sched.exists():
            assert f"[{q['scheduler']['selected']}]" in sched.read_text()
    assert info["cmdline"] == Path("/proc/cmdline").read_text().strip()
    vuln = Path("/sys/devices/system/cpu/vulnerabilities")
    if vuln.is_dir():
        assert set(info["cpu_vulnerabilities"]) == {p.name for p in vuln.iterdir()}
    # The scratch path does not exist yet: its nearest existing ancestor's disk is reported.
    (where,) = info["paths"]
    st_dev = os.stat(tmp_path).st_dev
    assert where["dev"] == f"{os.major(st_dev)}:{os.minor(st_dev)}"
    # Tools this box lacks are recorded as absent with the reason, not errors.
    for tool, key in (("smartctl", "smartctl"), ("nvme", "nvme_id_ctrl")):
        if sysinfo.which(tool) is None:
            assert info["tools"][tool] is None
            for entry in info["identify"].values():
                if key in entry:
                    assert entry[key] == {"status": "absent", "reason": f"{tool} not installed"}
    disks = [d["path"] for d in info["lsblk"]["data"]["blockdevices"] if d["type"] == "disk"]
    assert set(info["identify"]) == {d for d in disks if "zram" not in d and "/ram" not in d}
    # Absent kernel features are recorded with the reason.
    if not Path("/proc/mdstat").exists():
        assert info["mdstat"]["status"] == "absent" and "mdstat" in info["mdstat"]["reason"]
    if not Path("/dev/mapper/control").exists():
        assert info["dm_table"]["status"] == "absent"
    if not list(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")):
        assert info["cpufreq"]["status"] == "absent"
    if read_rapl() is None:
        assert info["rapl"]["status"] == "absent" and info["rapl"]["reason"]


def test_identify_named_devices_records_missing_ones(tmp_path):
    out = sysinfo.identify_devices([str(tmp_path / "nvme9n9")])
    assert out[str(tmp_path / "nvme9n9")]["error"].endswith("does not exist")
