"""Raw-disk safety checks (safety.check_device / check_devices) against real loop devices.

Every test attaches its own loop devices over files in tmp_path and its fixture detaches them
(and unmounts, swaps off, kills holders, removes /dev/disk links) whatever happens. Each refusal
test asserts the specific finding in the message, so it fails when that one check is missing
(another check refusing for a different reason does not make it pass).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from luksbench.testbox import safety
from luksbench.testbox.safety import SafetyError, check_device, check_devices

pytestmark = pytest.mark.device

TOOLS = ("losetup", "wipefs", "blkid", "lsblk", "mkfs.ext4", "mkswap", "swapon", "partx")
BY_ID = Path("/dev/disk/by-id")
MIB = 1024 * 1024


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for d in ("/usr/sbin", "/sbin") if os.access(p := f"{d}/{name}", os.X_OK)), None
    )


@pytest.fixture(scope="module", autouse=True)
def _need_root_and_tools():
    missing = [t for t in TOOLS if _tool(t) is None]
    if missing or os.geteuid() != 0:
        pytest.fail(f"device safety tests need root and {TOOLS}; missing: {missing}", pytrace=False)


def sh(*argv: str) -> str:
    proc = subprocess.run(
        [_tool(argv[0]) or argv[0], *argv[1:]], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
    return proc.stdout


class Scratch:
    """Real block devices for one test; ``undo`` runs in reverse on teardown."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.undo: list = []

    def loop(self, size_mib: int = 32, *, name: str = "disk.img", mbr_partition=False) -> str:
        image = self.tmp / name
        with open(image, "wb") as f:
            f.truncate(size_mib * MIB)
            if mbr_partition:
                # One Linux partition from 1 MiB, 16 MiB long. This kernel has no MBR/GPT parser,
                # so partx adds it (BLKPG); losetup -P makes detaching drop it again.
                entry = struct.pack(
                    "<B3sB3sII", 0, b"\xff\xff\xfe", 0x83, b"\xff\xff\xfe", 2048, 32768
                )
                f.write(bytes(446) + entry + bytes(48) + b"\x55\xaa")
        argv = ["losetup", "--show", "-f", *(["-P"] if mbr_partition else []), str(image)]
        loop = sh(*argv).strip()
        self.undo.append(lambda: sh("losetup", "-d", loop))
        if mbr_partition:
            sh("partx", "-a", loop)
        return loop

    def mkfs(self, device: str) -> None:
        sh("mkfs.ext4", "-q", "-F", device)

    def mount(self, device: str) -> Path:
        mnt = self.tmp / f"mnt-{os.path.basename(device)}"
        mnt.mkdir()
        sh("mount", device, str(mnt))
        self.undo.append(lambda: sh("umount", str(mnt)))
        return mnt

    def swap(self, device: str) -> None:
        sh("mkswap", "-q", device)
        sh("swapon", device)
        self.undo.append(lambda: sh("swapoff", device))

    def hold_open(self, device: str, *, exclusive: bool) -> subprocess.Popen:
        """A child process with ``device`` open (O_EXCL or not) until teardown."""
        flags = "os.O_RDONLY | os.O_EXCL" if exclusive else "os.O_RDONLY"
        code = f"import os, sys; os.open({device!r}, {flags}); print('ready', flush=True); sys.stdin.read()"
        child = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

        def stop():
            child.stdin.close()
            child.wait(timeout=30)
            child.stdout.close()

        self.undo.append(stop)
        assert child.stdout.readline().strip() == "ready"
        return child

    def hold_file(self, path: Path, flags: int) -> subprocess.Popen:
        """A child process with ``path`` open with ``flags`` (os.O_RDWR, ...) until teardown."""
        code = f"import os, sys; os.open({str(path)!r}, {flags}); print('ready', flush=True); sys.stdin.read()"
        child = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

        def stop():
            child.stdin.close()
            child.wait(timeout=30)
            child.stdout.close()

        self.undo.append(stop)
        assert child.stdout.readline().strip() == "ready"
        return child

    def by_id_link(self, target: str) -> str:
        """A real /dev/disk/by-id link (relative, as udev makes them) to ``target``."""
        made = [d for d in (BY_ID.parent, BY_ID) if not d.exists()]
        BY_ID.mkdir(parents=True, exist_ok=True)
        link = BY_ID / f"luksbench-test-{secrets.token_hex(6)}"
        link.symlink_to(os.path.relpath(target, BY_ID))

        def remove():
            link.unlink()
            for d in reversed(made):
                with contextlib.suppress(OSError):  # someone else may have put links there
                    d.rmdir()

        self.undo.append(remove)
        return str(link)

    def teardown(self) -> None:
        errors = []
        for step in reversed(self.undo):
            try:
                step()
            except Exception as exc:  # keep undoing; report all at the end
                errors.append(exc)
        assert not errors, errors


@pytest.fixture
def box(tmp_path):
    scratch = Scratch(tmp_path)
    yield scratch
    scratch.teardown()


def loop_spec(device: str, **extra) -> dict:
    return {"path": device, "allow_unstable_path": True, **extra}


# --- accepted, and described ---------------------------------------------------------------------


def test_blank_loop_device_is_accepted_and_described(box):
    loop = box.loop(32)
    image = os.path.realpath(box.tmp / "disk.img")
    rdev = os.stat(loop).st_rdev

    d = check_device("d0", loop_spec(loop))

    assert d["name"] == "d0" and d["path"] == loop and d["resolved"] == loop
    assert d["kernel_name"] == os.path.basename(loop) == d["whole_disk"]
    assert d["major_minor"] == f"{os.major(rdev)}:{os.minor(rdev)}"
    assert d["size_bytes"] == 32 * MIB
    assert d["serial"] == image == safety.device_serial(loop)  # loop: the backing file
    assert d["signatures"] == [] and d["wipe_confirmed"] is False
    assert d["is_partition"] is False and d["read_only"] is False
    assert d["logical_block_size"] == 512 and d["physical_block_size"] >= 512
    assert isinstance(d["rotational"], bool)


def test_partition_is_described_with_its_disks_serial(box):
    loop = box.loop(32, mbr_partition=True)
    part = f"{loop}p1"

    d = check_device("p", loop_spec(part))

    assert d["is_partition"] is True and d["whole_disk"] == os.path.basename(loop)
    assert d["size_bytes"] == 16 * MIB
    assert d["serial"] == os.path.realpath(box.tmp / "disk.img")
    assert d["logical_block_size"] == 512  # from the disk's queue/: partitions have none


# --- stable paths --------------------------------------------------------------------------------


def test_unstable_paths_are_refused(box):
    loop = box.loop()
    with pytest.raises(SafetyError, match=r"^devices\.d0: path /dev/loop\d+ is not a stable") as e:
        check_device("d0", {"path": loop})
    assert "/dev/disk/by-id/" in str(e.value) and "allow_unstable_path: true" in str(e.value)
    # A prefix check alone would take these: '..' climbs out, by-uuid names the filesystem.
    for path in (f"/dev/disk/by-id/../../{os.path.basename(loop)}", "/dev/disk/by-uuid/1234"):
        with pytest.raises(SafetyError, match="is not a stable name"):
            check_device("d0", {"path": path})


def test_by_id_link_is_accepted_and_suggested(box):
    loop = box.loop()
    link = box.by_id_link(loop)

    d = check_device("nvme0", {"path": link, "wipe_serial": "", "allow_unstable_path": False})

    assert d["path"] == link and d["resolved"] == loop
    with pytest.raises(SafetyError, match=f"links to it here: {link}"):
        check_device("nvme0", {"path": loop})


def test_missing_path_is_refused(box):
    missing = f"/dev/disk/by-id/luksbench-test-missing-{secrets.token_hex(4)}"
    with pytest.raises(SafetyError, match=rf"^devices\.d0: path {missing} does not exist"):
        check_device("d0", {"path": missing})
    dangling = box.by_id_link("/dev/luksbench-no-such-disk")
    with pytest.raises(
        SafetyError, match=rf"{dangling} does not exist \(a symlink to \.\./\.\./luksb"
    ):
        check_device("d0", {"path": dangling})


def test_regular_file_is_refused(tmp_path):
    image = tmp_path / "disk.img"
    image.write_bytes(bytes(4096))
    with pytest.raises(SafetyError, match=r"^devices\.d0: .* is a regular file, not a block dev"):
        check_device("d0", loop_spec(str(image)))


def test_unattached_loop_device_is_refused():
    free = sh("losetup", "-f").strip()  # not attached: size 0
    with pytest.raises(SafetyError, match=rf"^devices\.d0: {free} has size 0"):
        check_device("d0", loop_spec(free))


# --- signatures and wipe_serial ------------------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_signature_refused_unless_wipe_serial_names_the_disk(box):
    loop = box.loop()
    box.mkfs(loop)
    image = box.tmp / "disk.img"
    serial = os.path.realpath(image)
    before = _digest(image)

    with pytest.raises(SafetyError) as e:
        check_device("d0", loop_spec(loop))
    message = str(e.value)
    assert message.startswith("devices.d0: ") and "is not blank, it carries ext4" in message
    assert "offset 0x438" in message and f"wipe_serial: {serial!r}" in message

    d = check_device("d0", loop_spec(loop, wipe_serial=serial))
    assert d["wipe_confirmed"] is True
    assert [(s["type"], s["offset"]) for s in d["signatures"]] == [("ext4", "0x438")]

    wrong = serial + ".other"
    with pytest.raises(SafetyError, match="wipe_serial") as e:
        check_device("d0", loop_spec(loop, wipe_serial=wrong))
    assert repr(wrong) in str(e.value) and f"has serial {serial!r}" in str(e.value)

    assert _digest(image) == before  # checking read only


def test_wrong_wipe_serial_is_refused_on_a_blank_disk_too(box):
    # A serial that does not match means the path is not the disk the user confirmed.
    loop = box.loop()
    with pytest.raises(SafetyError, match="has serial"):
        check_device("d0", loop_spec(loop, wipe_serial="S64FNE0R123456"))


def test_partition_signatures_are_listed_for_the_whole_disk(box):
    loop = box.loop(32, mbr_partition=True)
    box.mkfs(f"{loop}p1")
    found = safety.device_signatures(loop)
    assert {"type": "dos", "offset": "0x1fe"} in found
    assert any(
        s["type"] == "ext4" and s.get("partition") == f"{os.path.basename(loop)}p1" for s in found
    )


# --- mounted, swap, held, in use -----------------------------------------------------------------


def test_mounted_device_is_refused_naming_the_mountpoint(box):
    loop = box.loop()
    box.mkfs(loop)
    mnt = box.mount(loop)
    serial = os.path.realpath(box.tmp / "disk.img")

    assert safety.device_mounts(loop) == [str(mnt)]
    with pytest.raises(SafetyError, match=rf"^devices\.d0: .* is mounted at {mnt};"):
        check_device("d0", loop_spec(loop, wipe_serial=serial))


def test_mounted_partition_refuses_its_whole_disk(box):
    loop = box.loop(32, mbr_partition=True)
    box.mkfs(f"{loop}p1")
    mnt = box.mount(f"{loop}p1")
    serial = os.path.realpath(box.tmp / "disk.img")

    with pytest.raises(SafetyError, match=rf"is mounted at {mnt};"):
        check_device("d0", loop_spec(loop, wipe_serial=serial))


def test_active_swap_is_refused(box):
    loop = box.loop()
    box.swap(loop)
    serial = os.path.realpath(box.tmp / "disk.img")

    assert safety.device_mounts(loop) == ["[swap]"]
    with pytest.raises(SafetyError, match="is mounted as swap"):
        check_device("d0", loop_spec(loop, wipe_serial=serial))


def test_holders_are_empty_on_real_devices(box):
    # Holders (dm, md, bcache stacked on the disk) cannot be made on this kernel: it has neither
    # device-mapper nor MD. The refusal is proven in the VM test (tests/vm), which has both;
    # here device_holders reads the real sysfs of a disk and of a disk with a partition.
    loop = box.loop(32, mbr_partition=True)
    assert safety.device_holders(loop) == []
    assert safety.device_holders(f"{loop}p1") == []


def test_kernel_claim_is_in_use_without_any_process(box):
    # A mounted filesystem claims the device (O_EXCL gives EBUSY) while no process has it open:
    # only the exclusive-open probe sees this (e.g. a mount in another mount namespace).
    loop = box.loop()
    box.mkfs(loop)
    box.mount(loop)
    assert safety.processes_using_device(loop) == []
    busy = safety.device_in_use(loop)
    assert busy is not None and "claimed exclusively" in busy


def test_exclusive_opener_is_refused(box):
    loop = box.loop()
    child = box.hold_open(loop, exclusive=True)
    with pytest.raises(
        SafetyError, match=r"^devices\.d0: /dev/loop\d+ is in use: claimed exclu"
    ) as e:
        check_device("d0", loop_spec(loop))
    assert f"pid {child.pid} (python" in str(e.value)


def test_plain_opener_is_refused(box):
    # Not O_EXCL (fio, dd): only the /proc scan sees it.
    loop = box.loop(mbr_partition=True)
    child = box.hold_open(f"{loop}p1", exclusive=False)
    assert safety.processes_using_device(loop) == [child.pid]
    with pytest.raises(SafetyError, match=rf"is in use: open by pid {child.pid} \(python"):
        check_device("d0", loop_spec(loop))


# --- the allowlist as a whole --------------------------------------------------------------------


def test_same_device_under_two_names_is_refused(box):
    loop = box.loop()
    link = box.by_id_link(loop)
    with pytest.raises(SafetyError, match=r"^devices\.b: .* and devices\.a .* same block device"):
        check_devices({"a": loop_spec(loop), "b": {"path": link}})


def test_disk_and_its_partition_are_refused(box):
    loop = box.loop(32, mbr_partition=True)
    serial = os.path.realpath(box.tmp / "disk.img")  # the partition table is a signature
    with pytest.raises(SafetyError, match=r"^devices\.p: .*p1 is a partition of devices\.d"):
        check_devices({"d": loop_spec(loop, wipe_serial=serial), "p": loop_spec(f"{loop}p1")})


def test_check_devices_checks_paths_and_skips_scratch_files(box):
    a, b = box.loop(name="a.img"), box.loop(name="b.img")
    described = check_devices({"a": loop_spec(a), "s": {"size_mib": 64}, "b": loop_spec(b)})
    assert sorted(described) == ["a", "b"]
    assert described["b"]["resolved"] == b
    with pytest.raises(SafetyError, match=r"^devices\.x needs exactly one of 'path'"):
        check_devices({"x": {"path": a, "size_mib": 64}})
    box.mkfs(b)
    with pytest.raises(SafetyError, match=r"^devices\.b: .* carries ext4"):
        check_devices({"a": loop_spec(a), "b": loop_spec(b)})


# --- content in use through another loop device, writers of the backing file, read-only ---------


def _attach(box, *args: str) -> str:
    """``losetup --show -f <args>``, detached at teardown."""
    loop = sh("losetup", "--show", "-f", *args).strip()
    box.undo.append(lambda: sh("losetup", "-d", loop))
    return loop


def test_blank_looking_device_whose_content_backs_a_mounted_loop_is_refused(box):
    # The ext4 sits 1 MiB into the device: wipefs sees a blank device, nothing holds or claims
    # it, no process has it open; only the other loop device's backing file shows the use.
    loop = box.loop(32)
    inner = _attach(box, "-o", str(MIB), loop)
    box.mkfs(inner)
    mnt = box.mount(inner)
    image = box.tmp / "disk.img"
    before = _digest(image)
    assert safety.device_signatures(loop) == [] and safety.device_in_use(loop) is None

    with pytest.raises(SafetyError) as e:
        check_device("d0", loop_spec(loop))

    message = str(e.value)
    assert message.startswith(f"devices.d0: {loop} (or a partition of it) backs other loop dev")
    assert f"{inner} (over it at offset {MIB}, mounted at {mnt})" in message
    assert _digest(image) == before


def test_loop_device_sharing_its_backing_file_with_a_mounted_loop_is_refused(box):
    loop = box.loop(32)
    image = box.tmp / "disk.img"
    other = _attach(box, "-o", str(MIB), str(image))
    box.mkfs(other)
    mnt = box.mount(other)
    before = _digest(image)

    with pytest.raises(SafetyError, match=r"backs other loop devices") as e:
        check_device("d0", loop_spec(loop))

    over = f"{other} (over its backing file {os.path.realpath(image)} at offset {MIB}, mounted"
    assert f"{over} at {mnt})" in str(e.value)
    assert _digest(image) == before


def test_loop_device_whose_backing_file_is_open_for_writing_is_refused(box):
    loop = box.loop(32)
    image = box.tmp / "disk.img"
    writer = box.hold_file(image, os.O_RDWR)  # a VM with its disk image open
    before = _digest(image)

    with pytest.raises(SafetyError) as e:
        check_device("d0", loop_spec(loop))

    assert str(e.value).startswith(
        f"devices.d0: {loop} is a loop device whose backing file {os.path.realpath(image)} is "
        f"open for writing by pid {writer.pid} (python"
    )
    assert _digest(image) == before


def test_backing_file_open_only_for_reading_does_not_refuse(box):
    loop = box.loop(32)
    reader = box.hold_file(box.tmp / "disk.img", os.O_RDONLY)
    assert safety.backing_file_writers(loop) == (os.path.realpath(box.tmp / "disk.img"), [])
    assert reader.poll() is None
    assert check_device("d0", loop_spec(loop))["read_only"] is False


def test_read_only_loop_device_is_refused(box):
    image = box.tmp / "ro.img"
    image.write_bytes(bytes(16 * MIB))
    loop = _attach(box, "-r", str(image))

    with pytest.raises(SafetyError) as e:
        check_device("d0", loop_spec(loop))

    name = os.path.basename(loop)
    assert str(e.value).startswith(
        f"devices.d0: {loop} is read-only (/sys/class/block/{name}/ro is 1)"
    )
