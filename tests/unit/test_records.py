"""The versioned records of luksbench.formats: plan, manifest and sessions, targets, env and the
CPU sidecar. Each writes its version, reads every version it knows (a file without one is version
1), and refuses a newer or unknown one naming the file and the version."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from testkit.plans import fio_settings, plan_stacks, validated

from luksbench.formats import envdoc, manifest, plan, sidecar, targets
from luksbench.formats.record import RecordVersionError
from luksbench.testbox.planbuild import load_plan, plan_changes

PLAN_V1 = {  # as the workflow wrote plans before they had a version: unused sections left out
    "run": "r",
    "host": "h",
    "backend": "auto",
    "scratch_dir": "/srv/scratch/r/h",
    "device_size_mib": 64,
    "precondition": True,
    "baseline": "plain",
    "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}},
    "matrix": {"rw": ["read"], "bs": ["4k"], "iodepth": [1]},
    "fio": fio_settings(runtime_s=2, ramp_time_s=1),
    "repetitions": 3,
    "seed": 7,
}
SIDECAR = {
    "interval_s": 2.0,
    "clk_tck": 100,
    "cpu_count": 2,
    "delta_s": {"user": 1.0, "system": 0.5, "idle": 2.0, "iowait": 0.5},
    "busy_s": 1.5,
    "busy_pct": 37.5,
}


def dump(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def refused(read, path: Path, version) -> str:
    """The message of reading a file of ``version``: it must name the file and the version."""
    with pytest.raises(ValueError) as caught:
        read(path)
    message = str(caught.value)
    assert str(path) in message and f"version {version!r}" in message, message
    return message


# --- plan ------------------------------------------------------------------------------------------


def test_a_plan_round_trips_with_its_version(tmp_path):
    record = plan.Plan.from_document({**PLAN_V1, "sessions": 2})
    plan.write_plan_file(tmp_path / "plan.json", record)
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["version"] == plan.PLAN_VERSION == 4
    again = plan.read_plan(tmp_path / "plan.json")
    assert again == record and again.sessions == 2 and again.fio["runtime_s"] == 2


def test_a_version_1_plan_is_migrated(tmp_path):
    record = plan.read_plan(dump(tmp_path / "plan.json", PLAN_V1))
    assert record.version == 4
    assert (record.sessions, record.patterns, record.devices) == (1, {}, {})
    assert record.adaptive is None and record.fleet is None
    patterned = {**PLAN_V1, "patterns": {"p": {"matrix": PLAN_V1["matrix"]}}}
    assert plan.Plan.from_document(patterned).patterns["p"]["rate_pct"] is None  # unthrottled
    # resuming a run measured with a version 1 plan: the migrated plan is the same measurement
    assert plan_changes(PLAN_V1, record.to_document()) == []


@pytest.mark.parametrize("version", [5, 0, "2", True])
def test_a_newer_or_unknown_plan_version_is_refused(tmp_path, version):
    path = dump(tmp_path / "plan.json", {**PLAN_V1, "version": version})
    message = refused(plan.read_plan, path, version)
    assert ("update luksbench" in message) == (version == 5)
    with pytest.raises(RecordVersionError):
        load_plan(path)


def current_plan() -> dict:
    """PLAN_V1 as the workflow writes it now: every job and preconditioning option, the Ceph
    settings and every layer setting, from the validated config (the schema's defaults)."""
    config = validated({"precondition": {"enabled": True}, "fio": PLAN_V1["fio"]})
    doc = {**PLAN_V1, "version": 4, "fio": config["fio"], "precondition": config["precondition"]}
    doc["ceph"] = config["ceph"]
    doc["stacks"] = plan_stacks(PLAN_V1["stacks"])
    return {**doc, "devices": {}, "sessions": 1, "patterns": {}, "adaptive": None, "fleet": None}


# What a version 2 test box did with the options its plan left out (written out here: what an
# old file meant must not follow the schema when a default changes).
V2_PRECONDITION = {"enabled": True, "discard": True, "fill_passes": 2, "block_size": "128k"}
V2_PRECONDITION |= {"steady_state": False, "ss_rw": "randwrite", "ss_bs": "4k", "ss_iodepth": 32}
V2_PRECONDITION |= {"ss_round_s": 10, "ss_max_rounds": 25, "ss_window": 5}
V2_PRECONDITION |= {"ss_range_pct": 20.0, "ss_slope_pct": 10.0}
V2_JOBS = {"numjobs": 1, "cpus_allowed": "", "cpus_allowed_policy": "shared", "numa_pin": False}
V2_JOBS |= {"fixedbufs": False, "registerfiles": False, "hipri": False}


@pytest.mark.parametrize("precondition", [True, False, {"fill_passes": 1}])
def test_a_version_2_plan_means_what_it_left_out(tmp_path, precondition):
    v2 = {**PLAN_V1, "version": 2, "precondition": precondition}
    v2 |= {"devices": {}, "sessions": 1, "patterns": {}, "adaptive": None, "fleet": None}
    stated = {"enabled": precondition} if isinstance(precondition, bool) else precondition
    meant = {**v2, "version": 4, "precondition": V2_PRECONDITION | stated}
    meant |= {"fio": V2_JOBS | PLAN_V1["fio"], "ceph": {"daemon_modes": "crc secure"}}
    meant["stacks"] = plan.migrated_plan_document({**v2, "version": 3})["stacks"]  # test below
    record = plan.read_plan(dump(tmp_path / "plan.json", v2))
    assert record.to_document() == meant
    assert len(record.precondition) == len(plan.PRECONDITION_KEYS)
    # resuming a run measured with a version 2 plan with a plan of the same values: comparable
    assert plan_changes(v2, meant) == [] and plan_changes(meant, v2) == []
    other = {**meant, "precondition": {**meant["precondition"], "fill_passes": 3}}
    assert plan_changes(v2, other) == [
        f"precondition.fill_passes: {meant['precondition']['fill_passes']!r} -> 3"
    ]
    more_jobs = {**meant, "fio": {**meant["fio"], "numjobs": 4}}
    assert plan_changes(v2, more_jobs) == ["fio.numjobs: 1 -> 4"]


@pytest.mark.parametrize(
    ("section", "key"),
    [("precondition", "ss_window"), ("fio", "hipri"), ("fio", "numjobs"), ("ceph", "daemon_modes")],
)
def test_a_current_plan_must_hold_every_option(tmp_path, section, key):
    doc = current_plan()
    doc[section] = {k: v for k, v in doc[section].items() if k != key}
    path = dump(tmp_path / "plan.json", doc)
    with pytest.raises(plan.PlanError, match=rf"missing key\(s\) {section}\.{key}"):
        plan.read_plan(path)
    bare = dump(tmp_path / "bare.json", {**current_plan(), "precondition": True})
    with pytest.raises(plan.PlanError, match="precondition must be an object"):
        plan.read_plan(bare)


# What a version 3 test box did with a layer setting its plan left out, and a stack without
# optional (written out here: it must not follow the schema when a default changes).
V3_LAYERS = {
    "plain": ({"kind": "plain"}, {"size_mib": 0}),
    "luks": (
        {"kind": "luks", "over": {"kind": "md", "members": ["d0", "d1"]}},
        {"cipher": "aes-xts-plain64", "key_bits": 512, "hash": "sha256", "luks_type": "luks2"}
        | {"sector_size": 512, "pbkdf_iterations": 1000, "perf_flags": []}
        | {"allow_discards": False},
    ),
    "fs": ({"kind": "fs", "over": "d2"}, {"fstype": "ext4", "file_size_mib": 0}),
    "rbd": (
        {"kind": "rbd", "pool": "p", "image": "i"},
        {"mode": "crc", "image_mib": 0, "conf": None, "keyring": None, "client": "admin"}
        | {"secure_mode": ""},
    ),
}


def test_a_version_3_plan_means_the_current_plan_with_the_layer_settings_it_left_out(tmp_path):
    v3 = {**current_plan(), "version": 3, "baseline": "plain"}
    v3["stacks"] = {name: layer for name, (layer, _) in V3_LAYERS.items()}
    record = plan.read_plan(dump(tmp_path / "plan.json", v3))
    for name, (layer, meant) in V3_LAYERS.items():
        top = {k: v for k, v in record.stacks[name].items() if k != "over"}
        assert top == {k: v for k, v in layer.items() if k != "over"} | meant | {"optional": False}
    assert record.stacks["luks"]["over"] == {"kind": "md", "members": ["d0", "d1"]} | {
        "level": 0,
        "chunk_kib": 512,
    }
    # null flags meant none, and optional on a layer below a stack did nothing
    nulls = {**v3, "stacks": {**v3["stacks"], "luks": {**V3_LAYERS["luks"][0]}}}
    nulls["stacks"]["luks"] |= {"perf_flags": None, "allow_discards": None, "optional": None}
    nulls["stacks"]["luks"]["over"] = {**nulls["stacks"]["luks"]["over"], "optional": True}
    stacks = plan.read_plan(dump(tmp_path / "nulls.json", nulls)).stacks
    assert stacks == record.stacks
    # a run measured with it, resumed with today's plan of the same stacks: comparable
    assert plan_changes(v3, record.to_document()) == []
    keyed = {**record.to_document(), "stacks": {**record.stacks, "luks": {**record.stacks["luks"]}}}
    keyed["stacks"]["luks"]["key_bits"] = 256
    assert plan_changes(v3, keyed) == ["stacks.luks.key_bits: 512 -> 256"]


def test_a_current_plan_layer_must_hold_every_setting_of_its_kind(tmp_path):
    doc = current_plan()
    del doc["stacks"]["luks"]["pbkdf_iterations"]
    with pytest.raises(plan.PlanError, match=r"missing key\(s\) stacks\.luks\.pbkdf_iterations"):
        plan.read_plan(dump(tmp_path / "plan.json", doc))
    doc = current_plan()
    del doc["stacks"]["plain"]["optional"]
    with pytest.raises(plan.PlanError, match=r"stacks\.plain\.optional must be true or false"):
        plan.read_plan(dump(tmp_path / "plan.json", doc))


def test_a_plan_with_an_unknown_key_is_refused_naming_it(tmp_path):
    path = dump(tmp_path / "plan.json", {**PLAN_V1, "repetition": 5})
    with pytest.raises(plan.PlanError, match=re.escape(f"{path}: unknown key(s) repetition")):
        plan.read_plan(path)


def test_a_plan_without_the_fio_settings_the_test_box_reads_is_refused(tmp_path):
    fio = {k: v for k, v in PLAN_V1["fio"].items() if k != "runtime_s"}
    path = dump(tmp_path / "plan.json", {**PLAN_V1, "fio": fio})
    with pytest.raises(plan.PlanError, match=r"missing key\(s\) fio\.runtime_s"):
        plan.read_plan(path)


def test_the_plan_record_reads_as_its_document():
    record = plan.Plan.from_document(PLAN_V1)
    assert dict(record) == record.to_document()
    assert record["fio"] is record.fio and record.get("fleet") is None
    with pytest.raises(KeyError):
        record["nonsense"]


# --- manifest, sessions, env, targets: documents kept whole ---------------------------------------

DOCUMENTS = [
    (
        manifest.write_manifest,
        manifest.read_manifest,
        {"run": "r", "complete": True, "sessions": 1, "runs": []},
    ),
    (envdoc.write_env, envdoc.read_env, {"captured": "2026-01-01T00:00:00Z", "plan": PLAN_V1}),
    (targets.write_targets, targets.read_targets_document, {"pairs": {"read-4k-qd1": 5}}),
]


@pytest.mark.parametrize(("write", "read", "doc"), DOCUMENTS)
def test_a_document_round_trips_with_its_version_and_keeps_unknown_keys(tmp_path, write, read, doc):
    path = tmp_path / "record.json"
    write(path, {**doc, "from_a_later_minor_change": [1, 2]})
    assert json.loads(path.read_text())["version"] == 2
    assert read(path) == {"version": 2, **doc, "from_a_later_minor_change": [1, 2]}


@pytest.mark.parametrize(("write", "read", "doc"), DOCUMENTS)
def test_a_version_1_document_reads_as_version_2(tmp_path, write, read, doc):
    assert read(dump(tmp_path / "record.json", doc)) == {"version": 2, **doc}


def test_a_version_1_manifest_without_sessions_measured_one(tmp_path):
    doc = {"run": "r", "complete": True, "runs": []}
    assert manifest.read_manifest(dump(tmp_path / "m.json", doc))["sessions"] == 1
    three = manifest.read_manifest(dump(tmp_path / "k.json", {**doc, "sessions": 3}))
    assert three["sessions"] == 3


@pytest.mark.parametrize(("write", "read", "doc"), DOCUMENTS)
@pytest.mark.parametrize("version", [3, -1, None])
def test_a_newer_or_unknown_document_version_is_refused(tmp_path, write, read, doc, version):
    refused(read, dump(tmp_path / "record.json", {**doc, "version": version}), version)


def test_the_session_record_is_written_once_read_only(tmp_path):
    path = tmp_path / "sessions" / "20260101T000000Z.json"
    manifest.write_manifest(path, {"run": "r"}, mode=0o444)
    assert path.stat().st_mode & 0o777 == 0o444


def test_the_runner_and_ingest_reader_of_targets_refuse_a_newer_version(tmp_path):
    path = dump(tmp_path / "targets.json", {"version": 3, "pairs": {"read-4k-qd1": 5}})
    with pytest.raises(targets.TargetsError, match=re.escape(f"{path}: targets version 3")):
        targets.read_targets(path)
    with pytest.raises(RecordVersionError):
        targets.read_looks(path)
    targets.write_targets(path, {"pairs": {"read-4k-qd1": 5}})
    assert targets.read_targets(path) == {"read-4k-qd1": (5, False, None, None)}


# --- CPU sidecar -----------------------------------------------------------------------------------


def test_a_cpu_sidecar_round_trips_with_its_version(tmp_path):
    path = tmp_path / "rep1.cpu.json"
    doc = sidecar.cpu_sidecar_document(SIDECAR, rapl=None)
    sidecar.write_cpu_sidecar(path, doc)
    assert json.loads(path.read_text())["version"] == 2 and path.stat().st_mode & 0o777 == 0o444
    values = sidecar.read_cpu_sidecar(path)
    assert values == {
        "busy_cpu_s": 1.5,
        "busy_cpu_pct": 37.5,
        "sys_cpu_s": 0.5,
        "cpu_interval_s": 2.0,
    }
    # version 1 (no version) reads the same; keys the reader does not use are left alone
    old = dump(tmp_path / "rep2.cpu.json", {**SIDECAR, "energy": {"pkg": 1}})
    assert sidecar.read_cpu_sidecar(old) == values


@pytest.mark.parametrize("version", [3, "1"])
def test_a_newer_or_unknown_cpu_sidecar_is_refused(tmp_path, version):
    path = dump(tmp_path / "rep1.cpu.json", {**SIDECAR, "version": version})
    refused(sidecar.read_cpu_sidecar, path, version)


@pytest.mark.parametrize("name", ["env.json", "fio/manifest.json"])
def test_ingest_refuses_an_env_or_manifest_of_a_newer_version_naming_file_and_version(
    tmp_path, name
):
    import shutil

    from testkit.paths import SAMPLE

    from luksbench.analysis.ingest import ingest_run

    raw = tmp_path / "sample"
    shutil.copytree(SAMPLE, raw)
    (host,) = [p for p in raw.iterdir() if p.is_dir()]
    path = host / name
    doc = json.loads(path.read_text())
    path.chmod(0o644)
    path.write_text(json.dumps({**doc, "version": 99}))
    problems = ingest_run(raw, workers=1)["problems"]
    named = problems[problems["file"].str.endswith(name)]
    assert named["reason"].str.contains("version 99").any(), problems.to_string()
