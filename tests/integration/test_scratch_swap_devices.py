"""A backing file swapped for a symlink between its creation and the first write (what another
user who can change scratch_dir could do) is refused before anything reaches the link's target.

The swap is made by wrapping the backends' own steps (creation, the losetup command line), so the
real checks run between them; every test undoes what it built in its finalizer.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from testkit.testbox import loop_plan

from luksbench.testbox import safety, stacks
from luksbench.testbox.backends import kernel, userspace
from luksbench.testbox.safety import SafetyError

pytestmark = pytest.mark.device


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file standing for /dev/sdX: what the swapped-in link points at."""
    path = tmp_path / "victim.img"
    path.write_bytes(b"precious data " * 4096)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _swap_for_link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


@pytest.fixture
def kernel_builder(tmp_path):
    """A kernel-backend builder over tmp_path/scratch; its undo log is undone at teardown."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    state = {"run": "swap", "scratch_dir": str(scratch), "key_dir": None, "objects": []}
    builder = kernel.KernelBuilder(loop_plan("swap", scratch), state, lambda: None, {})
    yield builder
    actions, errors = [], []
    kernel.undo(state["objects"], actions, errors)
    assert not errors, errors


def test_swapped_after_creation_is_refused_before_losetup(kernel_builder, victim, monkeypatch):
    before = _digest(victim)
    create = kernel.create_backing

    def create_then_swap(path: Path, size: int) -> list[int]:
        identity = create(path, size)
        _swap_for_link(path, victim)
        return identity

    monkeypatch.setattr(kernel, "create_backing", create_then_swap)
    with pytest.raises(SafetyError) as e:
        kernel_builder.build(kernel_builder.plan["stacks"]["plain"], "plain")

    backing = Path(kernel_builder.scratch) / "luksbench-swap-plain-loop.img"
    assert str(e.value).startswith(
        f"{backing} is now a symlink to {victim}, not the file luksbench created (someone who "
        f"can change scratch_dir swapped it); refusing to attach {backing} to a loop device"
    )
    assert safety.loop_devices_backed_by([victim]) == []
    assert _digest(victim) == before


def test_swapped_between_the_check_and_losetup_is_detached_before_use(
    kernel_builder, victim, monkeypatch
):
    before = _digest(victim)
    argv_of = kernel.losetup_argv

    def swap_then_argv(backing) -> list[str]:
        _swap_for_link(Path(backing), victim)
        return argv_of(backing)

    monkeypatch.setattr(kernel, "losetup_argv", swap_then_argv)
    with pytest.raises(SafetyError) as e:
        kernel_builder.build(kernel_builder.plan["stacks"]["plain"], "plain")

    assert f"is attached to {victim} (device, inode" in str(e.value)
    assert "not the file luksbench created" in str(e.value)
    assert safety.loop_devices_backed_by([victim]) == []  # detached again at once
    assert _digest(victim) == before


def test_swapped_after_losetup_is_refused_before_the_next_write(kernel_builder, victim):
    built = kernel_builder.build(kernel_builder.plan["stacks"]["plain"], "plain")
    backing = Path(built["description"]["backing_file"])
    _swap_for_link(backing, victim)

    with pytest.raises(SafetyError, match=rf"^{backing} is now a symlink to {victim}.* to write"):
        kernel_builder._before_writing(built)  # what luksFormat, mdadm and mkfs run first


def _userspace_state(tmp_path: Path, kind: str) -> tuple[dict, Path]:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    plan = loop_plan("swap", scratch, backend="userspace", stacks={"s": {"kind": kind}})
    plan["baseline"] = "s"
    entry = stacks._new_entry(plan, "s", "userspace", scratch.resolve(), 16 * 1024 * 1024)
    state = {"run": "swap", "host": "h", "backend": "userspace", "order": ["s"]}
    state.update(scratch_dir=str(scratch.resolve()), key_dir=None, runtime_dir=None)
    state.update(stacks={"s": entry}, objects=[])
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(state))
    return {**plan, "state": state}, state_path


@pytest.mark.parametrize(("kind", "step"), [("luks", "luksFormat"), ("plain", "export")])
def test_userspace_swap_is_refused_before_luksformat_or_export(
    tmp_path, victim, monkeypatch, kind, step
):
    before = _digest(victim)
    plan, state_path = _userspace_state(tmp_path, kind)
    state = plan.pop("state")
    create = userspace.create_backing

    def create_then_swap(path: Path, size: int) -> list[int]:
        identity = create(path, size)
        _swap_for_link(path, victim)
        return identity

    monkeypatch.setattr(userspace, "create_backing", create_then_swap)
    try:
        with pytest.raises(SafetyError) as e:
            userspace.build_userspace(plan, state, state_path, 16 * 1024 * 1024)
    finally:
        record = stacks.stack_down(state_path)
    backing = state["stacks"]["s"]["backing_file"]
    assert str(e.value).startswith(f"{backing} is now a symlink to {victim}")
    assert f"refusing to {step} {backing}" in str(e.value)
    assert record["ok"], record
    assert _digest(victim) == before and victim.is_file()


def test_link_planted_at_the_fuse_mountpoint_is_replaced_not_followed(
    tmp_path, victim, monkeypatch
):
    before = _digest(victim)
    plan, state_path = _userspace_state(tmp_path, "plain")
    state = plan.pop("state")
    mountpoint = Path(state["stacks"]["s"]["mountpoint"])
    create = userspace.create_backing

    def create_then_plant(path: Path, size: int) -> list[int]:
        mountpoint.symlink_to(victim)
        return create(path, size)

    monkeypatch.setattr(userspace, "create_backing", create_then_plant)
    try:
        userspace.build_userspace(plan, state, state_path, 16 * 1024 * 1024)
        assert safety.is_mounted(mountpoint) and not safety.is_mounted(victim)
        with open(mountpoint, "r+b") as export:  # writes reach our backing file only
            export.write(b"\1" * 4096)
    finally:
        record = stacks.stack_down(state_path)
    assert record["ok"], record
    assert _digest(victim) == before
