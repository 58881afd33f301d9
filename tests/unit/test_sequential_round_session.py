"""A round of the sequential design over sessions (run-fio --one-session): which session of the
cycle it is measured as, which pairs, and the workflow's rounds asking for it."""

from __future__ import annotations

import json

from testkit.testbox import loop_plan

from luksbench.cli import build_parser
from luksbench.orchestrate.sequential import round_options
from luksbench.testbox.runner import round_session, session_pairs

PLAN = {
    "seed": 7,
    "repetitions": 3,
    "sessions": 3,
    "baseline": "plain",
    "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}},
    "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1, 32]},
}
CELLS = ("randread-4k-qd1", "randread-4k-qd32")


def measured(pairs: dict[str, list[int]], session: str, existing: dict, stacks=("plain", "luks")):
    out = dict(existing)
    for cell, reps in pairs.items():
        for rep in reps:
            for stack in stacks:
                out.setdefault((cell, rep), {})[stack] = session
    return out


def test_rounds_cycle_the_sessions_one_pair_each():
    """Round r (targets r per continuing cell) is measured as session (r - 1) mod 3, its new pair
    r (the session's earlier pairs are on disk: skipped); a cell that stopped at 3 pairs neither
    gets pairs nor moves the cycle."""
    existing, seen = {}, []
    for r in range(1, 7):
        targets = {"randread-4k-qd1": r, "randread-4k-qd32": min(r, 3)}
        label = round_session(PLAN, targets, existing)
        pairs = session_pairs(PLAN, targets, existing, label, one_session=True)
        new = {c: [r for r in reps if (c, r) not in existing] for c, reps in pairs.items()}
        seen.append((label, new["randread-4k-qd1"], new["randread-4k-qd32"]))
        existing = measured(pairs, label, existing)
    assert seen == [
        ("session-1", [1], [1]),
        ("session-2", [2], [2]),
        ("session-3", [3], [3]),
        ("session-1", [4], []),
        ("session-2", [5], []),
        ("session-3", [6], []),
    ]
    # without one_session the same round in a further session measures the plan's 3 pairs
    targets = {"randread-4k-qd1": 7, "randread-4k-qd32": 3}
    assert len(session_pairs(PLAN, targets, existing, "session-1")["randread-4k-qd1"]) > 1


def test_an_interrupted_round_is_finished_as_its_own_session():
    existing = measured({c: [1] for c in CELLS}, "session-1", {})
    existing[("randread-4k-qd1", 2)] = {"plain": "session-2"}  # round 2 stopped half-way
    existing[("randread-4k-qd32", 2)] = {"plain": "session-2", "luks": "session-2"}
    targets = dict.fromkeys(CELLS, 2)
    assert round_session(PLAN, targets, existing) == "session-2"
    pairs = session_pairs(PLAN, targets, existing, "session-2", one_session=True)
    assert pairs == {"randread-4k-qd1": [2], "randread-4k-qd32": [2]}


def test_the_workflows_rounds_ask_run_fio_for_one_session_with_sessions(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(loop_plan("r", tmp_path, sessions=1)))
    assert round_options(plan) == []
    plan.write_text(json.dumps(loop_plan("r", tmp_path, sessions=3)))
    assert round_options(plan) == ["--one-session"]
    argv = ["testbox", "run-fio", "--plan", "p", "--state", "s", "--raw-host-dir", "r"]
    args = build_parser().parse_args([*argv, "--manifest", "m", "--targets", "t", "--one-session"])
    assert args.one_session is True
    assert build_parser().parse_args([*argv, "--manifest", "m"]).one_session is False


def test_the_first_round_with_sessions_is_one_pair_per_cell(tmp_path):
    """Before any manifest says so, the plan's sessions make the first round one pair per
    cell (its session's share of the cycle), not min_pairs pairs in the first session."""
    import pandas as pd

    from luksbench.analysis.sequential import next_round

    first = {"comparisons": [("plain", "luks")], "cells": list(CELLS), "min_pairs": 3}
    doc = next_round(pd.DataFrame(), "h", tmp_path / "t.json", sessions=3, **first)
    assert doc["pairs"] == dict.fromkeys(CELLS, 1) and doc["sessions"] == 3
    assert next_round(pd.DataFrame(), "h", tmp_path / "u.json", **first)["pairs"] == dict.fromkeys(
        CELLS, 3
    )
