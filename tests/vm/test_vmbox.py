"""The kernel backend for real: dm-crypt and MD inside a Debian VM (tests/vm/).

This machine's kernel has no device-mapper and no MD, so the harness boots a Debian guest under
qemu (TCG) and the guest runs the project's own ``luksbench testbox`` commands for every case in
``tests/vm/plans/``. One boot serves every test here; the assertions read what came back with
the project's parsers. A new plan file is a new case: its ``expect`` block says what to check.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from testkit.vm import harness as vm_harness
from testkit.vm import usable_harness

from luksbench.formats.fio import parse_fio_file

VMBOX_DIR = Path(__file__).parent
PLAN_FILES = sorted((VMBOX_DIR / "plans").glob("*.json"))
CASES = {p.stem: json.loads(p.read_text()) for p in PLAN_FILES}


def _params(names: list[str]) -> list:
    """A case whose file names a ``known_bug`` is a strict xfail: it fails today for that reason
    and turns red as soon as the bug is fixed, so the mark is removed with the fix."""
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=CASES[n]["known_bug"]))
        if CASES[n].get("known_bug")
        else n
        for n in names
    ]


MEASURED = sorted(n for n, c in CASES.items() if c.get("expect", {}).get("stack_up", "ok") == "ok")
REFUSED = sorted(n for n in CASES if n not in MEASURED)

pytestmark = [pytest.mark.slow, pytest.mark.vm]


@pytest.fixture(scope="module")
def vm(tmp_path_factory) -> Path:
    """Boot the guest once for every plan file; the host-side results directory."""
    harness = usable_harness()
    out = Path(os.environ.get("LUKSBENCH_VMBOX_KEEP") or tmp_path_factory.mktemp("vmbox"))
    harness.run_guest(out, PLAN_FILES)
    return out / "results"


def _read(path: Path) -> str:
    assert path.is_file(), f"{path} was not brought back from the guest"
    return path.read_text()


def dm_targets(table: str) -> dict[str, list[str]]:
    """`dmsetup table` -> {device name: [target types]}."""
    found: dict[str, list[str]] = {}
    for line in table.splitlines():
        m = re.match(r"^(\S+): \d+ \d+ (\S+)", line)
        if m:
            found.setdefault(m.group(1), []).append(m.group(2))
    return found


def crypt_arm(line: str) -> dict:
    """A ``dmsetup table`` crypt line -> {cipher, key_bits, options}. The key size is read from
    the kernel keyring reference (``:<bytes>:logon:...``, LUKS2); None for any other key field
    (the null cipher's has no key; dmsetup prints a hex key as ``0`` without --showkeys)."""
    fields = line.split(": ", 1)[1].split()
    keyring = re.match(r":(\d+):logon:", fields[4])
    options = fields[9 : 9 + int(fields[8])] if len(fields) > 8 else []
    key_bits = 8 * int(keyring.group(1)) if keyring else None
    return {"cipher": fields[3], "key_bits": key_bits, "options": sorted(options)}


def md_arrays(mdstat: str) -> dict[str, str]:
    """/proc/mdstat -> {md device: personality} for active arrays."""
    return dict(re.findall(r"^(md\d+) : active (?:\(\S+\) )?(\w+)", mdstat, flags=re.M))


def scratch_mounts(mounts: str) -> dict[str, str]:
    """/proc/self/mounts -> {mountpoint: fstype} for the file systems under the scratch dirs."""
    found = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1].startswith("/var/lib/luksbench/"):
            found[fields[1]] = fields[2]
    return found


def loop_devices(losetup_json: str) -> list[str]:
    text = losetup_json.strip()
    return [d["name"] for d in json.loads(text)["loopdevices"]] if text else []


def test_guest_kernel_has_device_mapper_and_md(vm):
    summary = json.loads(_read(vm / "summary.json"))
    for module in ("dm_mod", "dm_crypt", "raid0", "raid456"):
        assert summary["modules"][module] == 0, f"modprobe {module}: {summary['modules'][module]}"
    assert "raid0" in _read(vm / "captures-boot/mdstat.txt")
    assert [d["by_id"] for d in summary["disks"]] == [
        f"/dev/disk/by-id/virtio-luksbench-scratch{i}" for i in range(4)
    ]
    assert set(summary["cases"]) == set(CASES), "every plan file ran"


@pytest.mark.parametrize("name", _params(MEASURED))
def test_case_measured_and_torn_down(vm, name):
    expect = CASES[name].get("expect", {})
    case_dir = vm / name
    case = json.loads(_read(case_dir / "case.json"))
    failed = [
        f"{s['step']}: exit {s['exit']} {s.get('stderr_tail')}"
        for s in case["steps"]
        if s["exit"] != 0
    ]
    assert not failed, f"{name}: steps failed in the guest:\n" + "\n".join(failed)
    plan = json.loads(_read(case_dir / "plan.json"))
    env = json.loads(_read(case_dir / "env.json"))
    assert env["backend"]["selected"] == "kernel", env["backend"]
    stacks = json.loads(_read(case_dir / "stacks.json"))
    assert set(stacks["stacks"]) == set(plan["stacks"])

    # While the stacks were up, and again while fio ran: the kernel objects the plan asks for.
    for when in ("up", "during"):
        table = _read(case_dir / f"captures/{when}/dmsetup-table.txt")
        targets = dm_targets(table)
        ours = {t for dev, ts in targets.items() if dev.startswith("luksbench-") for t in ts}
        for target in expect.get("dm_targets_up", []):
            assert target in ours, f"{name} ({when}): no {target} target in {targets}"
        crypt_lines = [line for line in table.splitlines() if " crypt " in line]
        for option in expect.get("crypt_options_up", []):
            assert any(option in line for line in crypt_lines), (name, when, option, crypt_lines)
        levels = set(md_arrays(_read(case_dir / f"captures/{when}/mdstat.txt")).values())
        for level in expect.get("md_levels_up", []):
            assert level in levels, f"{name} ({when}): no active {level} array, mdstat has {levels}"
        fstypes = set(scratch_mounts(_read(case_dir / f"captures/{when}/mounts.txt")).values())
        for fstype in expect.get("fs_types_up", []):
            assert fstype in fstypes, f"{name} ({when}): no {fstype} mounted, only {fstypes}"
        # each arm as configured: its own crypt line, read from the guest's `dmsetup table`
        lines = {line.split(": ", 1)[0]: line for line in crypt_lines}
        for stack, want in expect.get("crypt_arms_up", {}).items():
            mapper = Path(stacks["stacks"][stack]["device"]).name
            assert mapper in lines, f"{name} ({when}): no crypt mapping of {stack}: {lines}"
            assert crypt_arm(lines[mapper]) == want, (name, when, stack, lines[mapper])
    for stack, pattern in expect.get("notes_up", {}).items():
        notes = stacks["stacks"][stack]["notes"]
        assert any(re.search(pattern, note) for note in notes), (stack, notes)
    assert case["steps"][[s["step"] for s in case["steps"]].index("run-fio")]["during_capture_at_s"]

    # After stack-down: nothing of ours is left in the kernel.
    after = case_dir / "captures/after"
    left = [d for d in dm_targets(_read(after / "dmsetup-table.txt")) if d.startswith("luksbench-")]
    assert not left, _read(after / "dmsetup-table.txt")
    assert not md_arrays(_read(after / "mdstat.txt")), _read(after / "mdstat.txt")
    assert not loop_devices(_read(after / "losetup.json")), _read(after / "losetup.txt")
    assert not scratch_mounts(_read(after / "mounts.txt")), _read(after / "mounts.txt")
    if expect.get("scratch_disks_blank_after"):
        # What luksbench wrote on the allowlisted disks it wiped again (wipefs -a) at teardown.
        marked = [
            line
            for line in _read(after / "blkid.txt").splitlines()
            if re.match(r"/dev/vd[b-e]", line)
        ]
        assert not marked, f"{name}: signatures left on the scratch disks: {marked}"
    if expect.get("external_left_alone"):
        # An external device is used as it is: never formatted, never torn down.
        assert expect["external_left_alone"] in dm_targets(_read(after / "dmsetup-table.txt"))
    assert not case["leftovers"] or not any(case["leftovers"].values()), case["leftovers"]
    teardown = json.loads(_read(case_dir / "teardown.json"))
    assert teardown["ok"] and all(teardown["checks"].values()), teardown

    # One fio result per stack and cell and repetition, read with the project's parser.
    host_dir = case_dir / "raw" / plan["run"] / plan["host"] / "fio"
    for stack, desc in stacks["stacks"].items():
        files = sorted((host_dir / stack).glob("*/rep*.json"))
        files = [f for f in files if not f.name.endswith(".cpu.json")]
        assert len(files) == expect.get("fio_results_per_stack", 1), (stack, files)
        for f in files:
            rows = parse_fio_file(f)
            assert rows and all(r["error"] == 0 and r["io_bytes"] > 0 for r in rows), (f, rows)
            job = json.loads(f.read_text())["jobs"][0]
            filename = job["job options"]["filename"]
            assert filename == desc["device"], (
                f"{f}: fio ran on {filename}, stack is {desc['device']}"
            )

    if expect.get("fio_jobs"):
        _check_fio_jobs(host_dir, expect["fio_jobs"])

    # Sessions: each its own stack-up, recorded with every result it measured.
    if expect.get("sessions"):
        records = [json.loads(p.read_text()) for p in sorted((host_dir / "sessions").glob("*"))]
        ids = {r["session"] for rec in records for r in rec["runs"]}
        assert len(ids) == expect["sessions"] and records[-1]["complete"], records

    # Every LUKS layer the description records carries its header dump, with the sector size asked.
    for stack, desc in stacks["stacks"].items():
        dumps = [node for node in _nodes(desc) if "luks_dump" in node]
        if desc["kind"] == "luks":
            assert desc["device"].startswith("/dev/mapper/luksbench-"), desc["device"]
            assert dumps, f"{stack}: no luks_dump in the description"
        for node in dumps:
            if node["luks_type"] == "luks1":  # LUKS1 headers have no sector size (always 512)
                assert re.search(r"Version:\s+1\n", node["luks_dump"]), node["luks_dump"]
            else:
                sector = node["sector_size"]
                assert re.search(rf"sector:\s+{sector} \[bytes\]", node["luks_dump"]), node


def _check_fio_jobs(host_dir: Path, want: dict) -> None:
    """numjobs job entries per result, each pinned as asked; the io_uring options applied or
    skipped with the reason recorded in the manifest."""
    for run in json.loads(_read(host_dir / "manifest.json"))["runs"]:
        cell, jobs = run["workload"], run["fio_jobs"]
        entries = json.loads(_read(host_dir.parent / run["path"]))["jobs"]
        assert jobs["numjobs"] == want["numjobs"] == len(entries), (run, len(entries))
        assert jobs["cpus_allowed"] == want["cpus_allowed"][cell], run
        options = [e["job options"] for e in entries]
        assert all(o.get("cpus_allowed", "") == jobs["cpus_allowed"] for o in options), options
        assert sorted(jobs["skipped"]) == want["skipped"].get(cell, []), run
        assert all(reason for reason in jobs["skipped"].values()), run
        for option in want["applied"].get(cell, []):
            assert all(o.get(option) == "1" for o in options), (option, options)


def _nodes(obj):
    """Every dict inside a JSON value (stack descriptions nest their layers)."""
    if isinstance(obj, dict):
        yield obj
        for value in obj.values():
            yield from _nodes(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _nodes(value)


@pytest.mark.parametrize("name", _params(REFUSED))
def test_case_refused_and_nothing_touched(vm, name):
    expect = CASES[name]["expect"]
    case_dir = vm / name
    case = json.loads(_read(case_dir / "case.json"))
    up = next(s for s in case["steps"] if s["step"] == "stack-up")
    stderr = _read(case_dir / "logs/stack-up.stderr")
    assert up["exit"] == 1, f"{name}: stack-up exited {up['exit']}:\n{stderr}"
    assert re.search(expect["stack_up"]["refused"], stderr), stderr
    # Nothing was written to any scratch disk the case's own setup did not prepare.
    prepared = set(expect.get("setup_changes_disks", []))
    for serial, before in case["fingerprints_before"].items():
        if serial not in prepared:
            assert case["fingerprints_after"][serial] == before, f"{name}: {serial} was written"
    # The kernel objects are the ones the setup made, no more: nothing built and left behind.
    before = case_dir / "captures/before"
    after = case_dir / "captures/after"
    assert _read(after / "dmsetup-table.txt") == _read(before / "dmsetup-table.txt")
    assert md_arrays(_read(after / "mdstat.txt")) == md_arrays(_read(before / "mdstat.txt"))
    assert loop_devices(_read(after / "losetup.json")) == loop_devices(
        _read(before / "losetup.json")
    )
    assert not case["state_file_left"]
    assert not any(case["leftovers"].values()), case["leftovers"]


# --- the whole workflow inside the guest (opt-in: ~15 min under TCG) -----------------------------

WORKFLOW_CASE = VMBOX_DIR / "workflow-plans/snakemake-small.json"


@pytest.mark.skipif(
    not os.environ.get("LUKSBENCH_VMBOX_WORKFLOW"),
    reason="opt-in, about 15 minutes under TCG: LUKSBENCH_VMBOX_WORKFLOW=1 (make vmsnakemake)",
)
def test_snakemake_all_inside_the_guest(tmp_path_factory):
    """`snakemake --cores 1 all` in the guest: kernel backend, ingest, statistics, paper."""
    from testkit.workflow import copy_workflow

    harness = vm_harness()
    if os.geteuid() != 0 or harness.missing_tools():
        pytest.fail(f"needs root and {harness.missing_tools()}")  # opted in: no silent skip
    tmp = tmp_path_factory.mktemp("vmbox-workflow")
    workflow = copy_workflow(tmp / "workflow")
    out = harness.run_guest(tmp / "out", [WORKFLOW_CASE], workflow_dir=workflow, timeout=3600)
    case_dir = out / "results" / WORKFLOW_CASE.stem
    case = json.loads(_read(case_dir / "case.json"))
    assert case["ok"], (case["problems"], _read(case_dir / "snakemake.log")[-3000:])
    run = f"vm-{WORKFLOW_CASE.stem}"
    done = case_dir / "workflow"
    env = json.loads(_read(done / f"data/raw/{run}/luksbench-vm/env.json"))
    assert env["backend"]["selected"] == "kernel"
    during = dm_targets(_read(case_dir / "captures/during/dmsetup-table.txt"))
    assert "crypt" in {t for ts in during.values() for t in ts}, during
    results = sorted((done / f"data/raw/{run}/luksbench-vm/fio").glob("*/*/rep*.json"))
    results = [f for f in results if not f.name.endswith(".cpu.json")]
    assert len(results) == 4, results  # 2 stacks x 1 cell x 2 repetitions
    for f in results:
        assert all(r["error"] == 0 and r["io_bytes"] > 0 for r in parse_fio_file(f)), f
    paper = _read(done / f"paper/{run}/index.md")
    assert "luks" in paper and (done / f"paper/{run}/index.html").is_file()
    teardown = json.loads(_read(done / f"data/scratch/{run}/luksbench-vm/teardown.json"))
    assert teardown["ok"], teardown
