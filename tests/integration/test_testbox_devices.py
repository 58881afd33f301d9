"""The test box for real on this machine: FUSE exports via qemu-storage-daemon, cryptsetup, fio.

These bring up real stacks (userspace backend: this kernel has no device-mapper), run fio and
tear down; they leave nothing behind and check that they don't.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from testkit.testbox import assert_clean, luksbench_testbox_argv, make_plan, run_fio_args
from testkit.testbox import testbox as tb

from luksbench.formats.manifest import session_records
from luksbench.testbox import safety
from luksbench.testbox.backends.choose import resolve_backend
from luksbench.testbox.stacks import stack_down
from luksbench.testbox.sysutil import find_our_processes, pid_alive

pytestmark = pytest.mark.device

TOOLS = ("fio", "cryptsetup", "qemu-storage-daemon", "fusermount3")


@pytest.fixture(scope="module", autouse=True)
def _need_tools():
    import shutil

    missing = [t for t in TOOLS if not (shutil.which(t) or os.path.exists(f"/usr/sbin/{t}"))]
    if missing or os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.fail(
            f"device tests need root, /dev/fuse and {TOOLS}; missing: {missing}", pytrace=False
        )


def all_cmdlines() -> str:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"))
    return "\n".join(out)


# --- the full cycle, once; the tests below check its artefacts ------------------------------------


@pytest.fixture(scope="module")
def cycle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cycle")
    run = f"cyc{os.getpid()}"
    plan = make_plan(tmp, run)
    # (not stacks.json beside the state: stack-down removes that one, the workflow's copy)
    state, describe = tmp / "state.json", tmp / "described.json"
    host_dir = tmp / "raw" / run / "tb1"
    manifest = host_dir / "fio" / "manifest.json"
    art: dict = {
        "tmp": tmp,
        "plan": plan,
        "state": state,
        "describe": describe,
        "host_dir": host_dir,
        "manifest": manifest,
        "outputs": [],
        "dm_node_before": os.path.exists("/dev/mapper/control"),
    }
    try:
        art["outputs"].append(tb("capture-env", "--plan", plan, "--out", tmp / "env.json"))
        art["outputs"].append(
            tb("stack-up", "--plan", plan, "--state", state, "--describe", describe)
        )
        art["state_doc"] = json.loads(state.read_text())
        luks = art["state_doc"]["stacks"]["luks"]
        art["key"] = Path(luks["key_file"]).read_text()
        art["key_mode"] = os.stat(luks["key_file"]).st_mode & 0o777
        art["key_dir_mode"] = os.stat(art["state_doc"]["key_dir"]).st_mode & 0o777
        art["cmdlines_up"] = all_cmdlines()
        art["mounts_up"] = safety.mountpoints()
        art["is_luks"] = subprocess.run(
            ["cryptsetup", "isLuks", luks["backing_file"]], check=False
        ).returncode
        art["luks_dump"] = subprocess.run(
            ["cryptsetup", "luksDump", luks["backing_file"]],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        t0 = time.monotonic()
        art["outputs"].append(tb(*run_fio_args(plan, state, host_dir, manifest)))
        art["run_fio_s"] = time.monotonic() - t0
        art["manifest_doc"] = json.loads(manifest.read_text())
        reps = sorted(host_dir.glob("fio/*/*/rep*.json"))
        art["before_rerun"] = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in reps}
        art["rerun"] = tb(*run_fio_args(plan, state, host_dir, manifest))
        art["outputs"].append(art["rerun"])
        art["rerun_manifest"] = json.loads(manifest.read_text())
        art["after_rerun"] = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in reps}
    finally:
        down = tb("stack-down", "--state", state, "--record", tmp / "teardown.json", check=False)
        art["outputs"].append(down)
    art["down"] = down
    art["dm_node_after"] = os.path.exists("/dev/mapper/control")
    return art


def test_backend_auto_resolves_to_userspace_here():
    b = resolve_backend("auto")
    assert b["selected"] == "userspace"
    assert "device-mapper" in b["reason"]
    k = resolve_backend("kernel")
    assert k["selected"] is None and "device-mapper" in k["reason"]


def test_no_side_effect_on_device_mapper_node(cycle):
    # dmsetup/libdevmapper mknod /dev/mapper/control when probed on a kernel without DM
    if not cycle["dm_node_before"]:
        assert not cycle["dm_node_after"]


def test_capture_env(cycle):
    env = json.loads((cycle["tmp"] / "env.json").read_text())
    assert env["kernel"]["release"] == os.uname().release
    assert env["cpu"]["count"] == os.cpu_count()
    assert isinstance(env["cpu"]["aes"], bool) and isinstance(env["cpu"]["vaes"], bool)
    assert env["tools"]["fio"].startswith("fio-")
    assert "cryptsetup" in env["tools"]["cryptsetup"]
    assert env["backend"]["selected"] == "userspace"
    assert env["backend"]["dm_crypt"]["available"] is False
    assert env["plan"]["run"] == cycle["state_doc"]["run"]
    assert env["mitigations"]
    assert env["cmdline"]


def test_stack_up_exports_two_fuse_devices(cycle):
    st = cycle["state_doc"]
    assert st["backend"] == "userspace" and st["complete"]
    assert set(st["stacks"]) == {"plain", "luks"}
    for e in st["stacks"].values():
        assert e["device_type"] == "file" and e["device"] == e["mountpoint"]
        assert e["mountpoint"] in cycle["mounts_up"]
        assert e["mountpoint"] in cycle["cmdlines_up"]  # the daemon was running
    assert st["stacks"]["plain"]["size_bytes"] == 64 * 2**20
    assert 0 < st["stacks"]["luks"]["size_bytes"] < 64 * 2**20  # minus the LUKS header
    assert st["io_size_bytes"] == st["stacks"]["luks"]["size_bytes"] // 2**20 * 2**20
    assert cycle["key_mode"] == 0o600 and cycle["key_dir_mode"] == 0o700
    assert len(cycle["key"]) == 64


def test_luks_backing_file_is_luks1_and_described(cycle):
    assert cycle["is_luks"] == 0
    assert (
        "LUKS header information" in cycle["luks_dump"]
        and "Version:       \t1" in cycle["luks_dump"]
    )
    d = json.loads(cycle["describe"].read_text())
    luks = d["stacks"]["luks"]
    assert luks["luks_type"] == "luks1" and luks["luks_type_requested"] == "luks2"
    assert any("forces luks1" in n for n in luks["notes"])
    assert (
        luks["cipher"] == "aes-xts-plain64"
        and luks["key_bits"] == 512
        and luks["sector_size"] == 512
    )
    assert "LUKS header information" in luks["luks_dump"]
    assert d["stacks"]["plain"]["kind"] == "plain" and d["backend"] == "userspace"
    for s in d["stacks"].values():
        fill = s["precondition"]["fill"]
        assert fill["io_bytes"] == s["device_size_bytes"]  # one sequential pass over the device


def test_key_appears_nowhere(cycle):
    key = cycle["key"]
    assert key not in cycle["cmdlines_up"]
    texts = [
        p.read_text()
        for p in (
            cycle["tmp"] / "env.json",
            cycle["describe"],
            cycle["tmp"] / "teardown.json",
            cycle["manifest"],
        )
    ]
    texts += [o.stdout + o.stderr for o in cycle["outputs"]]
    texts += [json.dumps(cycle["state_doc"])]
    texts += [p.read_text() for p in cycle["host_dir"].rglob("*.json")]
    assert all(key not in t for t in texts)


def test_run_fio_writes_readonly_fio_json_and_cpu_sidecars(cycle):
    reps = sorted(cycle["host_dir"].glob("fio/*/*/rep*.json"))
    reps = [p for p in reps if not p.name.endswith(".cpu.json")]
    assert len(reps) == 2 * 2 * 2  # stacks x cells x reps
    for p in reps:
        assert p.stat().st_mode & 0o777 == 0o444
        text = p.read_text()
        doc = json.loads(text[text.index("{") :])
        job = doc["jobs"][0]
        assert job["error"] == 0 and job["read"]["io_bytes"] > 0
        assert job["jobname"] == f"{p.parts[-3]}-{p.parts[-2]}"
        cpu = p.with_name(p.name.replace(".json", ".cpu.json"))
        assert cpu.stat().st_mode & 0o777 == 0o444
        c = json.loads(cpu.read_text())
        assert c["busy_s"] > 0 and 0 < c["busy_pct"] <= 100 and c["interval_s"] >= 1.0
        assert set(c["delta_s"]) == {
            "user",
            "nice",
            "system",
            "idle",
            "iowait",
            "irq",
            "softirq",
            "steal",
        }
    assert not list(cycle["host_dir"].rglob("*.tmp"))


def test_manifest_records_counterbalanced_schedule(cycle):
    m = cycle["manifest_doc"]
    assert m["complete"] and m["backend"] == "userspace" and "pair" in m["pairing"]
    runs = m["runs"]
    assert [r["index"] for r in runs] == list(range(1, 9))
    assert not any(r["skipped_existing"] for r in runs)
    orders = {}
    for i in range(0, 8, 2):
        a, b = runs[i], runs[i + 1]
        assert a["workload"] == b["workload"] and a["round"] == b["round"]
        assert {a["stack"], b["stack"]} == {"plain", "luks"}
        assert a["ended"] <= b["started"]
        orders.setdefault(a["workload"], set()).add((a["stack"], b["stack"]))
    # two rounds: every cell ran once in each order
    assert all(o == {("plain", "luks"), ("luks", "plain")} for o in orders.values()), orders
    for r in runs:
        assert (cycle["host_dir"] / r["path"]).is_file()
        assert r["path"] == f"fio/{r['stack']}/{r['workload']}/rep{r['rep']}.json"
    # measured overhead: each 1-s fio run takes well under 3 s wall time
    assert cycle["run_fio_s"] < 8 * 3


def test_progress_with_elapsed_and_eta_on_stderr(cycle):
    stack_up, run_fio = cycle["outputs"][1].stderr, cycle["outputs"][2].stderr
    assert "[1/2] plain: preconditioning" in stack_up and "[2/2] luks: preconditioning" in stack_up
    assert re.search(r"luks: preconditioned in [\d.]+ s; elapsed \d+s, ETA 0s", stack_up)
    # 8 runs of 1 s: the first ETA is at least the 7 runs left, the last one nothing
    assert re.search(r"of fio", run_fio)
    etas = re.findall(r"\] (?:plain|luks) .*; elapsed (\d+)s, ETA (\d+)s", run_fio)
    assert len(etas) == 8 and int(etas[0][1]) >= 7 and etas[-1][1] == "0"
    assert [int(e) for e, _ in etas] == sorted(int(e) for e, _ in etas)


def test_rerun_skips_existing_reps_unchanged(cycle):
    assert cycle["before_rerun"] == cycle["after_rerun"]
    assert cycle["rerun"].stderr.count("exists, skipped") == 8
    m = cycle["rerun_manifest"]
    assert all(r["skipped_existing"] for r in m["runs"]) and m["complete"]
    # the original timestamps are carried over from the first manifest
    assert [r["started"] for r in m["runs"]] == [
        r["started"] for r in cycle["manifest_doc"]["runs"]
    ]


def test_stack_down_leaves_nothing(cycle):
    assert cycle["down"].returncode == 0, cycle["down"].stderr
    rec = json.loads((cycle["tmp"] / "teardown.json").read_text())
    assert rec["ok"] and all(rec["checks"].values()) and not rec["already_down"]
    assert any("quit via QMP" in a for a in rec["actions"])
    assert not cycle["state"].exists()
    assert_clean(cycle["state_doc"])
    # idempotent
    again = tb("stack-down", "--state", cycle["state"], "--record", cycle["tmp"] / "teardown2.json")
    assert "already down" in again.stderr
    assert json.loads((cycle["tmp"] / "teardown2.json").read_text())["already_down"]


# --- failures --------------------------------------------------------------------------------------


def test_stack_down_after_daemon_killed(tmp_path):
    run = f"kil{os.getpid()}"
    plan = make_plan(tmp_path, run, cells=(("read", "4k", 1),), reps=1)
    state = tmp_path / "state.json"
    tb("stack-up", "--plan", plan, "--state", state, "--describe", tmp_path / "stacks.json")
    doc = json.loads(state.read_text())
    try:
        pid = doc["stacks"]["luks"]["daemon"]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert doc["stacks"]["luks"]["mountpoint"] in safety.mountpoints()  # FUSE mount left behind
        r = tb(
            *run_fio_args(plan, state, tmp_path / "raw" / run / "tb1", tmp_path / "m.json"),
            check=False,
        )
        assert (
            r.returncode == 1
            and "stack state is stale; run stack-down and stack-up again" in r.stderr
        )
        assert not list((tmp_path / "raw").rglob("rep*.json"))
    finally:
        rec = stack_down(state)  # the library entry point, as error handlers use it
    assert rec["ok"], rec
    assert any("unmounted stale FUSE mount" in a for a in rec["actions"])
    assert_clean(doc)


def test_sigint_during_run_fio_keeps_no_partial_rep_and_cleans_up(tmp_path):
    run = f"int{os.getpid()}"
    plan = make_plan(tmp_path, run, cells=(("randread", "4k", 1),), reps=1, runtime_s=20)
    state = tmp_path / "state.json"
    host_dir = tmp_path / "raw" / run / "tb1"
    tb("stack-up", "--plan", plan, "--state", state, "--describe", tmp_path / "stacks.json")
    doc = json.loads(state.read_text())
    devices = [e["device"] for e in doc["stacks"].values()]
    try:
        proc = subprocess.Popen(
            luksbench_testbox_argv(
                *run_fio_args(plan, state, host_dir, host_dir / "fio" / "manifest.json")
            ),
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 10
        fio = []
        while not fio and time.monotonic() < deadline:
            fio = find_our_processes(devices, names=("fio",))
            time.sleep(0.1)
        assert fio, "fio never started"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "interrupted" in err
        assert not find_our_processes(devices, names=("fio",))
        assert not [p for p in host_dir.rglob("rep*.json") if not p.name.endswith(".cpu.json")]
        assert not list(host_dir.rglob("*.tmp"))
        # only a complete measurement writes the manifest; the session record keeps this one
        assert not (host_dir / "fio" / "manifest.json").exists()
        (record, _), *_ = session_records(host_dir)
        m = json.loads(record.read_text())
        assert m["complete"] is False and m["interrupted"] == "SIGINT"
        # devices stay up for stack-down
        assert all(e["mountpoint"] in safety.mountpoints() for e in doc["stacks"].values())
    finally:
        rec = stack_down(state)
    assert rec["ok"], rec
    assert_clean(doc)


def test_stack_up_failure_tears_down_what_was_built(tmp_path):
    run = f"fail{os.getpid()}"
    plan = make_plan(
        tmp_path, run, ioengine="no-such-engine"
    )  # precondition fails after both stacks are up
    state = tmp_path / "state.json"
    r = tb(
        "stack-up",
        "--plan",
        plan,
        "--state",
        state,
        "--describe",
        tmp_path / "stacks.json",
        check=False,
    )
    assert r.returncode == 1 and "precondition" in r.stderr and "tearing down" in r.stderr
    assert not state.exists() and not (tmp_path / "stacks.json").exists()
    assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == []
    assert not [m for m in safety.mountpoints() if run in m]
    assert not find_our_processes([run])


def test_kernel_backend_refused_without_device_mapper(tmp_path):
    plan = make_plan(tmp_path, f"krn{os.getpid()}", backend="kernel")
    r = tb(
        "stack-up",
        "--plan",
        plan,
        "--state",
        tmp_path / "s.json",
        "--describe",
        tmp_path / "d.json",
        check=False,
    )
    assert r.returncode == 1 and "no usable backend" in r.stderr and "device-mapper" in r.stderr
    assert not (tmp_path / "s.json").exists()


def test_stack_up_refuses_existing_state(tmp_path):
    plan = make_plan(tmp_path, f"ex{os.getpid()}")
    (tmp_path / "s.json").write_text("{}")
    r = tb(
        "stack-up",
        "--plan",
        plan,
        "--state",
        tmp_path / "s.json",
        "--describe",
        tmp_path / "d.json",
        check=False,
    )
    assert r.returncode == 1 and "run `luksbench testbox stack-down" in r.stderr


def test_benchmark_ciphers_keeps_output_verbatim(tmp_path):
    out = tmp_path / "cryptsetup-benchmark.txt"
    args = ["--cipher", "aes-xts-plain64", "--key-size", "512"]
    r = tb("benchmark-ciphers", "--out", out, *args)
    direct = subprocess.run(
        ["cryptsetup", "benchmark", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
    )
    assert out.read_bytes() == direct.stdout
    assert f"exit code {direct.returncode}" in r.stderr


def test_kernel_backend_plain_loop_device(tmp_path):
    """The kernel backend's loop path for real (a plain-only plan needs no device-mapper)."""
    run = f"lo{os.getpid()}"
    plan = make_plan(
        tmp_path, run, cells=(("read", "1m", 4),), reps=1, backend="kernel", plain_only=True
    )
    state, describe = tmp_path / "state.json", tmp_path / "stacks.json"
    host_dir = tmp_path / "raw" / run / "tb1"
    tb("stack-up", "--plan", plan, "--state", state, "--describe", describe)
    doc = json.loads(state.read_text())
    try:
        e = doc["stacks"]["plain"]
        assert doc["backend"] == "kernel" and "dm-crypt is not needed" in doc["backend_reason"]
        d = json.loads(describe.read_text())["stacks"]["plain"]
        assert e["device"].startswith("/dev/loop") and e["device"] == d["loop_device"]
        assert stat.S_ISBLK(os.stat(e["device"]).st_mode)
        assert safety.loop_devices_backed_by([d["backing_file"]]) == [e["device"]]
        assert e["size_bytes"] == 64 * 2**20
        # the undo log names the backing file and the loop device, in creation order
        assert [o["type"] for o in doc["objects"]] == ["backing_file", "loop"]
        assert (
            d["loop_direct_io"] in (True, False)
            and d["precondition"]["fill"]["io_bytes"] == 64 * 2**20
        )
        tb(*run_fio_args(plan, state, host_dir, tmp_path / "m.json"))
        rep = host_dir / "fio" / "plain" / "read-1m-qd4" / "rep1.json"
        text = rep.read_text()
        assert json.loads(text[text.index("{") :])["jobs"][0]["read"]["io_bytes"] > 0
    finally:
        rec = stack_down(state)
    assert rec["ok"], rec
    assert any(a.startswith("losetup -d /dev/loop") for a in rec["actions"])
    assert not safety.loop_devices_backed_by([d["backing_file"]])
    assert not os.path.exists(d["backing_file"])
    assert_clean(doc)
