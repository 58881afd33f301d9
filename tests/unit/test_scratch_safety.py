"""scratch_dir must be a folder no other user can change, nor any folder above it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from luksbench.testbox import safety
from luksbench.testbox.safety import SafetyError, check_scratch_dir, others_can_change

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _dir_stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFDIR | mode, 1, 1, 2, uid, 0, 4096, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "uid", "euid", "why"),
    [
        (0o755, 0, 0, None),
        (0o700, 1000, 1000, None),  # our own folder
        (0o1777, 0, 0, None),  # /tmp: others add entries but cannot touch ours
        (0o1777, 0, 1000, None),
        (0o755, 1000, 0, "is owned by"),
        (0o755, 1000, 1001, "is owned by"),
        (0o775, 0, 0, "writable by its group (mode 0775"),
        (0o757, 0, 0, "writable by every user (mode 0757"),
        (0o777, 0, 0, "writable by its group and every user (mode 0777"),
        (0o1777, 1000, 1000, "writable by its group and every user (mode 1777"),  # not root's
    ],
)
def test_others_can_change(mode, uid, euid, why):
    found = others_can_change(_dir_stat(mode, uid), euid)
    assert (found is None) if why is None else (why in found)


def test_world_writable_parent_is_refused_naming_it(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(SafetyError) as e:
        check_scratch_dir(shared / "luksbench" / "scratch")
    assert str(e.value).startswith(
        f"scratch_dir {shared}/luksbench/scratch: {shared}, a folder above it, is writable by "
        "its group and every user (mode 0777"
    )
    assert not (shared / "luksbench").exists()  # refused before anything is created
    shared.chmod(0o1777)  # sticky and root's own (as /tmp): accepted when run as root
    if os.geteuid() == 0:
        assert check_scratch_dir(shared / "scratch") == shared / "scratch"


def test_group_writable_scratch_dir_itself_is_refused(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o770)
    with pytest.raises(SafetyError, match=rf"^scratch_dir {scratch}: it is writable by its group"):
        check_scratch_dir(scratch)
    scratch.chmod(0o700)
    assert check_scratch_dir(scratch) == scratch


@ROOT_ONLY
def test_folder_owned_by_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(SafetyError, match=rf"{theirs}, a folder above it, is owned by .*65534"):
        check_scratch_dir(theirs / "scratch")
    os.chown(theirs, 0, 0)
    assert check_scratch_dir(theirs / "scratch") == theirs / "scratch"


def test_folder_behind_a_symlink_is_checked_too(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    hidden.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(hidden)
    with pytest.raises(SafetyError, match=rf"{link} \(-> {hidden}\), a folder above it, is wr"):
        check_scratch_dir(tmp_path / "link" / "scratch")


def test_make_scratch_dir_creates_folders_no_one_else_can_change(tmp_path):
    old = os.umask(0)
    try:
        made = safety.make_scratch_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert made == (tmp_path / "a" / "b").resolve()
    for folder in (tmp_path / "a", made):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert others_can_change(Path(made).stat(), os.geteuid()) is None
