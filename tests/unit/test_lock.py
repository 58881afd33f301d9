"""One benchmark at a time per test box: a second run is refused, naming the one that holds it."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pytest
from testkit.testbox import small_config

from luksbench.testbox import lock
from luksbench.testbox.planbuild import plan_from_config

LUKSBENCH = [sys.executable, "-m", "luksbench.cli", "testbox"]
CONFIG = small_config("holder")
GONE = {"pid": 0, "started": None}  # a session whose process has ended


def session_of(process: subprocess.Popen) -> dict:
    return {"pid": process.pid, "started": lock.started(process.pid)}


def test_lock_is_held_while_the_holders_stacks_are_up(tmp_path):
    locks = tmp_path / "locks"
    first_state, second_state = tmp_path / "a" / "state.json", tmp_path / "b" / "state.json"
    first_state.parent.mkdir()
    first_state.write_text("{}")  # stacks of the first run are up
    first = plan_from_config(CONFIG, "box", tmp_path / "a")
    second = plan_from_config({**CONFIG, "run": "intruder"}, "box", tmp_path / "b")

    lock.acquire(first, first_state, lock_dir=locks, session=GONE)
    with pytest.raises(lock.Locked, match=r"run 'holder' \(host 'box'\) .* has stacks up"):
        lock.acquire(second, second_state, lock_dir=locks, session=GONE)
    assert not lock.release(second_state, lock_dir=locks), "only the holder releases"

    first_state.unlink()  # the first run's stacks came down without releasing (a crash)
    lock.acquire(second, second_state, lock_dir=locks, session=GONE)  # stale: taken over
    holder = json.loads((locks / lock.LOCK_NAME).read_text())
    assert holder["run"] == "intruder"
    assert lock.release(second_state, lock_dir=locks)
    assert not (locks / lock.LOCK_NAME).exists()


def test_a_running_session_holds_the_box_before_its_stacks_are_up(tmp_path):
    """Env capture and the cipher benchmark load the machine too: the lock is held from the
    first step of a session to its end, not only while stacks are up."""
    locks = tmp_path / "locks"
    first = plan_from_config(CONFIG, "box", tmp_path / "a")
    second = plan_from_config({**CONFIG, "run": "intruder"}, "box", tmp_path / "b")
    workflow = subprocess.Popen(["sleep", "60"])
    try:
        lock.acquire(first, lock_dir=locks, session=session_of(workflow))
        # the same session takes it again for its next step; another run is kept out
        lock.acquire(first, lock_dir=locks, session=session_of(workflow))
        with pytest.raises(
            lock.Locked, match=rf"run 'holder' .* is measuring \(process {workflow.pid}\)"
        ):
            lock.acquire(second, lock_dir=locks, session=GONE)
        with pytest.raises(lock.Locked):  # the same run from a second, live session
            lock.acquire(first, lock_dir=locks, session=lock.current_session())
    finally:
        workflow.kill()
        workflow.wait()
    lock.acquire(second, lock_dir=locks, session=GONE)  # the session ended: stale
    assert json.loads((locks / lock.LOCK_NAME).read_text())["run"] == "intruder"


def _contend(locks, scratch, barrier) -> None:
    """One process's try at the lock, started with the others at the same instant; its exit
    code says whether it got it (0) or was refused (1)."""
    plan = plan_from_config({**CONFIG, "run": scratch.name}, "box", scratch)
    barrier.wait()
    try:
        lock.acquire(plan, scratch / "state.json", lock_dir=locks, session=GONE)
    except lock.Locked:
        sys.exit(1)
    sys.exit(0)


def _race(tmp_path, trial: int, contenders: int, stale: bool) -> int:
    locks = tmp_path / f"trial{trial}"
    locks.mkdir()
    if stale:  # a crashed run's lock: its stacks are down, its session is gone
        gone = {"state": str(tmp_path / "gone" / "state.json"), "session": GONE, "run": "gone"}
        (locks / lock.LOCK_NAME).write_text(json.dumps(gone))
    scratches = []
    for i in range(contenders):
        scratch = tmp_path / f"t{trial}-run{i}"
        scratch.mkdir()
        (scratch / "state.json").write_text("{}")  # every contender's stacks count as up
        scratches.append(scratch)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(contenders)
    processes = [context.Process(target=_contend, args=(locks, s, barrier)) for s in scratches]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert {p.exitcode for p in processes} <= {0, 1}
    return sum(p.exitcode == 0 for p in processes)


@pytest.mark.parametrize("stale", [False, True], ids=["free", "stale"])
def test_processes_taking_the_lock_at_once_never_both_get_it(tmp_path, stale):
    winners = [_race(tmp_path, trial, 4, stale) for trial in range(15)]
    assert winners == [1] * len(winners)


def _release_from(cwd, state, locks, session_pid: int | None) -> bool:
    """``lock.release`` in a process of its own, started in ``cwd`` (another invocation of the
    same run), in the session ``session_pid`` (None: the process's own)."""
    env = {k: v for k, v in os.environ.items() if k != lock.SESSION_ENV}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    if session_pid is not None:
        env[lock.SESSION_ENV] = str(session_pid)
    code = "import sys; from pathlib import Path; from luksbench.testbox import lock; "
    code += "print(lock.release(Path(sys.argv[1]), lock_dir=Path(sys.argv[2])))"
    out = subprocess.run(
        [sys.executable, "-c", code, str(state), str(locks)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip() == "True"


def test_only_the_holding_session_releases_its_run(tmp_path):
    """The same run (same scratch directory) invoked again from another directory while the
    first session measures: its stack-down must not give the first session's lock away."""
    locks, elsewhere = tmp_path / "locks", tmp_path / "elsewhere"
    elsewhere.mkdir()
    plan = plan_from_config(CONFIG, "box", tmp_path / "a")
    state = tmp_path / "a" / "state.json"
    workflow = subprocess.Popen(["sleep", "60"])
    try:
        lock.acquire(plan, state, lock_dir=locks, session=session_of(workflow))
        assert not _release_from(elsewhere, state, locks, None)
        assert (locks / lock.LOCK_NAME).exists()
        assert _release_from(tmp_path, state, locks, workflow.pid)  # the session's own step
        assert not (locks / lock.LOCK_NAME).exists()
        lock.acquire(plan, state, lock_dir=locks, session=session_of(workflow))
    finally:
        workflow.kill()
        workflow.wait()
    assert _release_from(elsewhere, state, locks, None)  # the session ended: a stale lock


def test_unreadable_proc_facts_are_left_out_not_fatal(monkeypatch):
    from luksbench.testbox import capture

    monkeypatch.setattr(lock, "read_text", lambda _path: "1 (x) S 1 2")
    assert lock.started(1) is None
    meminfo = "MemTotal:\nMemAvailable: lots kB\nSwapTotal:       2048 kB\n"
    monkeypatch.setattr(capture, "read_text", lambda _path: meminfo)
    assert capture._meminfo() == {"SwapTotal": 2048 * 1024}
