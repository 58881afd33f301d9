"""Shared pytest fixtures and helpers; each test's tier marker comes from its folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_DIR = Path(__file__).parents[1]
FIXTURES_DIR = Path(__file__).parent / "fixtures"
# Real-world tool outputs collected by the project (read-only, described in PROVENANCE.md).
EXTERNAL_DIR = REPO_DIR.parent / "shared/datasets/external"


# A test's folder is its tier (tests/README.md); the notebooks (nbval) run the whole analysis.
TIERS = ("unit", "integration", "vm")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.path.is_relative_to(REPO_DIR):
            continue
        parts = item.path.relative_to(REPO_DIR).parts
        if parts[0] == "notebooks":
            item.add_marker("integration")
        elif parts[0] == "tests" and parts[1] in TIERS:
            item.add_marker(parts[1])


@pytest.fixture(scope="session")
def external_dir() -> Path:
    """/work/shared/datasets/external; CI always has it, so a missing copy is a failure, not a skip."""
    if not (EXTERNAL_DIR / "PROVENANCE.md").is_file():
        pytest.fail(
            f"external test data not found: {EXTERNAL_DIR}/PROVENANCE.md is missing "
            "(the shared datasets must sit next to the repository, at ../shared/datasets/external)",
            pytrace=False,
        )
    return EXTERNAL_DIR


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES_DIR


# What a workflow run needs besides raw data (the tests run copies, never the repo's own data).
# (profiles/default: the workflow's own defaults, e.g. resuming an interrupted run)
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "envs", "notebooks", "src", "data/reference")
WORKFLOW_FILES += ("profiles/default", "report")


def copy_workflow(dest: Path, extra: tuple[str, ...] = ()) -> Path:
    """A copy of the workflow (plus ``extra`` repo paths, e.g. data/raw/sample) to run in."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for name in (*WORKFLOW_FILES, *extra):
        source = REPO_DIR / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(source, dest / name, ignore=ignore, dirs_exist_ok=True)
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def luksbench_testbox_argv(*args) -> list[str]:
    """The command line of `luksbench testbox <args>` (for a Popen that a test interrupts)."""
    return [sys.executable, "-m", "luksbench.cli", "testbox", *map(str, args)]


def run_fio_args(plan, state, host_dir, manifest, *extra) -> list:
    """Arguments of `testbox run-fio` for a plan, its stacks' state and a raw host folder."""
    return [
        "run-fio",
        "--plan",
        plan,
        "--state",
        state,
        "--raw-host-dir",
        host_dir,
        "--manifest",
        manifest,
        *extra,
    ]


def testbox(*args, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `luksbench testbox <args>` as the workflow does; fail with its stderr unless ``check``
    is false."""
    proc = subprocess.run(
        luksbench_testbox_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"testbox {args[0]} exited {proc.returncode}\n{proc.stderr}")
    return proc


def loop_plan(run: str, scratch_dir: Path, **overrides) -> dict:
    """A small valid kernel-backend plan: two loop stacks (plain baseline, other), one randread
    4k cell, 1 s runs without ramp; ``overrides`` replace top-level keys."""
    return {
        "run": run,
        "host": "h",
        "backend": "kernel",
        "scratch_dir": str(scratch_dir),
        "device_size_mib": 64,
        "precondition": False,
        "baseline": "plain",
        "stacks": {"plain": {"kind": "loop"}, "other": {"kind": "loop"}},
        "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1]},
        "fio": {
            "ioengine": "libaio",
            "direct": True,
            "runtime_s": 1,
            "ramp_time_s": 0,
            "output_format": "json+",
        },
        "repetitions": 1,
        "seed": 1,
        **overrides,
    }
