"""Environment capture: what machine this is, which tools it has, which backend a plan gets
(env.json), and the verbatim ``cryptsetup benchmark``; where that cannot run a stack's cipher
(no AF_ALG), ``openssl speed`` of the same cipher in userspace. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

from luksbench.formats import opensslspeed
from luksbench.formats.cryptsetup import CryptsetupParseError, parse_cryptsetup_text
from luksbench.formats.layout import Workload
from luksbench.testbox import jobs
from luksbench.testbox.backends.choose import resolve_plan_backend
from luksbench.testbox.planbuild import NULL_CIPHERS, cell_options, plan_layers
from luksbench.testbox.sysinfo import VULNERABILITIES, capture_system, cpu_vulnerabilities
from luksbench.testbox.sysutil import (
    TestboxError,
    log,
    read_text,
    run_quiet,
    tool_env,
    utc_now,
    which,
    write_atomic,
)

TOOLS = ("fio", "cryptsetup", "qemu-storage-daemon", "losetup", "dmsetup", "fusermount3")


def tool_version(tool: str) -> str | None:
    """First line of ``TOOL --version``."""
    path = which(tool)
    if path is None:
        return None
    if tool == "dmsetup" and not os.path.exists("/dev/mapper/control"):
        # Even `dmsetup --version` mknods /dev/mapper/control; leave machines without DM alone.
        return f"{path} (version not probed: no /dev/mapper/control)"
    proc = run_quiet([path, "--version"])
    text = (proc.stdout or proc.stderr).strip() if proc is not None else ""
    return text.splitlines()[0] if text else None


def tool_versions() -> dict:
    versions = {tool: tool_version(tool) for tool in TOOLS}
    versions["python"] = sys.version.split()[0]
    return versions


def _cpuinfo() -> dict:
    info: dict = {}
    wanted = ("model name", "flags", "Features", "vendor_id", "microcode")
    for line in (read_text("/proc/cpuinfo") or "").splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key in wanted and key not in info:
            info[key] = value.strip()
    return info


def _meminfo() -> dict:
    out = {}
    for line in (read_text("/proc/meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("MemTotal", "MemAvailable", "SwapTotal"):
            with contextlib.suppress(ValueError, IndexError):  # a bad line: not recorded
                out[key] = int(value.split()[0]) * 1024  # "<n> kB"
    return out


def _kernel_crypto(names: tuple[str, ...] = ("xts(aes)", "aes", "cbc(aes)")) -> list[dict]:
    """Kernel crypto drivers for the ciphers dm-crypt would use, with priorities."""
    found = []
    for block in (read_text("/proc/crypto") or "").split("\n\n"):
        fields = [line.partition(":") for line in block.splitlines()]
        entry = {key.strip(): value.strip() for key, _, value in fields}
        if entry.get("name") in names:
            keys = ("name", "driver", "module", "priority", "type")
            found.append({k: entry.get(k) for k in keys})
    return found


def capture_env(plan: dict) -> dict:
    cpu = _cpuinfo()
    flags = (cpu.get("flags") or cpu.get("Features") or "").split()
    uname = os.uname()
    # Identify the configured disks; with none (scratch files only) every disk lsblk lists.
    configured = (plan.get("devices") or {}).values()
    disks = [d["path"] for d in configured if isinstance(d, dict) and d.get("path")]
    scratch = [plan["scratch_dir"]] if plan.get("scratch_dir") else None
    return {
        "captured": utc_now(),
        "hostname": socket.gethostname(),
        "kernel": {k: getattr(uname, k) for k in ("sysname", "release", "version", "machine")},
        "cmdline": read_text("/proc/cmdline"),
        "cpu": {
            "model": cpu.get("model name"),
            "vendor": cpu.get("vendor_id"),
            "microcode": cpu.get("microcode"),
            "count": os.cpu_count(),
            **{flag: flag in flags for flag in ("aes", "vaes", "avx2", "avx512f", "vpclmulqdq")},
            "flags": flags,
        },
        "memory_bytes": _meminfo(),
        "mitigations": cpu_vulnerabilities() if os.path.isdir(VULNERABILITIES) else {},
        "kernel_crypto": _kernel_crypto(),
        "tools": tool_versions(),
        "backend": resolve_plan_backend(plan),
        "euid": os.geteuid(),
        "system": capture_system(devices=disks or None, paths=scratch),
        "job_devices": jobs.device_facts(plan, cell_options(plan, Workload("read", 4096, 1))),
        "plan": dict(plan),
    }


def benchmark_ciphers(out: Path, extra_args: list[str] | None = None) -> int:
    """Run ``cryptsetup benchmark`` with its output verbatim into ``out``; returns its exit code
    (non-zero, e.g. for ciphers the kernel lacks, is logged, not a failure)."""
    cryptsetup = which("cryptsetup")
    if cryptsetup is None:
        raise TestboxError("cryptsetup is not installed; cannot run `cryptsetup benchmark`")
    argv = [cryptsetup, "benchmark", *(extra_args or [])]
    log(f"luksbench testbox: running {' '.join(argv[1:])} (takes ~15 s) ...")
    proc = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, env=tool_env()
    )
    write_atomic(Path(out), proc.stdout)
    log(f"luksbench testbox: cryptsetup benchmark exit code {proc.returncode}; output in {out}")
    return proc.returncode


def plan_ciphers(plan: dict) -> list[tuple[str, int]]:
    """(cipher, key bits) of every luks layer of the plan, in plan order, the null cipher left out."""
    found = []
    for layer in plan_layers(plan):
        if layer.get("kind") != "luks":
            continue
        cipher = str(layer["cipher"])
        pair = (cipher, int(layer["key_bits"]))
        if cipher not in NULL_CIPHERS and pair not in found:
            found.append(pair)
    return found


def _kernel_measured(cryptsetup_text: str) -> set[tuple[str, int]]:
    """(algorithm, key bits) that ``cryptsetup benchmark`` measured."""
    try:
        rows = parse_cryptsetup_text(cryptsetup_text)
    except CryptsetupParseError:
        return set()
    return {
        (str(r["algorithm"]).lower(), int(r["key_bits"]))
        for r in rows
        if r["kind"] == "cipher" and r["available"] and r["key_bits"] is not None
    }


def _openssl_section(openssl: str, cipher: str, key_bits: int, evp: str, direction: str) -> str:
    argv = opensslspeed.speed_argv(openssl, evp, direction)
    # LC_ALL=C: one spelling of numbers and messages whatever the box's locale.
    env = {**os.environ, "LC_ALL": "C"}
    proc = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, check=False, timeout=120
    )
    out = proc.stdout.decode("utf-8", errors="replace")
    return opensslspeed.section(cipher, key_bits, evp, direction, proc.returncode, out)


def benchmark_ciphers_userspace(plan: dict, cryptsetup_text: str, out: Path) -> list[str]:
    """``openssl speed`` of each plan cipher that ``cryptsetup benchmark`` did not measure (no
    AF_ALG, a cipher it skipped) into ``out``; returns the EVP ciphers measured (none: no file).
    A cipher OpenSSL has no equivalent of is logged and left out."""
    measured = _kernel_measured(cryptsetup_text)
    wanted = []
    for cipher, key_bits in plan_ciphers(plan):
        if (opensslspeed.benchmark_algorithm(cipher), key_bits) in measured:
            continue
        evp = opensslspeed.evp_name(cipher, key_bits)
        if evp is None:
            log(
                f"luksbench testbox: no userspace estimate for {cipher} {key_bits}-bit (no OpenSSL equivalent)"
            )
        else:
            wanted.append((cipher, key_bits, evp))
    openssl = which("openssl")
    if Path(out).exists():
        log(f"luksbench testbox: {out} exists and is kept (raw results are never overwritten)")
        return []
    if not wanted or openssl is None:
        if wanted:
            log("luksbench testbox: openssl is not installed; no userspace cipher estimate")
        return []
    log(f"luksbench testbox: openssl speed for {', '.join(w[2] for w in wanted)} (~12 s each) ...")
    probe = run_quiet([openssl, "version"])
    version = (probe.stdout.strip() if probe else "") or "unknown"
    text = opensslspeed.file_header(version)
    for cipher, key_bits, evp in wanted:
        for direction in opensslspeed.DIRECTIONS:
            text += _openssl_section(openssl, cipher, key_bits, evp, direction)
    write_atomic(Path(out), text)
    log(f"luksbench testbox: userspace cipher estimate in {out}")
    return [w[2] for w in wanted]
