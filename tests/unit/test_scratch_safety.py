"""scratch_dir must be a folder no other user can change, nor any folder above it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from luksbench.testbox import disksafety, safety, scratchsafety
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


def test_the_sudo_user_and_a_user_private_group_are_trusted(monkeypatch):
    """Run as root through sudo from alice's checkout: alice's folders (0755, or 0775 with her own
    private group, Debian's umask 002) are hers to change anyway; a shared group is not."""
    import grp
    import pwd

    alice = pwd.struct_passwd(("alice", "x", 1000, 1000, "", "/home/alice", "/bin/sh"))
    groups = {
        1000: grp.struct_group(("alice", "x", 1000, [])),
        1001: grp.struct_group(("staff", "x", 1001, ["bob"])),
    }
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: alice if uid == 1000 else pwd.getpwnam("root"))
    monkeypatch.setattr(grp, "getgrgid", lambda gid: groups[gid])
    home = os.stat_result((stat.S_IFDIR | 0o775, 1, 1, 2, 1000, 1000, 4096, 0, 0, 0))
    shared = os.stat_result((stat.S_IFDIR | 0o775, 1, 1, 2, 1000, 1001, 4096, 0, 0, 0))
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert "is owned by" in others_can_change(home, 0)
    monkeypatch.setenv("SUDO_UID", "1000")
    assert others_can_change(home, 0) is None
    assert "writable by its group" in others_can_change(shared, 0)


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


# --- backing files: the same file as created, by (st_dev, st_ino) --------------------------------


def test_check_same_file_accepts_the_created_file_only(tmp_path):
    from luksbench.testbox.backends.kernel import create_backing

    backing = tmp_path / "b.img"
    identity = create_backing(backing, 4096)
    st = os.lstat(backing)
    assert identity == [st.st_dev, st.st_ino] and st.st_size == 4096
    safety.check_same_file(backing, identity, "luksFormat it")

    backing.rename(tmp_path / "ours.img")  # kept: its inode number is not reused
    backing.write_bytes(bytes(4096))  # another regular file under the same name
    with pytest.raises(SafetyError, match=r"is no longer the file luksbench created.*luksFormat"):
        safety.check_same_file(backing, identity, "luksFormat it")
    backing.unlink()
    backing.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SafetyError, match=rf"is now a symlink to {tmp_path}/elsewhere, not"):
        safety.check_same_file(backing, identity, "luksFormat it")
    backing.unlink()
    with pytest.raises(SafetyError, match=r"is gone .*; refusing to luksFormat it"):
        safety.check_same_file(backing, identity, "luksFormat it")


def test_create_backing_never_writes_through_a_link(tmp_path):
    from luksbench.testbox.backends.kernel import create_backing

    target = tmp_path / "target"
    target.write_bytes(b"keep")
    link = tmp_path / "b.img"
    link.symlink_to(target)
    create_backing(link, 4096)  # the link is replaced, its target untouched
    assert not link.is_symlink() and target.read_bytes() == b"keep"


def test_recorded_files_are_checked_and_unrecorded_ones_skipped(tmp_path):
    from luksbench.testbox.backends.kernel import check_recorded_files, create_backing

    a, b = tmp_path / "a.img", tmp_path / "b.img"
    objects = [
        {"type": "backing_file", "path": str(a), "identity": create_backing(a, 4096)},
        {"type": "file", "path": str(b), "identity": create_backing(b, 4096)},
        {"type": "backing_file", "path": str(tmp_path / "none")},  # not created yet
    ]
    check_recorded_files(objects, "mkfs")
    b.unlink()
    b.symlink_to(a)
    with pytest.raises(SafetyError, match=rf"^{b} is now a symlink to {a}.*refusing to mkfs"):
        check_recorded_files(objects, "mkfs")


# --- loop table and open flags -------------------------------------------------------------------


def test_loop_entry_reads_losetups_padded_columns():
    entry = scratchsafety._loop_entry(
        {
            "name": "/dev/loop1",
            "back-file": "/srv/vm.img (deleted)",
            "back-ino": 94,
            "back-maj:min": "       254:0  ",
            "offset": 1048576,
        }
    )
    assert entry == {
        "name": "/dev/loop1",
        "back_file": "/srv/vm.img",
        "back": (os.makedev(254, 0), 94),
        "offset": 1048576,
    }
    assert scratchsafety._loop_entry({"name": "/dev/loop2", "back-file": None})["back"] is None


@pytest.mark.parametrize(
    ("flags", "writing"), [(os.O_RDONLY, False), (os.O_WRONLY, True), (os.O_RDWR, True)]
)
def test_open_for_writing_reads_fdinfo_flags(tmp_path, flags, writing):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        assert disksafety._open_for_writing(os.getpid(), f"/proc/{os.getpid()}/fd/{fd}") is writing
    finally:
        os.close(fd)


def test_opened_same_file_gives_the_created_file(tmp_path):
    from luksbench.testbox.backends.kernel import create_backing

    backing = tmp_path / "b.img"
    identity = create_backing(backing, 4096)
    with safety.opened_same_file(backing, identity, "luksFormat it") as fd:
        os.pwrite(fd, b"LUKS", 0)
    assert backing.read_bytes()[:4] == b"LUKS"


@pytest.mark.parametrize(
    ("replacement", "found"),
    [("link", "cannot be opened without following links"), ("file", "swapped while being opened")],
)
def test_opened_same_file_refuses_a_swap_after_its_check(tmp_path, monkeypatch, replacement, found):
    from luksbench.testbox.backends.kernel import create_backing

    backing, target = tmp_path / "b.img", tmp_path / "target"
    identity = create_backing(backing, 4096)
    target.write_bytes(b"keep")
    checked = safety.check_same_file

    def check_then_swap(path, ident, before):  # the swap lands between the check and the open
        checked(path, ident, before)
        backing.rename(tmp_path / "ours.img")  # kept: its inode number is not reused
        if replacement == "link":
            backing.symlink_to(target)
        else:
            backing.write_bytes(b"other")

    # opened_same_file checks through its own module
    monkeypatch.setattr(scratchsafety, "check_same_file", check_then_swap)
    ran = []
    with (
        pytest.raises(SafetyError, match=found),
        safety.opened_same_file(backing, identity, "luksFormat it"),
    ):
        ran.append(True)
    assert not ran and target.read_bytes() == b"keep"
