"""One benchmark at a time per test box: a second run is refused, naming the one that holds it."""

from __future__ import annotations

import json
import sys

import pytest

from luksbench.testbox import lock
from luksbench.testbox.plan import plan_from_config

LUKSBENCH = [sys.executable, "-m", "luksbench.cli", "testbox"]
CONFIG = {
    "run": "holder",
    "backend": "auto",
    "device_size_mib": 64,
    "precondition": False,
    "baseline": "plain",
    "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}},
    "matrix": {"rw": ["read"], "bs": ["4k"], "iodepth": [1]},
    "fio": {"ioengine": "libaio", "direct": True, "runtime_s": 1, "ramp_time_s": 0},
    "repetitions": 1,
    "seed": 1,
}


def test_lock_is_held_while_the_holders_stacks_are_up(tmp_path):
    locks = tmp_path / "locks"
    first_state, second_state = tmp_path / "a" / "state.json", tmp_path / "b" / "state.json"
    first_state.parent.mkdir()
    first_state.write_text("{}")  # stacks of the first run are up
    first = plan_from_config(CONFIG, "box", tmp_path / "a")
    second = plan_from_config({**CONFIG, "run": "intruder"}, "box", tmp_path / "b")

    lock.acquire(first, first_state, lock_dir=locks)
    with pytest.raises(
        lock.Locked, match=r"run 'holder' \(host 'box'\) started from .* stack-down"
    ):
        lock.acquire(second, second_state, lock_dir=locks)
    assert not lock.release(second_state, lock_dir=locks), "only the holder releases"

    first_state.unlink()  # the first run's stacks came down without releasing (a crash)
    lock.acquire(second, second_state, lock_dir=locks)  # stale: taken over
    holder = json.loads((locks / lock.LOCK_NAME).read_text())
    assert holder["run"] == "intruder"
    assert lock.release(second_state, lock_dir=locks)
    assert not (locks / lock.LOCK_NAME).exists()
