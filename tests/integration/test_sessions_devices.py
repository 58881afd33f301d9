"""Sessions for real (userspace backend, fio, cryptsetup): every session its own stack-up with a
fresh LUKS format and key, its pairs, its teardown; the raw record names each result's session
and ingest pairs only within a session."""

from __future__ import annotations

import json
import os

import pytest
from testkit.testbox import assert_clean, make_plan, run_fio_args
from testkit.testbox import testbox as tb

from luksbench.analysis import ingest, stats
from luksbench.formats.manifest import session_records

pytestmark = pytest.mark.device


@pytest.fixture(scope="module")
def two_sessions(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sessions")
    run = f"ses{os.getpid()}"
    plan_path = make_plan(tmp, run, cells=(("randread", "4k", 1),), reps=2)
    plan = json.loads(plan_path.read_text())
    plan_path.write_text(json.dumps({**plan, "sessions": 2}))
    state, describe = tmp / "state.json", tmp / "stacks.json"
    host_dir = tmp / "raw" / run / "tb1"
    manifest = host_dir / "fio" / "manifest.json"
    tb("capture-env", "--plan", plan_path, "--out", host_dir / "env.json")
    try:
        tb("stack-up", "--plan", plan_path, "--state", state, "--describe", describe)
        first_state = json.loads(state.read_text())
        first_describe = json.loads(describe.read_text())
        proc = tb(*run_fio_args(plan_path, state, host_dir, manifest, "--describe", describe))
        last_state = json.loads(state.read_text())
        last_describe = json.loads(describe.read_text())
    finally:
        down = tb("stack-down", "--state", state, check=False)
    return {
        "host_dir": host_dir,
        "manifest": json.loads(manifest.read_text()),
        "first": first_state,
        "last": last_state,
        "luks_dumps": [d["stacks"]["luks"]["luks_dump"] for d in (first_describe, last_describe)],
        "stderr": proc.stderr,
        "down": down,
    }


def test_each_session_has_its_own_stack_up_and_pairs(two_sessions):
    first, last = two_sessions["first"], two_sessions["last"]
    assert first["session"] != last["session"]
    # a fresh LUKS format in each session: another header UUID
    uuids = [
        next(line for line in dump.splitlines() if line.startswith("UUID"))
        for dump in two_sessions["luks_dumps"]
    ]
    assert uuids[0] != uuids[1]
    assert "building the stacks afresh" in two_sessions["stderr"]
    records = [json.loads(p.read_text()) for p, _ in session_records(two_sessions["host_dir"])]
    assert len(records) == 2 and records[-1]["complete"] and not records[0]["complete"]
    assert [r["sessions"] for r in records] == [2, 2]
    by_session = {}
    for rec in records:
        for r in rec["runs"]:
            assert r["session"] == rec["session"]
            by_session.setdefault(r["session"], set()).add((r["stack"], r["rep"]))
    assert list(by_session.values()) == [
        {(s, k) for s in ("plain", "luks") for k in (1, 2)},
        {(s, k) for s in ("plain", "luks") for k in (3, 4)},
    ]
    assert two_sessions["down"].returncode == 0
    assert_clean(first)
    assert_clean(last)


def test_ingest_records_the_session_and_pairs_within_it(two_sessions):
    fio = ingest.fio_table(two_sessions["host_dir"].parent)
    assert fio.groupby("session")["rep"].apply(set).tolist() == [{1, 2}, {3, 4}]
    paired = stats.pair_values(fio, "plain", "luks", ["bw_bytes"])
    assert paired["baseline_value"].notna().all() and paired["variant_value"].notna().all()
    assert paired.groupby("session").size().tolist() == [2, 2]
