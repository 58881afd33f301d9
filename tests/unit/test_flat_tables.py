"""Ingest flattens env.json's plan and devices and the stacks' descriptions once, into columns and
long tables (one row per item), which the paper and the tuning table read as they are: the
shipped sample with a planned disk, a pattern, perf flags (one applied, one skipped) and a dm
table added to its documents."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from luksbench.analysis import ingest, tuning
from luksbench.formats.plan import migrated_plan_document
from luksbench.publish.paper import job_devices

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "raw" / "sample"
DISK = "/srv/box/nvme"
DM_TABLE = "0 2093056 crypt aes-xts-plain64 :64:logon:cryptsetup:x 0 7:1 4096 1 no_read_workqueue"


def _edit(path: Path, change) -> dict:
    path.chmod(0o644)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return doc


def _env(doc: dict) -> None:
    doc["plan"]["scratch_dir"] = f"{DISK}/scratch"
    doc["plan"]["stacks"]["luks"]["perf_flags"] = ["no_read_workqueue", "same_cpu_crypt"]
    doc["plan"]["stacks"]["fast"] = {"kind": "luks", "perf_flags": ["high_priority"]}  # not built
    doc["plan"]["patterns"] = {
        "equalload": {"description": "CPU at equal load", "io_bs": "4k", "rate_pct": 80}
        | {"fsync_per_block": True, "fio": {"sync": True}}
    }
    doc["job_devices"] = [
        {"device": DISK, "block_device": "nvme0n1", "numa_node": 1, "queues": 4}
        | {"scheduler": "none", "io_poll": True, "nvme_poll_queues": "2", "job_cpus": "0-3"}
    ]


def _manifest(doc: dict) -> None:
    luks = doc["stack_descriptions"]["stacks"]["luks"]
    luks |= {"perf_flags": ["no_read_workqueue"], "loop_direct_io": True}
    luks["layers"] = {
        "kind": "luks",
        "dm_table": DM_TABLE,
        "perf_flags_skipped": {"same_cpu_crypt": "this kernel's dm-crypt lacks it"},
        "over": {"kind": "loop"},
    }


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    raw = tmp_path_factory.mktemp("flat") / "sample"
    shutil.copytree(SAMPLE, raw)
    env = _edit(raw / "vm" / "env.json", _env)
    _edit(raw / "vm" / "fio" / "manifest.json", _manifest)
    return ingest.ingest_run(raw, workers=1), env


def test_the_environment_and_its_plan_are_columns(flat):
    tables, doc = flat
    env = tables["env"].iloc[0]
    assert env["captured"] == pd.Timestamp(doc["captured"])
    assert (env["scratch_dir"], env["baseline"]) == (f"{DISK}/scratch", "plain")
    # the sample's plan is an old version: flattened as the current version reads it, so that its
    # options compare with a newer run's (the job options it left out at the values they had)
    plan = migrated_plan_document(doc["plan"])
    assert doc["plan"].get("version", 1) < plan["version"] and set(doc["plan"]["fio"]) < set(
        plan["fio"]
    )
    canonical = json.dumps(plan, sort_keys=True, separators=(",", ":"))
    assert env["config_hash"] == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    assert pd.isna(env["coordinator"])  # the host captured its own environment
    fio = tables["plan_fio"].set_index("option")["option_value"]
    assert fio.to_dict() == {k: str(v) for k, v in plan["fio"].items()}
    pattern = tables["patterns"].iloc[0]
    assert (pattern["pattern"], pattern["io_bs"], pattern["rate_pct"]) == ("equalload", "4k", 80)
    assert pattern["fsync_per_block"] and pattern["sync"]
    planned = tables["plan_stacks"].set_index("stack")
    assert planned.loc["luks", ["cipher", "key_bits", "sector_size"]].tolist() == [
        "aes-xts-plain64",
        512,
        512,
    ]


def test_each_device_is_a_row_and_the_paper_names_it_by_its_block_device(flat):
    devices = flat[0]["job_devices"]
    assert len(devices) == 1
    row = devices.iloc[0]
    assert (row["numa_node"], row["queues"], row["nvme_poll_queues"]) == (1, 4, 2)
    assert row["io_poll"] and row["holds_scratch"]
    assert job_devices(devices) == [
        {"host": "vm", "device": "the scratch directory's disk, `nvme0n1`", "numa_node": "1"}
        | {"queues": "4", "scheduler": "none", "poll": "yes", "cpus": "0-3"}
    ]


def test_the_stacks_perf_flags_and_notes_are_rows(flat):
    tables = flat[0]
    luks = tables["stacks"].set_index("stack").loc["luks"]
    assert (luks["luks_type"], luks["pbkdf"], luks["dm_table"]) == ("luks1", "pbkdf2", DM_TABLE)
    assert luks["loop_direct_io"] and luks["device_size_bytes"] == 1071644672
    flags = tables["perf_flags"].set_index("flag")
    assert flags.loc["no_read_workqueue", ["planned", "applied", "in_dm_table"]].tolist() == [
        True,
        True,
        True,
    ]
    skipped = flags.loc["same_cpu_crypt"]
    assert skipped["planned"] and not skipped["applied"] and not skipped["in_dm_table"]
    assert skipped["skipped_reason"] == "this kernel's dm-crypt lacks it"
    unbuilt = tables["perf_flags"].set_index("stack").loc["fast"]
    assert (unbuilt["flag"], unbuilt["planned"], unbuilt["applied"]) == (
        "high_priority",
        True,
        False,
    )
    notes = tables["stack_notes"]
    assert list(notes["stack"]) == ["luks"] and "luks1" in notes["note"].iloc[0]
    planned = tuning.planned_settings(tables["plan_stacks"], tables["perf_flags"])
    assert planned["vm"]["luks"]["perf_flags"] == ["no_read_workqueue", "same_cpu_crypt"]
    why = tuning.not_applied(tables["stacks"], planned, tables["perf_flags"])
    assert why[("vm", "luks")] == (
        "perf flag same_cpu_crypt not applied: this kernel's dm-crypt lacks it"
    )


def test_every_table_is_written_with_its_columns_documented(tmp_path):
    paths = ingest.write_processed(SAMPLE, tmp_path, workers=1)
    assert set(ingest.PROCESSED_TABLES) <= set(paths)
    assert "undocumented" not in (tmp_path / "README.md").read_text()
    for name in ingest.PROCESSED_TABLES:
        columns = pd.read_parquet(paths[name]).columns
        assert not [c for c in columns if c.endswith("_json")], name
