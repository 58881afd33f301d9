"""The VM test box's harness (tests/vm/harness.py, a script the tests load as a module) and the
check every VM fixture makes before it boots the guest."""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import pytest

from testkit.paths import REPO

VMBOX_DIR = REPO / "tests" / "vm"


def harness() -> ModuleType:
    """tests/vm/harness.py as a module."""
    spec = importlib.util.spec_from_file_location("vmbox_harness", VMBOX_DIR / "harness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def usable_harness() -> ModuleType:
    """The harness, where the guest can be built and booted; else the test is skipped (not root,
    or host tools missing), and under CI, which runs scripts/setup.sh, a missing tool fails it."""
    module = harness()
    if os.geteuid() != 0:
        pytest.skip("the VM test box needs root (mmdebstrap --mode=root builds the guest)")
    missing = module.missing_tools()
    if missing:
        message = f"missing {', '.join(missing)}: bash scripts/setup.sh installs them"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return module
