"""Composable stacks on this kernel, for real: loop, raw (shared), ext4 and xfs layers on loop
devices, allowlisted disks refused or accepted by stack-up, teardown after a failed build and
after a killed run. dm-crypt and md cannot run on this kernel: their layers are proven in the VM
test box (tests/vm/test_vmbox.py); here the backend must refuse them before anything is created."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
from testkit.plans import fio_settings
from testkit.testbox import luksbench_testbox_argv, run_fio_args
from testkit.testbox import testbox as tb

from luksbench.formats.fio import parse_fio_file
from luksbench.testbox import safety
from luksbench.testbox.backends.choose import dm_crypt_status
from luksbench.testbox.planbuild import PlanError, check_plan

pytestmark = pytest.mark.device
MIB = 2**20


def plan_file(tmp: Path, run: str, stacks: dict, devices: dict, **over) -> Path:
    plan = {
        "run": run,
        "host": "tb1",
        "backend": "kernel",
        "scratch_dir": str(tmp / "scratch"),
        "device_size_mib": 64,
        "precondition": {"enabled": True, "fill_passes": 1},
        "baseline": next(iter(stacks)),
        "devices": devices,
        "stacks": stacks,
        "matrix": {"rw": ["randwrite"], "bs": ["4k"], "iodepth": [8]},
        "fio": fio_settings(),
        "repetitions": 1,
        "seed": 1,
        **over,
    }
    check_plan(plan)
    path = tmp / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def ours_left(state: dict) -> dict:
    """Mounts, loop devices and files of the run still present."""
    from luksbench.testbox.backends.kernel import leftovers

    return {k: v for k, v in leftovers(state.get("objects", [])).items() if v}


@pytest.fixture
def disk(tmp_path):
    """A loop device standing in for a real disk, with a stable by-id link (removed after)."""
    backing = tmp_path / "disk.img"
    with open(backing, "wb") as f:
        f.truncate(96 * MIB)
    loop = subprocess.run(
        ["losetup", "--show", "-f", str(backing)], capture_output=True, text=True, check=True
    ).stdout.strip()
    link = Path("/dev/disk/by-id") / f"luksbench-test-{secrets.token_hex(4)}"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(loop)
    mnt = tmp_path / "mnt"
    yield {"loop": loop, "link": str(link), "backing": str(backing), "mnt": mnt}
    if safety.is_mounted(mnt):
        subprocess.run(["umount", str(mnt)], check=False)
    link.unlink(missing_ok=True)
    subprocess.run(["losetup", "-d", loop], check=False)


def test_loop_raw_and_filesystem_layers_for_real(tmp_path):
    run = f"fs{os.getpid()}"
    stacks = {
        "plain": {"kind": "loop"},
        "raw": {"kind": "raw", "device": "d0"},
        "raw-again": {"kind": "raw", "device": "d0"},  # same device: built once, shared
        "ext4": {"kind": "fs", "fstype": "ext4", "file_size_mib": 48, "over": "d1"},
        "xfs": {
            "kind": "fs",
            "fstype": "xfs",
            "file_size_mib": 48,
            "over": {"kind": "loop", "size_mib": 320},
        },
    }
    devices = {"d0": {"size_mib": 64}, "d1": {"size_mib": 64}}
    plan = plan_file(tmp_path, run, stacks, devices)
    state, describe = tmp_path / "state.json", tmp_path / "stacks.json"
    host_dir = tmp_path / "raw" / run / "tb1"
    tb("stack-up", "--plan", plan, "--state", state, "--describe", describe)
    doc = json.loads(state.read_text())
    try:
        desc = json.loads(describe.read_text())["stacks"]
        e = doc["stacks"]
        # d0 is one loop device under both raw arms
        assert e["raw"]["device"] == e["raw-again"]["device"]
        assert e["raw"]["device"].startswith("/dev/loop")
        assert sum(1 for o in doc["objects"] if o["type"] == "loop") == 4  # plain, d0, d1, xfs's
        for name, fstype, below in (("ext4", "ext4", "loop d1"), ("xfs", "xfs", "loop")):
            assert e[name]["device_type"] == "fsfile"
            assert safety.is_mounted(e[name]["mountpoint"])
            assert Path(e[name]["device"]).stat().st_size == 48 * MIB
            assert desc[name]["layout"] == f"{fstype} file on {below}"
            fstab = Path("/proc/self/mounts").read_text()
            assert f" {e[name]['mountpoint']} {fstype} " in fstab
            # fio's target is a file: no discard, and the fill wrote it once
            pre = desc[name]["precondition"]
            assert "not a block device" in pre["discard"]["status"]
            assert pre["fill"]["io_bytes"] == 48 * MIB
        assert desc["raw"]["layout"] == "loop d0"  # the scratch-file device d0, shared
        assert desc["plain"]["precondition"]["discard"]["status"] == "done"
        tb(
            *run_fio_args(plan, state, host_dir, tmp_path / "m.json", "--describe", describe),
        )
        for name in stacks:
            rep = host_dir / "fio" / name / "randwrite-4k-qd8" / "rep1.json"
            rows = parse_fio_file(rep)
            assert rows and rows[0]["iops"] > 0, name
            target = json.loads(rep.read_text()[rep.read_text().index("{") :])
            filename = target["jobs"][0]["job options"]["filename"]
            assert filename == e[name]["device"]
    finally:
        rec = tb("stack-down", "--state", state, "--record", tmp_path / "down.json", check=False)
    record = json.loads((tmp_path / "down.json").read_text())
    assert rec.returncode == 0 and record["ok"], record
    assert record["checks"]["no_mounts"] and record["checks"]["no_loop_devices"]
    assert not ours_left(doc)
    assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == []


def test_a_failing_layer_tears_down_every_layer_built_before(tmp_path):
    run = f"ff{os.getpid()}"
    stacks = {
        "plain": {"kind": "loop"},
        "ext4": {"kind": "fs", "fstype": "ext4", "over": "d0"},
        # xfs refuses filesystems under 300 MB: mkfs fails after the others are up
        "xfs": {"kind": "fs", "fstype": "xfs", "over": {"kind": "loop", "size_mib": 64}},
    }
    plan = plan_file(tmp_path, run, stacks, {"d0": {"size_mib": 64}})
    state = tmp_path / "state.json"
    r = tb(
        "stack-up", "--plan", plan, "--state", state, "--describe", tmp_path / "s.json", check=False
    )
    assert r.returncode == 1 and "mkfs.xfs" in r.stderr and "tearing down" in r.stderr
    assert not state.exists()
    assert not [m for m in safety.mountpoints() if str(tmp_path) in m]
    assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == []
    assert not safety.loop_devices_backed_by(
        [
            tmp_path / "scratch" / f"luksbench-{run}-{n}.img"
            for n in ("plain-loop", "dev-d0", "xfs-loop")
        ]
    )


def test_killed_run_leaves_layers_that_stack_down_removes(tmp_path):
    run = f"kl{os.getpid()}"
    stacks = {"plain": {"kind": "loop"}, "ext4": {"kind": "fs", "fstype": "ext4", "over": "d0"}}
    plan = plan_file(
        tmp_path,
        run,
        stacks,
        {"d0": {"size_mib": 64}},
        fio={
            "ioengine": "libaio",
            "direct": True,
            "runtime_s": 30,
            "ramp_time_s": 0,
            "output_format": "json+",
        },
    )
    state = tmp_path / "state.json"
    tb("stack-up", "--plan", plan, "--state", state, "--describe", tmp_path / "s.json")
    doc = json.loads(state.read_text())
    proc = subprocess.Popen(
        luksbench_testbox_argv(
            *run_fio_args(plan, state, tmp_path / "raw" / run / "tb1", tmp_path / "m.json")
        ),
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(4)
    os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: fio and the layers stay behind
    proc.wait(30)
    assert safety.is_mounted(doc["stacks"]["ext4"]["mountpoint"])
    rec = tb("stack-down", "--state", state, "--record", tmp_path / "down.json")
    record = json.loads((tmp_path / "down.json").read_text())
    assert rec.returncode == 0 and record["ok"], record
    assert not ours_left(doc)
    assert not list((tmp_path / "raw").rglob("rep*.json"))  # no partial result survived


def test_dm_and_md_layers_are_refused_here_before_anything_is_created(tmp_path):
    if dm_crypt_status(try_modprobe=False)["available"]:
        pytest.skip("this kernel has dm-crypt: the refusal only happens on kernels without it")
    run = f"dm{os.getpid()}"
    stacks = {
        "raid0": {"kind": "md", "level": 0, "members": ["d0", "d1"]},
        "raid0-luks": {"kind": "luks", "over": {"kind": "md", "level": 0, "members": ["d2", "d3"]}},
    }
    devices = {f"d{i}": {"size_mib": 32} for i in range(4)}
    plan = plan_file(tmp_path, run, stacks, devices)
    r = tb(
        "stack-up",
        "--plan",
        plan,
        "--state",
        tmp_path / "st.json",
        "--describe",
        tmp_path / "s.json",
        check=False,
    )
    assert r.returncode == 1 and "no usable backend" in r.stderr
    assert "device-mapper" in r.stderr
    assert not (tmp_path / "st.json").exists()
    assert not (tmp_path / "scratch").exists() or not list((tmp_path / "scratch").iterdir())


def bare_plan(stacks: dict, devices: dict) -> dict:
    return {
        "run": "x",
        "host": "h",
        "backend": "kernel",
        "scratch_dir": "/srv/x/y",
        "device_size_mib": 64,
        "precondition": False,
        "baseline": next(iter(stacks)),
        "devices": devices,
        "stacks": stacks,
        "matrix": {"rw": ["read"], "bs": ["4k"], "iodepth": [1]},
        "fio": {},
        "repetitions": 1,
        "seed": 1,
    }


def test_exclusive_layers_cannot_share_a_device():
    stacks = {
        "raw": {"kind": "raw", "device": "d0"},
        "ext4": {"kind": "fs", "fstype": "ext4", "over": "d0"},
    }
    with pytest.raises(PlanError, match=r"devices\.d0 is used by .*exclusively"):
        check_plan(bare_plan(stacks, {"d0": {"size_mib": 64}}))
    # dm layers share: a luks arm and a linear arm over the same device as a raw arm
    shared = {
        "raw": {"kind": "raw", "device": "d0"},
        "luks": {"kind": "luks", "over": "d0", "luks_type": "luks2", "sector_size": 512},
        "linear": {"kind": "linear", "like": "luks"},
    }
    check_plan(bare_plan(shared, {"d0": {"size_mib": 64}}))


def test_allowlisted_disk_with_a_signature_is_refused_until_its_serial_confirms(tmp_path, disk):
    subprocess.run(["mkfs.ext4", "-q", "-F", disk["loop"]], check=True)
    run = f"sg{os.getpid()}"
    stacks = {"plain": {"kind": "loop"}, "disk": {"kind": "raw", "device": "disk"}}
    plan = plan_file(tmp_path, run, stacks, {"disk": {"path": disk["link"]}})
    state = tmp_path / "state.json"
    r = tb(
        "stack-up", "--plan", plan, "--state", state, "--describe", tmp_path / "s.json", check=False
    )
    assert r.returncode == 1 and "devices.disk" in r.stderr and "ext4" in r.stderr
    assert not state.exists() and not list((tmp_path / "scratch").iterdir())  # nothing created

    # confirmed by naming its serial (a loop device's serial is its backing file)
    plan = plan_file(
        tmp_path, run, stacks, {"disk": {"path": disk["link"], "wipe_serial": disk["backing"]}}
    )
    tb("stack-up", "--plan", plan, "--state", state, "--describe", tmp_path / "s.json")
    try:
        d = json.loads((tmp_path / "s.json").read_text())["stacks"]["disk"]
        assert d["device"] == disk["loop"] and d["layers"]["wipe_confirmed"] is True
        assert d["layers"]["serial"] == disk["backing"]
    finally:
        tb("stack-down", "--state", state)
    assert os.path.exists(disk["loop"])  # the disk itself is not ours to remove


def test_mounted_disk_is_refused_even_when_confirmed(tmp_path, disk):
    subprocess.run(["mkfs.ext4", "-q", "-F", disk["loop"]], check=True)
    disk["mnt"].mkdir()
    subprocess.run(["mount", disk["loop"], str(disk["mnt"])], check=True)
    plan = plan_file(
        tmp_path,
        f"mt{os.getpid()}",
        {"plain": {"kind": "loop"}, "disk": {"kind": "raw", "device": "disk"}},
        {"disk": {"path": disk["link"], "wipe_serial": disk["backing"]}},
    )
    r = tb(
        "stack-up",
        "--plan",
        plan,
        "--state",
        tmp_path / "st.json",
        "--describe",
        tmp_path / "s.json",
        check=False,
    )
    assert r.returncode == 1 and "mounted" in r.stderr and str(disk["mnt"]) in r.stderr
    assert safety.is_mounted(disk["mnt"])  # untouched


def test_a_device_outside_the_allowlist_is_refused_by_the_plan():
    stacks = {"a": {"kind": "loop"}, "b": {"kind": "luks", "over": "sdb"}}
    with pytest.raises(
        PlanError, match=r"device 'sdb' is not in devices \(the allowlist: \['d0'\]\)"
    ):
        check_plan(bare_plan(stacks, {"d0": {"size_mib": 64}}))


def test_an_optional_stack_that_cannot_be_built_is_left_out_with_its_reason(tmp_path):
    """What ciphers-2010 needs for ciphers a kernel lacks: the stack is undone and recorded."""
    run = f"op{os.getpid()}"
    stacks = {
        "plain": {"kind": "loop"},
        "ext4": {"kind": "fs", "fstype": "ext4", "over": "d0"},
        # xfs refuses filesystems under 300 MB: this one cannot be built on a 64 MiB device
        "xfs": {"kind": "fs", "fstype": "xfs", "optional": True, "over": {"kind": "loop"}},
    }
    plan = plan_file(tmp_path, run, stacks, {"d0": {"size_mib": 64}})
    state, describe = tmp_path / "state.json", tmp_path / "stacks.json"
    host_dir = tmp_path / "raw" / run / "tb1"
    tb("stack-up", "--plan", plan, "--state", state, "--describe", describe)
    doc = json.loads(state.read_text())
    try:
        desc = json.loads(describe.read_text())["stacks"]
        assert "mkfs.xfs" in desc["xfs"]["unavailable"]
        assert doc["stacks"]["xfs"]["unavailable"] == desc["xfs"]["unavailable"]
        xfs_backing = tmp_path / "scratch" / f"luksbench-{run}-xfs-loop.img"
        assert not xfs_backing.exists() and not safety.loop_devices_backed_by([xfs_backing])
        assert all("xfs-loop" not in json.dumps(o) for o in doc["objects"])
        assert desc["ext4"]["precondition"] and "precondition" not in desc["xfs"]
        tb(*run_fio_args(plan, state, host_dir, tmp_path / "m.json"))
        manifest = json.loads((tmp_path / "m.json").read_text())
        assert manifest["complete"] and set(manifest["stacks"]) == {"plain", "ext4"}
        assert "mkfs.xfs" in manifest["unavailable_stacks"]["xfs"]
        assert sorted(p.name for p in (host_dir / "fio").iterdir()) == ["ext4", "plain"]
    finally:
        tb("stack-down", "--state", state)
    assert not ours_left(doc)


@pytest.mark.parametrize(
    ("stacks", "message"),
    [
        # one LUKS header per device
        (
            {"a": {"kind": "luks", "over": "d0"}, "b": {"kind": "luks", "over": "d0"}},
            "carries two luks layers",
        ),
        # a device under an md member's luks layer belongs to that array alone
        (
            {
                "raw": {"kind": "raw", "device": "d0"},
                "r0": {"kind": "md", "members": [{"kind": "luks", "over": "d0"}, "d1"]},
            },
            r"stacks\.r0\.members\[0\]\.over claim\(s\) it exclusively",
        ),
        # fio on a device under a mounted filesystem's luks layer would corrupt it
        (
            {
                "raw": {"kind": "raw", "device": "d0"},
                "fs": {"kind": "fs", "over": {"kind": "luks", "over": "d0"}},
            },
            r"stacks\.fs\.over\.over claim\(s\) it exclusively",
        ),
    ],
)
def test_devices_below_exclusive_layers_are_not_shared(stacks, message):
    with pytest.raises(PlanError, match=message):
        check_plan(bare_plan(stacks, {f"d{i}": {"size_mib": 64} for i in range(2)}))
