"""``<host>/env.json``: the environment document, written once per host by ``luksbench testbox
capture-env``, read by ingest (the env table and the tables of its plan; the other keys stay in
the raw file)::

    {"version": 2, "captured": "<ISO time, UTC>", "hostname": "...",
     "kernel": {"sysname", "release", "version", "machine"}, "cmdline": "...",
     "cpu": {"model", "vendor", "microcode", "count", "aes", "vaes", "avx2", "avx512f",
             "vpclmulqdq", "flags": [...]},
     "memory_bytes": {...}, "mitigations": {...}, "kernel_crypto": [...],
     "tools": {"fio": "<first line of --version>", "cryptsetup": ..., "qemu-storage-daemon": ...,
               ...},                                   # null: not installed
     "backend": {"requested", "selected", "reason", ...},
     "euid": 0, "system": {...}, "plan": {...},       # the plan it was captured with
     "job_devices": [{"device", "block_device", "numa_node", "queues", "scheduler", "io_poll",
                      "nvme_poll_queues", "job_cpus"}]}   # per disk; job_cpus "" = any CPU

Fleet servers (fio client/server mode) get no env.json; ingest gives them a row naming their
``coordinator``.

Version 1 (no ``version``) is the same document; readers take the keys they know and leave
the others (a capture records whatever the system offers). Standard library only: the test box
imports this.
"""

from __future__ import annotations

from pathlib import Path

from luksbench.formats.layout import read_json_object
from luksbench.formats.record import record_version, write_record

ENV_VERSION = 2
ENV_VERSIONS = (1, 2)


def read_env(path: Path) -> dict:
    """The one reader of an env.json: its document as the current version's (ValueError when it
    is no JSON object; RecordVersionError, naming the file, for an unknown version)."""
    return migrated_env(read_json_object(path), str(path))


def migrated_env(doc: dict, source: str = "env.json") -> dict:
    """An environment document of any known version as the current one's: version 1 is version 2
    without the field."""
    record_version(doc, source, "environment (env.json)", ENV_VERSIONS)
    return {**doc, "version": ENV_VERSION}


def write_env(path: Path, doc: dict) -> None:
    """The one writer of an env.json."""
    write_record(path, doc, ENV_VERSION)


def _text(value) -> str | None:
    return None if value is None or value == "" else str(value).strip().splitlines()[0]


def _flag(cpu: dict, name: str) -> bool | None:
    value = cpu.get(name)
    return None if value is None else bool(value)


def env_facts(doc: dict) -> dict:
    """The key facts of one environment document (None where it does not record them)."""
    parts = ("cpu", "kernel", "backend", "tools")
    cpu, kernel, backend, tools = (v if isinstance(v := doc.get(k), dict) else {} for k in parts)
    count = cpu.get("count")
    return {
        "hostname": _text(doc.get("hostname")),
        "kernel": _text(kernel.get("release")),
        "cpu_model": _text(cpu.get("model")),
        "cpu_count": count if isinstance(count, int) and not isinstance(count, bool) else None,
        "aes": _flag(cpu, "aes"),
        "vaes": _flag(cpu, "vaes"),
        "backend": _text(backend.get("selected")),
        "backend_reason": _text(backend.get("reason")),
        "fio_version": _text(tools.get("fio")),
        "cryptsetup_version": _text(tools.get("cryptsetup")),
        "qemu_version": _text(tools.get("qemu-storage-daemon")),
    }


def env_plan(doc: dict) -> dict:
    """The plan the environment was captured with ({} when not recorded)."""
    plan = doc.get("plan")
    return plan if isinstance(plan, dict) else {}
