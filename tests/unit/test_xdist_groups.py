"""The suite's two workers: the integration tier and the notebooks run on one worker, one test at
a time in collection order (the test box's lock), the VM tier and the publishing-only integration
files beside them, unit tests anywhere."""

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
    assert xdist_group("tests/vm/test_vmbox.py::test_y") == "beside"
    assert xdist_group("tests/integration/test_workflow_report.py::test_r") == "beside"
    assert xdist_group("tests/unit/test_lock.py::test_z") is None


@pytest.mark.slow
def test_a_two_worker_run_keeps_each_group_on_one_worker_in_order():
    """A real `pytest -n 2` over integration dry runs of both groups and unit tests: each group's
    tests report from one worker, in collection order, while unit tests run beside them."""
    tests = [
        "tests/integration/test_workflow.py",
        "tests/integration/test_executor_profiles.py",
        "tests/unit/test_lock.py",
    ]
    options = ["-p", "no:cacheprovider", "-k", "dry_run or profile or lock"]
    argv = [sys.executable, "-m", "pytest", *options]
    out = subprocess.run(
        [*argv, "-n", "2", "-v", *tests], cwd=REPO, capture_output=True, text=True, timeout=600
    ).stdout
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", out, re.MULTILINE)
    collected = subprocess.run(
        [*argv, "-n", "0", "--collect-only", "-q", *tests],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.split()
    for group in ("testbox", "beside"):
        mine = [(worker, test) for worker, test in ran if xdist_group(test) == group]
        assert len(mine) >= 3 and len({w for w, _ in mine}) == 1, (group, out[-3000:])
        assert [t for _, t in mine] == [t for t in collected if xdist_group(t) == group]
    assert any(xdist_group(t) is None for _, t in ran), out[-3000:]
