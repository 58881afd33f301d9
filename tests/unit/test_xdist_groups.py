"""The suite's two workers: the integration tier and the notebooks run on one worker, one test at
a time in collection order (the test box's lock), the VM tier on one, unit tests anywhere."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from testkit.paths import REPO
from testkit.xdist import xdist_group


def test_each_tier_has_its_group():
    assert xdist_group("tests/integration/test_faults.py::test_x[a]") == "testbox"
    assert xdist_group("notebooks/01-ingest::ipynb::Cell 0") == "testbox"
    assert xdist_group("tests/vm/test_vmbox.py::test_y") == "vm"
    assert xdist_group("tests/unit/test_lock.py::test_z") is None


@pytest.mark.slow
def test_a_two_worker_run_keeps_the_integration_tier_on_one_worker_in_order():
    """A real `pytest -n 2` over integration dry runs and unit tests: every integration test
    reports from the same worker, in collection order, while unit tests run beside them."""
    tests = ["tests/integration/test_executor_profiles.py", "tests/unit/test_lock.py"]
    argv = [sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider", *tests]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600).stdout
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", out, re.MULTILINE)
    integration = [(worker, test) for worker, test in ran if xdist_group(test) == "testbox"]
    assert len(integration) >= 4 and len({w for w, _ in integration}) == 1, out[-3000:]
    collected = subprocess.run(
        [*argv[:3], "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", tests[0]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.split()
    assert [t for _, t in integration] == [t for t in collected if "::" in t], out[-3000:]
    assert len(ran) > len(integration), out[-3000:]
