"""Studies (config/studies/): each validates, resolves into the study's plan, and its dry run
lists the full matrix; a user file naming a study merges as documented."""

from __future__ import annotations

import re
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest
import yaml
from testkit.plans import EXPECTED, STUDIES_DIR, load_study, luks_layers, validated
from testkit.workflow import copy_workflow
from testkit.workflow import snakemake_cli as snakemake

from luksbench.studies import StudyError, apply_study, available_studies
from luksbench.testbox.planbuild import (
    PlanError,
    plan_from_config,
    planned_size_bytes,
    walk_layers,
    workloads,
)
from luksbench.testbox.planview import layer_layout

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

HEADER = re.compile(
    r"^luksbench plan: run (?P<run>\S+) on (?P<host>\S+): (?P<stacks>\d+) stacks x "
    r"(?P<cells>\d+) cells x (?P<reps>\d+) repetitions = (?P<runs>\d+) fio runs$",
    re.M,
)


def device_refs(layer, above: tuple[str, ...] = ()):
    """(device name, kinds of the layers above it, top first) for every device reference."""
    if isinstance(layer, str):
        yield layer, above
        return
    kinds = (*above, layer["kind"])
    if layer["kind"] in ("raw", "external"):
        yield layer["device"], kinds
    if "over" in layer:
        yield from device_refs(layer["over"], kinds)
    for member in layer.get("members") or []:
        yield from device_refs(member, kinds)


def plan_of(name: str, tmp_path: Path) -> dict:
    return plan_from_config(validated(load_study(name)), "pytest", tmp_path / "scratch")


def cell_ids(matrix: dict, pattern: str = "") -> set[str]:
    """Workload ids written out from the study's own matrix (its bs labels are canonical)."""
    suffix = f"-{pattern}" if pattern else ""
    return {
        f"{rw}-{bs}-qd{qd}{suffix}"
        for rw, bs, qd in product(matrix["rw"], matrix["bs"], matrix["iodepth"])
    }


def study_cell_ids(study: dict) -> set[str]:
    """The main matrix's cells and every pattern's, from the study's own text."""
    ids = cell_ids(study["matrix"])
    for name, pattern in (study.get("patterns") or {}).items():
        ids |= cell_ids(pattern["matrix"], name)
    return ids


@pytest.fixture(scope="module")
def workflow_copy(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("studies") / "work")


# --- every study -----------------------------------------------------------------------------


def test_there_is_one_config_per_seed_study():
    assert available_studies(STUDIES_DIR) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_study_is_a_complete_config_of_its_own(name):
    study = load_study(name)
    assert study["study"] == name
    assert study["run"] == name
    assert study["backend"] == "kernel"
    assert study["precondition"]["fill_passes"] == 2
    assert study["repetitions"] == 5
    assert study["fio"]["runtime_s"] == EXPECTED[name]["runtime_s"]
    # Scratch files on loop devices by default, small enough for a run on this kind of machine.
    for device, spec in study["devices"].items():
        assert set(spec) == {"size_mib"}, f"{name}: devices.{device} is not a scratch device"
        assert 256 <= spec["size_mib"] <= 1024, f"{name}: devices.{device}"
    # The header says what the study did, what differs, and how to point it at real disks.
    header = (STUDIES_DIR / f"{name}.yaml").read_text().split("\nstudy:")[0]
    for topic in ("What the study measured", "reproduces", "differs", f"study: {name}"):
        assert topic in header, f"{name}: the header comment lacks {topic!r}"
    assert "/dev/disk/by-id/" in header


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_study_resolves_into_its_plan(name, tmp_path):
    expected = EXPECTED[name]
    plan = plan_of(name, tmp_path)
    assert list(plan["stacks"]) == list(expected["stacks"])
    assert plan["baseline"] == expected["baseline"]
    assert validated(load_study(name))["analysis"]["variant"] == expected["variant"]
    assert len(workloads(plan)) == expected["cells"]
    for stack, devices in expected["stacks"].items():
        named = {device for device, _ in device_refs(plan["stacks"][stack])}
        assert named == devices, f"{name}: stacks.{stack} names {named}"
    # No scratch file is created that no stack uses.
    assert set(plan["devices"]) == set().union(*expected["stacks"].values())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_device_is_claimed_twice(name, tmp_path):
    """What stack-up would refuse on the machine: a device under md or fs shared with anything
    else (check_stacks sees only direct references), or two luks layers on one device
    (cryptsetup will not format a device that dm-crypt holds)."""
    plan = plan_of(name, tmp_path)
    refs: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for stack, tree in plan["stacks"].items():
        for device, kinds in device_refs(tree):
            refs.setdefault(device, []).append((stack, kinds))
    for device, uses in refs.items():
        if any({"md", "fs"} & set(kinds) for _, kinds in uses):
            assert len(uses) == 1, (
                f"{name}: devices.{device} is claimed by md/fs and used by {uses}"
            )
        luks_on_it = [stack for stack, kinds in uses if kinds[-1:] == ("luks",)]
        assert len(luks_on_it) <= 1, f"{name}: devices.{device} carries luks of {luks_on_it}"


# --- what each study set up --------------------------------------------------------------------


def test_scs_2023_measures_its_luks_on_a_disk_and_under_raid0(tmp_path):
    plan = plan_of("scs-2023", tmp_path)
    assert plan["matrix"] == {
        "rw": ["read", "write", "randread", "randwrite"],
        "bs": ["4k", "64k", "1m", "4m", "16m", "64m"],
        "iodepth": [1, 32],
    }
    assert plan["fio"]["ioengine"] == "libaio" and plan["fio"]["direct"] is True
    stacks = plan["stacks"]
    # `-c aes-xts-plain64 -s 256` on the disk and on every RAID-0 member.
    for name in ("luks", "raid0-luks"):
        layers = luks_layers(stacks[name])
        assert layers and all(
            (lay["cipher"], lay["key_bits"]) == ("aes-xts-plain64", 256) for lay in layers
        )
    assert stacks["raid0"]["kind"] == "md" and stacks["raid0"]["level"] == 0
    assert stacks["raid0-luks"]["level"] == 0 and len(stacks["raid0-luks"]["members"]) == 3
    assert stacks["linear"] == {"kind": "linear", "like": "luks", "optional": False}
    assert stacks["null-cipher"]["cipher"] == "cipher_null-ecb"


def test_ceph_reef_2023_has_the_tuned_luks_arms(tmp_path):
    plan = plan_of("ceph-reef-2023", tmp_path)
    assert plan["matrix"] == {
        "rw": ["randread", "randwrite"],
        "bs": ["4k", "4m"],
        "iodepth": [1, 128],
    }
    stacks = plan["stacks"]
    assert stacks["luks"]["sector_size"] == 512 and stacks["luks"]["perf_flags"] == []
    assert stacks["luks-4k"]["sector_size"] == 4096
    assert stacks["luks-submit"]["perf_flags"] == ["submit_from_crypt_cpus"]
    assert set(stacks["luks-nowq"]["perf_flags"]) == {"no_read_workqueue", "no_write_workqueue"}
    assert plan["precondition"]["block_size"] == "4m"  # the study's pre-fill "with large writes"
    # the "sync" set: one 4k I/O in flight, each write durable (O_SYNC) before the next
    assert plan["patterns"] == {
        "sync": {
            "description": plan["patterns"]["sync"]["description"],
            "matrix": {"rw": ["randread", "randwrite"], "bs": ["4k"], "iodepth": [1]},
            "io_bs": "",
            "fsync_per_block": False,
            "fio": {"ioengine": "psync", "direct": True, "sync": True},
            "rate_pct": None,
        }
    }
    assert "etcd" in plan["patterns"]["sync"]["description"]


def test_raid5_2012_encrypts_a_five_member_raid5(tmp_path):
    plan = plan_of("raid5-2012", tmp_path)
    assert plan["matrix"]["bs"] == [
        "4k",
        "8k",
        "16k",
        "32k",
        "64k",
        "128k",
        "256k",
        "512k",
        "1m",
        "2m",
        "4m",
    ]
    assert plan["matrix"]["iodepth"] == [1] and plan["fio"]["direct"] is True
    stacks = plan["stacks"]
    arrays = [
        lay
        for stack in stacks.values()
        for _, lay in walk_layers(stack, "")
        if isinstance(lay, dict) and lay["kind"] == "md"
    ]
    assert len(arrays) == 3 and all(a["level"] == 5 and len(a["members"]) == 5 for a in arrays)
    for name in ("luks-raid5", "ext4-luks-raid5"):
        (luks,) = luks_layers(stacks[name])
        assert (luks["cipher"], luks["key_bits"], luks["hash"]) == (
            "aes-cbc-essiv:sha256",
            256,
            "sha256",
        )
    fs = stacks["ext4-luks-raid5"]
    assert fs["kind"] == "fs" and fs["fstype"] == "ext4" and fs["over"]["kind"] == "luks"
    assert fs["over"]["over"]["kind"] == "md"
    # the large-block pattern: 4k..1g blocks of buffered 8 KiB I/Os, an fsync after each block
    large = plan["patterns"]["largeblock"]
    assert large["matrix"] == {
        "rw": ["randread", "randwrite"],
        "bs": [f"{2**i}k" for i in range(2, 10)] + [f"{2**i}m" for i in range(10)] + ["1g"],
        "iodepth": [1],
    }
    assert (large["io_bs"], large["fsync_per_block"]) == ("8k", True)
    assert large["fio"] == {"ioengine": "psync", "direct": False, "sync": False}
    # every stack holds one 1 GiB block as far as the plan tells (the ext4 file is the smallest)
    sizes = {name: planned_size_bytes(plan, stack) for name, stack in stacks.items()}
    assert min(sizes, key=sizes.get) == "ext4-luks-raid5"
    assert sizes["ext4-luks-raid5"] >= 1.2 * 2**30


def test_ciphers_2010_has_one_luks_arm_per_cipher(tmp_path):
    plan = plan_of("ciphers-2010", tmp_path)
    assert plan["matrix"] == {"rw": ["read"], "bs": ["64k"], "iodepth": [1]}
    ciphers = {lay["cipher"] for stack in plan["stacks"].values() for lay in luks_layers(stack)}
    assert ciphers == {
        "aes-xts-plain64",
        "aes-cbc-essiv:sha256",
        "serpent-xts-plain64",
        "twofish-xts-plain64",
        "cast5-cbc-plain",
        "xchacha12,aes-adiantum-plain64",
        "cipher_null-ecb",
    }
    # A cipher the kernel lacks is left out with its reason; the compared pair must be there.
    optional = {n for n, s in plan["stacks"].items() if s.get("optional")}
    assert optional == set(plan["stacks"]) - {"raw", "aes-xts"}
    # Only the cipher differs between the arms.
    arms = [luks_layers(s)[0] for n, s in plan["stacks"].items() if n != "raw"]
    assert {(a["luks_type"], a["sector_size"], tuple(a["perf_flags"])) for a in arms} == {
        ("luks2", 512, ())
    }


def test_tune_dmcrypt_changes_one_setting_per_arm_against_the_luks2_default(tmp_path):
    plan = plan_of("tune-dmcrypt", tmp_path)
    stacks = plan["stacks"]
    default = {k: stacks["luks"][k] for k in ("cipher", "key_bits", "sector_size", "perf_flags")}
    assert default == {
        "cipher": "aes-xts-plain64",
        "key_bits": 512,
        "sector_size": 512,
        "perf_flags": [],
    }
    changed = {
        name: {k: v for k, v in default.items() if stack.get(k) != v}
        for name, stack in stacks.items()
        if stack["kind"] == "luks" and name != "luks"
    }
    assert changed == {
        "luks-submit": {"perf_flags": []},
        "luks-samecpu": {"perf_flags": []},
        "luks-noreadwq": {"perf_flags": []},
        "luks-nowritewq": {"perf_flags": []},
        "luks-nowq": {"perf_flags": []},
        "luks-highprio": {"perf_flags": []},
        "luks-4k": {"sector_size": 512},
        "luks-key256": {"key_bits": 512},
        "adiantum": {"cipher": "aes-xts-plain64", "key_bits": 512},
        "null-cipher": {"cipher": "aes-xts-plain64"},
    }
    flags = {n: stacks[n]["perf_flags"] for n in changed if stacks[n]["perf_flags"]}
    assert flags == {
        "luks-submit": ["submit_from_crypt_cpus"],
        "luks-samecpu": ["same_cpu_crypt"],
        "luks-noreadwq": ["no_read_workqueue"],
        "luks-nowritewq": ["no_write_workqueue"],
        "luks-nowq": ["no_read_workqueue", "no_write_workqueue"],
        "luks-highprio": ["high_priority"],
    }
    assert stacks["plain"] == {"kind": "raw", "device": "d0", "optional": False}
    # the dry run tells the key sizes apart
    layout = layer_layout(stacks["luks-key256"], plan["devices"])
    assert layout.startswith("luks aes-xts-plain64 256-bit key luks2")
    assert {n for n, s in stacks.items() if s.get("optional")} == {"adiantum", "null-cipher"}
    # CPU per I/O at equal load: the 4k cells again, every arm at one rate
    assert plan["patterns"]["equalload"]["rate_pct"] == 80
    assert plan["patterns"]["seq"]["matrix"] == {
        "rw": ["read", "write"],
        "bs": ["1m"],
        "iodepth": [32],
    }
    # every arm is compared with the default and with the ceiling
    comparisons = validated(load_study("tune-dmcrypt"))["analysis"]["comparisons"]
    pairs = {(c["baseline"], c["variant"]) for c in comparisons}
    for name in set(changed) - {"null-cipher"}:
        assert {("luks", name), ("plain", name)} <= pairs
    assert {("plain", "luks"), ("plain", "null-cipher"), ("null-cipher", "luks")} <= pairs


# --- the dry run -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_dry_run_lists_the_full_matrix(name, workflow_copy):
    expected = EXPECTED[name]
    result = snakemake(
        "-n",
        "all",
        "--configfile",
        f"config/studies/{name}.yaml",
        "--config",
        "host=pytest",
        cwd=workflow_copy,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stderr
    header = HEADER.search(out)
    assert header, f"no plan header in the dry run:\n{out[:3000]}"
    stacks, cells = len(expected["stacks"]), expected["cells"]
    assert header["run"] == name and header["host"] == "pytest"
    assert (int(header["stacks"]), int(header["cells"]), int(header["reps"])) == (stacks, cells, 5)
    assert int(header["runs"]) == stacks * cells * 5
    listed_stacks = re.findall(r"^  stack ([^:\s]+): \S", out, re.M)
    assert listed_stacks == list(expected["stacks"])
    listed_cells = re.findall(r"^  cell (\S+)$", out, re.M)
    assert len(listed_cells) == cells
    assert set(listed_cells) == study_cell_ids(load_study(name))
    assert "run_fio" in result.stdout + out
    assert not (workflow_copy / "data" / "raw" / name).exists(), "a dry run must not measure"


@pytest.mark.slow
def test_a_user_file_runs_a_study_on_its_own_disks(workflow_copy):
    """README's mybox.yaml: study + devices by stable path (+ a shorter runtime)."""
    disks = {f"d{i}": f"/dev/disk/by-id/nvme-PYTEST_DISK_{i}" for i in range(8)}
    mybox = {
        "study": "scs-2023",
        "run": "pytest-mybox",
        "devices": {name: {"path": path} for name, path in disks.items()},
        "fio": {"runtime_s": 5},
    }
    (workflow_copy / "mybox.yaml").write_text(yaml.safe_dump(mybox))
    result = snakemake(
        "-n", "all", "--configfile", "mybox.yaml", "--config", "host=pytest", cwd=workflow_copy
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stderr
    header = HEADER.search(out)
    assert header and header["run"] == "pytest-mybox"
    assert (int(header["stacks"]), int(header["cells"]), int(header["runs"])) == (6, 48, 1440)
    # 1440 runs of 5 s plus the study's 1 s of ramp: the user's runtime, the study's ramp.
    assert "(8640 s of runtime + ramp)" in out
    for name, path in disks.items():
        assert f"  device {name}: {path} (real disk: WILL BE OVERWRITTEN)" in out
    assert "scratch file" not in out, "no scratch device of the study may survive"


def test_an_unknown_study_stops_the_dry_run_naming_the_choices(workflow_copy):
    result = snakemake("-n", "all", "--config", "study=nope", cwd=workflow_copy)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "'study'" in out and "'nope'" in out
    for name in EXPECTED:
        assert name in out


def luksbench_plan(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "luksbench"), "plan", "--workdir", str(cwd), "--host", "pytest", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_luksbench_plan_reads_a_study_like_the_workflow(workflow_copy, tmp_path):
    mybox = tmp_path / "mybox.yaml"
    mybox.write_text("study: ceph-reef-2023\nrun: pytest-plan\nfio: {runtime_s: 5}\n")
    result = luksbench_plan("--configfile", str(mybox), cwd=workflow_copy)
    assert result.returncode == 0, result.stderr
    header = HEADER.search(result.stdout)
    assert header and (header["run"], header["host"]) == ("pytest-plan", "pytest")
    assert (int(header["stacks"]), int(header["cells"])) == (6, 10)


@pytest.mark.parametrize("where", ["configfile", "config"])
def test_the_old_key_profile_is_refused_naming_its_new_spelling(where, workflow_copy, tmp_path):
    """`profile` now means a Snakemake executor profile (profiles/): the study key is `study`."""
    old = tmp_path / "old.yaml"
    old.write_text("profile: scs-2023\n")
    args = ("--configfile", str(old)) if where == "configfile" else ("--config", "profile=scs-2023")
    results = [snakemake("-n", "all", *args, cwd=workflow_copy)]
    if where == "configfile":
        results.append(luksbench_plan(*args, cwd=workflow_copy))
    for result in results:
        assert result.returncode != 0
        out = result.stdout + result.stderr
        assert "config key 'profile' is now 'study': write `study: scs-2023`" in out, out[-3000:]
        assert "luksbench plan: run" not in out  # refused before any plan was made
    with pytest.raises(StudyError, match="config key 'profile' is now 'study'"):
        apply_study(snakemake_config({"profile": "scs-2023"}), {}, STUDIES_DIR)


# --- merging a user's config with a study (luksbench.studies.apply_study) ----------------------


def snakemake_config(overrides: dict) -> dict:
    """What Snakemake hands the workflow: config/config.yaml with the user's keys on top."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def test_a_study_with_the_users_devices_merges_as_documented(tmp_path):
    disks = {f"d{i}": {"path": f"/dev/disk/by-id/nvme-PYTEST_DISK_{i}"} for i in range(8)}
    overrides = {"study": "scs-2023", "run": "mybox", "devices": disks, "fio": {"runtime_s": 5}}
    study = load_study("scs-2023")

    merged = apply_study(snakemake_config(overrides), overrides, STUDIES_DIR)

    assert merged["study"] == "scs-2023" and merged["run"] == "mybox"
    assert merged["devices"] == disks  # replaced whole: no scratch device left
    assert merged["stacks"] == study["stacks"]  # the study's arms, not config.yaml's
    assert merged["baseline"] == "raw"
    assert merged["fio"] == {**study["fio"], "runtime_s": 5}  # merged key by key
    assert merged["matrix"] == study["matrix"]
    plan = plan_from_config(validated(merged), "pytest", tmp_path)
    assert {n: d["path"] for n, d in plan["devices"].items()} == {
        n: d["path"] for n, d in disks.items()
    }
    assert plan["fio"]["runtime_s"] == 5 and plan["fio"]["ioengine"] == "libaio"


def test_the_users_devices_are_never_merged_with_the_study_devices(tmp_path):
    """Naming only d0 drops the study's d1..d7: the stacks that need them are refused."""
    overrides = {"study": "scs-2023", "devices": {"d0": {"path": "/dev/disk/by-id/nvme-ONE"}}}
    merged = apply_study(snakemake_config(overrides), overrides, STUDIES_DIR)
    assert merged["devices"] == overrides["devices"]
    with pytest.raises(PlanError, match=r"device 'd1' is not in devices"):
        plan_from_config(validated(merged), "pytest", tmp_path)


def test_the_users_stacks_replace_the_study_stacks():
    stacks = {"raw": {"kind": "raw", "device": "d0"}, "luks": {"kind": "luks", "over": "d0"}}
    overrides = {"study": "ceph-reef-2023", "stacks": stacks}
    merged = apply_study(snakemake_config(overrides), overrides, STUDIES_DIR)
    assert merged["stacks"] == stacks
    assert merged["devices"] == load_study("ceph-reef-2023")["devices"]


def test_an_unknown_study_is_refused_naming_the_key_and_the_choices():
    with pytest.raises(StudyError) as err:
        apply_study(snakemake_config({"study": "nope"}), {"study": "nope"}, STUDIES_DIR)
    message = str(err.value)
    assert "'study'" in message and "'nope'" in message
    for name in EXPECTED:
        assert name in message
