"""The order of a session's runs: stacks per round and position, each cell's repetitions from
the plan or a targets file, the pairs a session measures, the round's idle CPU sample and the rep's CPU sidecar.
Standard library only."""

from __future__ import annotations

import random
from pathlib import Path

from luksbench.formats.sidecar import cpu_sidecar_document
from luksbench.formats.targets import TargetsError, read_targets
from luksbench.testbox import probes
from luksbench.testbox.planbuild import baseline_first, workloads
from luksbench.testbox.sysutil import TestboxError


def order_positions(plan: dict) -> dict[str, int]:
    """Each cell's place in a seeded permutation of the plan's cells (see :func:`stacks_in_order`)."""
    ids = sorted(w.id for w in workloads(plan))
    random.Random(f"{plan['seed']}:stack-order").shuffle(ids)
    return {w: p for p, w in enumerate(ids)}


def stacks_in_order(stacks: list[str], round_no: int, position: int) -> list[str]:
    """The stacks of a cell in round ``round_no``: rounds 1-2, 3-4, ... each run the cell once in
    order (baseline first) and once reversed, so every even count of rounds is balanced. Which comes
    first flips from block to block (AB BA BA AB: a linear drift cancels too) and alternates over
    the cells' ``position`` (:func:`order_positions`): with an odd count half of the cells have the
    extra pair in order and half reversed."""
    block, second = divmod(round_no - 1, 2)
    forward = (position + block) % 2 == second
    return list(stacks) if forward else list(reversed(stacks))


def load_targets(path: Path) -> dict[str, int]:
    """Workload id -> pairs from an adaptive targets file; TestboxError naming a malformed one."""
    try:
        return {w: design[0] for w, design in read_targets(Path(path)).items()}
    except TargetsError as exc:
        raise TestboxError(f"{path}: {exc}") from exc


def cell_repetitions(plan: dict, targets: dict[str, int] | None = None) -> dict[str, int]:
    """Repetitions per cell: the plan's, or a cell's target when larger (adaptive stage 2)."""
    fixed = int(plan["repetitions"])
    return {w.id: max(fixed, int((targets or {}).get(w.id, fixed))) for w in workloads(plan)}


def session_pairs(
    plan: dict,
    targets: dict[str, int] | None,
    existing: dict[tuple[str, int], dict[str, str]],
    session: str | None,
    one_session: bool = False,
) -> dict[str, list[int]]:
    """The pairs (rep numbers) each cell runs in ``session``, the current stack-up.

    ``existing``: (cell, rep) -> {stack: session that measured it}. A pair measured half in
    another session is never completed here (other devices, keys, preconditioning): the cell gets
    a new pair number. A session holds at most a cell's per-session pairs, all sessions together
    ``sessions`` times that. ``one_session`` (a round of the sequential design over sessions):
    the targets are the cell's pairs in all sessions together, and this session tops up the
    shortfall alone (no further stack-up: the rounds cycle the sessions)."""
    stacks = set(baseline_first(plan))
    per_session = cell_repetitions(plan, targets)
    sessions = int(plan["sessions"])
    pairs = {}
    for w in workloads(plan):
        reps = {rep: by for (cell, rep), by in existing.items() if cell == w.id}
        here = sorted(rep for rep, by in reps.items() if set(by.values()) == {session})
        elsewhere = sum(
            set(by) >= stacks and len(set(by.values())) == 1 and session not in by.values()
            for by in reps.values()
        )
        if one_session:  # the target as it is: a round's first pairs may be fewer than the plan's
            total = int((targets or {}).get(w.id, per_session[w.id]))
            wanted = max(len(here), total - elsewhere)
        else:
            wanted = min(per_session[w.id], sessions * per_session[w.id] - elsewhere)
        free = (r for r in range(1, len(reps) + wanted + 1) if r not in reps)
        pairs[w.id] = sorted(here + [next(free) for _ in range(wanted - len(here))])
    return pairs


def schedule(
    plan: dict, targets: dict[str, int] | None = None, pairs: dict[str, list[int]] | None = None
) -> list[dict]:
    """The whole matrix in run order: one entry per fio run.

    Round k shuffles all cells with ``random.Random(seed + k)`` and runs those that need a k-th
    pair (``pairs``; default 1..n per cell), so the rounds of the fixed design are the same with
    or without targets. The stack order within a pair follows its number."""
    cells = workloads(plan)
    if pairs is None:
        pairs = {w: list(range(1, n + 1)) for w, n in cell_repetitions(plan, targets).items()}
    stacks = baseline_first(plan)
    positions = order_positions(plan)
    runs = []
    # a later session's rounds continue the seeds after the pairs before it: its own cell order
    offset = min((reps[0] for reps in pairs.values() if reps), default=1) - 1
    for k in range(1, max(map(len, pairs.values()), default=0) + 1):
        order = list(cells)
        random.Random(int(plan["seed"]) + offset + k).shuffle(order)
        for w in (w for w in order if len(pairs[w.id]) >= k):
            rep = pairs[w.id][k - 1]
            for pos, stack in enumerate(stacks_in_order(stacks, rep, positions[w.id])):
                runs.append(
                    {"round": k, "rep": rep, "stack": stack, "workload": w, "position_in_cell": pos}
                )
    for i, r in enumerate(runs, 1):
        r["index"] = i
    return runs


def cpu_sidecar(
    before: dict, after: dict, interval_s: float, rapl: dict | None = None, idle: dict | None = None
) -> dict:
    """The rep's sidecar: /proc/stat deltas over the fio run, its RAPL energy (None: absent) and
    the idle sample of its round."""
    return cpu_sidecar_document(probes.cpu_delta(before, after, interval_s), rapl, idle)


def round_idle_sample(outcome: dict, round_: int) -> int:
    """Index in ``outcome["idle_samples"]`` of the idle CPU sample of round ``round_``, taken now
    if the round has none yet (just before its first measured run): one short sample per round
    makes the baseline's error differ from pair to pair, so it averages out over the pairs and
    their interval carries it (one sample per session would shift every pair of the session
    alike); per round costs 2 s a round, beside each run it would cost 2 s a run."""
    samples = outcome["idle_samples"]
    for i, sample in enumerate(samples):
        if sample["round"] == round_:
            return i
    samples.append({"round": round_, **probes.idle_baseline(when=f"before round {round_}")})
    if outcome["cpu_idle_baseline"] is None:  # the session's first: what earlier readers know
        outcome["cpu_idle_baseline"] = samples[-1]
    return len(samples) - 1


def round_session(
    plan: dict, targets: dict[str, int] | None, existing: dict[tuple[str, int], dict[str, str]]
) -> str:
    """The session a round of the sequential design over ``sessions`` k belongs to: the one of
    ``session-1`` .. ``session-k`` holding the fewest whole pairs of the cells the round tops up
    (the first such on a tie), so the rounds cycle the sessions and an interrupted round is
    finished in its own session. Each round is a fresh stack-up: a session's pairs come from
    independent stack-ups, so its mean carries the stack-up effect as a session's does."""
    labels = [f"session-{i}" for i in range(1, int(plan["sessions"]) + 1)]
    stacks = set(baseline_first(plan))
    count = dict.fromkeys(((w.id, s) for w in workloads(plan) for s in labels), 0)
    done = dict.fromkeys((w.id for w in workloads(plan)), 0)
    for (cell, _), by in existing.items():
        if cell in done and set(by) >= stacks:
            done[cell] += 1
            if len(set(by.values())) == 1 and (cell, next(iter(by.values()))) in count:
                count[cell, next(iter(by.values()))] += 1
    topped = [w for w, n in done.items() if int((targets or {}).get(w, 0)) > n]
    return min(labels, key=lambda s: (sum(count[w, s] for w in topped), labels.index(s)))
