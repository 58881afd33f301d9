"""Which pairs a session measures: whole sessions of pairs, a pair never completed in another
session (stack-up), resumption that keeps what is done."""

from __future__ import annotations

from luksbench.testbox.runner import schedule, session_pairs

PLAN = {
    "seed": 7,
    "repetitions": 3,
    "sessions": 1,
    "baseline": "plain",
    "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}},
    "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1, 32]},
}
CELLS = ("randread-4k-qd1", "randread-4k-qd32")


def measured(pairs: dict[str, list[int]], session: str, existing=None, stacks=("plain", "luks")):
    existing = dict(existing or {})
    for cell, reps in pairs.items():
        for rep in reps:
            for stack in stacks:
                existing.setdefault((cell, rep), {})[stack] = session
    return existing


def test_one_session_design_measures_pairs_one_to_n_then_nothing():
    first = session_pairs(PLAN, None, {}, "s1")
    assert first == {c: [1, 2, 3] for c in CELLS}
    # the same stack-up again (a rerun): the same pairs, found on disk and skipped
    assert session_pairs(PLAN, None, measured(first, "s1"), "s1") == first
    # a new stack-up has nothing to do
    assert session_pairs(PLAN, None, measured(first, "s1"), "s2") == {c: [] for c in CELLS}


def test_k_sessions_each_get_their_own_pairs():
    plan = {**PLAN, "sessions": 3}
    existing, seen = {}, []
    for s in ("a", "b", "c"):
        pairs = session_pairs(plan, None, existing, s)
        assert all(len(p) == 3 for p in pairs.values())
        seen.append(pairs["randread-4k-qd1"])
        existing = measured(pairs, s, existing)
    assert seen == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert session_pairs(plan, None, existing, "d") == {c: [] for c in CELLS}


def test_a_half_pair_from_another_session_is_never_completed():
    # session a was interrupted after plain of pair 2 of one cell
    existing = measured({"randread-4k-qd1": [1]}, "a")
    existing[("randread-4k-qd1", 2)] = {"plain": "a"}
    pairs = session_pairs(PLAN, None, existing, "b")
    assert pairs["randread-4k-qd1"] == [3, 4]  # two more pairs; 2 stays a lone half
    assert pairs["randread-4k-qd32"] == [1, 2, 3]
    runs = schedule(PLAN, None, pairs)
    assert {(r["workload"].id, r["rep"]) for r in runs} >= {("randread-4k-qd1", 3)}
    assert not any(r["rep"] == 2 and r["workload"].id == "randread-4k-qd1" for r in runs)
    # the same session resumed: its own half pair is completed, not abandoned
    existing[("randread-4k-qd1", 3)] = {"luks": "b"}
    again = session_pairs(PLAN, None, existing, "b")
    assert again["randread-4k-qd1"] == [3, 4]


def test_targets_set_the_pairs_per_session():
    plan = {**PLAN, "sessions": 2}
    targets = {"randread-4k-qd1": 5}
    first = session_pairs(plan, targets, {}, "a")
    assert first == {"randread-4k-qd1": [1, 2, 3, 4, 5], "randread-4k-qd32": [1, 2, 3]}
    second = session_pairs(plan, targets, measured(first, "a"), "b")
    assert second == {"randread-4k-qd1": [6, 7, 8, 9, 10], "randread-4k-qd32": [4, 5, 6]}


def test_order_within_a_pair_follows_its_number_and_stays_balanced():
    plan = {**PLAN, "repetitions": 2, "sessions": 2}
    pairs_b = session_pairs(plan, None, measured({c: [1, 2] for c in CELLS}, "a"), "b")
    runs = schedule(plan, None, pairs_b)
    firsts = {}
    for r in runs:
        if r["position_in_cell"] == 0:
            firsts.setdefault(r["workload"].id, []).append(r["stack"])
    assert all(sorted(v) == ["luks", "plain"] for v in firsts.values())
    assert {r["round"] for r in runs} == {1, 2} and {r["rep"] for r in runs} == {3, 4}


def test_half_pairs_are_the_pairs_some_stack_lacks():
    import pandas as pd

    from luksbench.analysis.cells import half_pairs

    fio = pd.DataFrame(
        {
            "host": "h",
            "workload": "w",
            "session": ["a", "a", "a", "b", "b"],
            "rep": [1, 1, 2, 3, 3],
            "stack": ["plain", "luks", "plain", "plain", "luks"],
        }
    )
    assert list(half_pairs(fio)) == [("h", "w", "a", 2)]


def test_one_session_tops_up_the_targets_in_the_current_stack_up_only():
    """A round of the sequential design over sessions: the targets count the pairs of all
    sessions together; this stack-up measures the shortfall alone, another has nothing to do."""
    plan = {**PLAN, "sessions": 3}
    first = session_pairs(plan, dict.fromkeys(CELLS, 1), {}, "a", one_session=True)
    assert first == {c: [1] for c in CELLS}  # one pair per round, not the plan's 3
    existing = measured(first, "a")
    targets = {"randread-4k-qd1": 2, "randread-4k-qd32": 1}
    second = session_pairs(plan, targets, existing, "b", one_session=True)
    assert second == {"randread-4k-qd1": [2], "randread-4k-qd32": []}
    existing = measured(second, "b", existing)
    assert session_pairs(plan, targets, existing, "c", one_session=True) == {c: [] for c in CELLS}
    # without it the same targets open a further stack-up of the plan's 3 pairs per session
    assert session_pairs(plan, targets, existing, "c")["randread-4k-qd1"] == [3, 4, 5]
