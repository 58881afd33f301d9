"""The kernel backend's tools: the command lines it runs (pure functions, unit-tested), what the
kernel and cryptsetup support, and what they report back (status, tables, /proc/mdstat).
Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import struct
from pathlib import Path

from luksbench.testbox.planbuild import NULL_CIPHERS
from luksbench.testbox.sysinfo import strip_dm_table_keys
from luksbench.testbox.sysutil import TestboxError, run_quiet, run_tool

BLKGETSIZE64 = 0x80081272
# dm-crypt target versions that brought the optional parameters (kernel 4.0, 5.9 and 6.10).
PERF_FLAG_MIN_CRYPT_VERSION = {
    "same_cpu_crypt": (1, 14, 0),
    "submit_from_crypt_cpus": (1, 14, 0),
    "no_read_workqueue": (1, 22, 0),
    "no_write_workqueue": (1, 22, 0),
    "high_priority": (1, 26, 0),
}
# Our arrays are /dev/md120 and up, skipping numbers in use: clear of the low numbers a system's
# own arrays usually have (mdadm's automatic names count down from md127).
MD_FIRST_MINOR = 120


def device_size(path: str | Path) -> int:
    """Size in bytes of a block device (BLKGETSIZE64) or regular file."""
    st = os.stat(path)
    if stat.S_ISBLK(st.st_mode):
        fd = os.open(path, os.O_RDONLY)
        try:
            buf = fcntl.ioctl(fd, BLKGETSIZE64, b"\0" * 8)
        finally:
            os.close(fd)
        return struct.unpack("Q", buf)[0]
    return st.st_size


# --- command lines (pure functions; unit-tested) -------------------------------------------------


def losetup_argv(backing: str | Path) -> list[str]:
    return ["losetup", "--direct-io=on", "--show", "-f", str(backing)]


def luks_facts(cfg: dict, luks_type: str, sector: int) -> dict:
    """How a luks layer is formatted, as its description records it."""
    return {
        "cipher": cfg["cipher"],
        "key_bits": int(cfg["key_bits"]),
        "hash": cfg["hash"],
        "luks_type": luks_type,
        "luks_type_requested": cfg["luks_type"],
        "sector_size": sector,
        "pbkdf": "pbkdf2",
        "pbkdf_iterations": int(cfg["pbkdf_iterations"]),
    }


def luks_format_argv(
    cfg: dict, target: str | Path, key_file: str | Path, luks_type: str
) -> list[str]:
    facts = luks_facts(cfg, luks_type, int(cfg["sector_size"]))
    cipher = str(facts["cipher"])
    argv = ["cryptsetup", "luksFormat", "--batch-mode", "--type", luks_type, "--cipher", cipher]
    argv += ["--key-size", str(facts["key_bits"]), "--hash", str(facts["hash"])]
    if luks_type == "luks2":
        argv += ["--sector-size", str(facts["sector_size"])]
        if cipher in NULL_CIPHERS:
            # The null arm encrypts nothing; its key slot still needs a real cipher.
            argv += ["--keyslot-cipher", "aes-xts-plain64", "--keyslot-key-size", "512"]
    argv += ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", str(facts["pbkdf_iterations"])]
    return [*argv, "--key-file", str(key_file), str(target)]


def luks_dump(device: str | Path, key_file: str | Path, stack: str) -> str:
    """``cryptsetup luksDump``, refused if it holds the key (it prints none: belt and braces)."""
    dump = run_tool(["cryptsetup", "luksDump", str(device)], f"stack {stack}: luksDump").stdout
    if Path(key_file).read_text() in dump:
        raise TestboxError(f"stack {stack}: luksDump output contains key material")
    return dump


def luks_open_argv(
    device: str | Path,
    name: str,
    key_file: str | Path,
    perf_flags: list[str] | None = None,
    allow_discards: bool = False,
) -> list[str]:
    """``cryptsetup open``; ``allow_discards`` passes TRIM through to the device below, as
    ceph-volume opens an encrypted OSD's device."""
    argv = ["cryptsetup", "open", "--type", "luks", *[f"--perf-{f}" for f in perf_flags or []]]
    argv += ["--allow-discards"] if allow_discards else []
    return [*argv, "--key-file", str(key_file), str(device), name]


def mdadm_create_argv(device: str, level: int, chunk_kib: int, members: list[str]) -> list[str]:
    # --assume-clean: no initial resync competing with the measurements (parity is computed on
    # write anyway); --run: no interactive confirmation.
    argv = ["mdadm", "--create", device, "--run", "--assume-clean", "--metadata=1.2"]
    argv += [f"--level={level}", f"--raid-devices={len(members)}", f"--chunk={chunk_kib}"]
    return [*argv, *members]


def mkfs_argv(fstype: str, device: str) -> list[str]:
    if fstype == "ext4":
        # Initialise inode tables and journal now, not lazily in the background during the runs.
        return ["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", device]
    if fstype == "xfs":
        return ["mkfs.xfs", "-f", "-q", device]
    raise TestboxError(f"unsupported fstype {fstype!r}")


# --- what the kernel and cryptsetup support ------------------------------------------------------


def crypt_target_version() -> tuple[int, ...] | None:
    """dm-crypt target version from ``dmsetup targets`` (None when unknown)."""
    proc = run_quiet(["dmsetup", "targets"])
    for line in proc.stdout.splitlines() if proc is not None and proc.returncode == 0 else []:
        parts = line.split()
        if parts[:1] == ["crypt"] and len(parts) > 1:
            with contextlib.suppress(ValueError):
                return tuple(int(x) for x in parts[1].lstrip("v").split("."))
    return None


def cryptsetup_perf_flags() -> set[str]:
    proc = run_quiet(["cryptsetup", "--help"])
    text = proc.stdout if proc is not None else ""
    return {flag for flag in PERF_FLAG_MIN_CRYPT_VERSION if f"--perf-{flag}" in text}


def usable_perf_flags(
    wanted: list[str], cryptsetup_flags: set[str], crypt_version: tuple[int, ...] | None
) -> tuple[list[str], dict[str, str]]:
    """Split the requested perf flags into (applied, {skipped: reason})."""
    applied, skipped = [], {}
    for flag in wanted:
        need = PERF_FLAG_MIN_CRYPT_VERSION[flag]
        if flag not in cryptsetup_flags:
            skipped[flag] = f"this cryptsetup has no --perf-{flag}"
        elif crypt_version is not None and crypt_version < need:
            have, since = (".".join(map(str, v)) for v in (crypt_version, need))
            skipped[flag] = f"dm-crypt target v{have} is older than v{since}, which brought {flag}"
        else:
            applied.append(flag)
    return applied, skipped


def parse_cryptsetup_status(text: str) -> dict:
    """``cryptsetup status NAME`` -> {type, cipher, keysize_bits, device, sector_size,
    offset_sectors, size_sectors, flags}."""
    out: dict = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        number = re.match(r"(\d+)", value)
        if key == "offset" and number:
            out["offset_sectors"] = int(number.group(1))
        elif key == "size" and number:
            out["size_sectors"] = int(number.group(1))
        elif key == "keysize" and number:
            out["keysize_bits"] = int(number.group(1))
        elif key == "sector size" and number:
            out["sector_size"] = int(number.group(1))
        elif key in ("type", "cipher", "device", "mode", "flags"):
            out[key] = value
    return out


def dm_table(name: str) -> str | None:
    proc = run_quiet(["dmsetup", "table", name])
    ok = proc is not None and proc.returncode == 0
    return strip_dm_table_keys(proc.stdout.strip()) if ok else None


def free_md_device() -> str:
    for minor in range(MD_FIRST_MINOR, 1 << 20):
        if not os.path.exists(f"/sys/block/md{minor}") and not os.path.exists(f"/dev/md{minor}"):
            return f"/dev/md{minor}"
    raise TestboxError("no free md device number")


def mdstat() -> str | None:
    try:
        return Path("/proc/mdstat").read_text()
    except OSError:
        return None
