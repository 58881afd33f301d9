"""Shared pytest fixtures and helpers; each test's tier marker comes from its folder."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit.vm import harness as vm_harness
from testkit.xdist import tier_scheduling

REPO_DIR = Path(__file__).parents[1]
FIXTURES_DIR = Path(__file__).parent / "fixtures"
# Real-world tool outputs collected by the project (read-only, described in PROVENANCE.md).
EXTERNAL_DIR = REPO_DIR.parent / "shared/datasets/external"


# A test's folder is its tier (tests/README.md); the notebooks (nbval) run the whole analysis.
TIERS = ("unit", "integration", "vm")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """The two workers shared by tier (:mod:`testkit.xdist`)."""
    return tier_scheduling(config, log)


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


VM_HARNESS = REPO_DIR / "tests" / "vm" / "harness.py"  # run as a script by the build
VM_IMAGE_BUILD = pytest.StashKey[subprocess.Popen]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without pytest-xdist: the VM image build starts once the tests are collected."""
    if not hasattr(session.config, "workerinput"):  # xdist's workers leave it to the controller
        _start_vm_image_build(session.config, [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Under pytest-xdist: the controller starts the VM image build (once, for the session)."""
    _start_vm_image_build(node.config, ids)


def _start_vm_image_build(config: pytest.Config, nodeids: list[str]) -> None:
    """The VM tier's guest image takes minutes to build from Debian packages: build it in the
    background while the other tests run. The VM fixture's build_image waits for this build (one
    build at a time per cache) and reuses its image; if this build fails, the fixture builds
    again and reports the error."""
    if config.option.collectonly or os.geteuid() != 0 or VM_IMAGE_BUILD in config.stash:
        return
    if not any(nodeid.startswith("tests/vm/") for nodeid in nodeids):
        return
    harness = vm_harness()
    if harness.missing_tools() or (harness.cache_dir() / harness.image_key("base")).is_dir():
        return
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"luksbench-vm-image-{os.getpid()}.log"
    with log.open("w") as out:
        build = subprocess.Popen(
            [sys.executable, str(VM_HARNESS), "image"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopped with mmdebstrap at the session's end
        )
    config.stash[VM_IMAGE_BUILD] = build
    print(f"\nbuilding the VM guest image in the background (pid {build.pid}, log {log})")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A background image build still running (the VM tests did not run, or failed first)
    is stopped with its process group; its half-built image is never used."""
    build = session.config.stash.get(VM_IMAGE_BUILD, None)
    if build is None or build.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(build.pid, signal.SIGTERM)
    try:
        build.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()


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


@pytest.fixture(scope="session")
def processed_sample(tmp_path_factory) -> Path:
    """The shipped sample (data/raw/sample) ingested and its loss tables written, once a session:
    shared by every test that reads it, so none may write into it (copy it first)."""
    from luksbench.analysis import ingest
    from luksbench.analysis.loss import write_loss

    out = tmp_path_factory.mktemp("processed") / "sample"
    ingest.write_processed(REPO_DIR / "data" / "raw" / "sample", out, workers=1)
    write_loss(out)
    return out


@pytest.fixture
def fio_servers(tmp_path):
    """Two `fio --server` daemons on 127.0.0.1 (stopped afterwards)."""
    from testkit.testbox import free_port

    from luksbench.testbox.runner import check_servers
    from luksbench.testbox.sysutil import TestboxError

    servers = []
    for i in (1, 2):
        port, pidfile = free_port(), tmp_path / f"fio-server{i}.pid"
        subprocess.run(
            ["fio", f"--server=ip:127.0.0.1,{port}", f"--daemonize={pidfile}"], check=True
        )
        servers.append(
            {"name": f"client{i}", "address": "127.0.0.1", "port": port, "pidfile": pidfile}
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            check_servers(servers, timeout=1)
            break
        except TestboxError:
            time.sleep(0.2)
    yield [{k: v for k, v in s.items() if k != "pidfile"} for s in servers]
    for s in servers:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(s["pidfile"].read_text()), 15)
