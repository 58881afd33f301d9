"""``openssl-speed.txt``: the userspace cipher estimate where ``cryptsetup benchmark`` cannot run
the kernel's ciphers (no AF_ALG), one section per LUKS cipher, key size and direction.

Standard library only: the test box writes it, ingest reads it. The file::

    # luksbench openssl-speed 1
    # openssl: OpenSSL 3.0.19 27 Jan 2026 (Library: OpenSSL 3.0.19 27 Jan 2026)
    ## cipher=aes-xts-plain64 key_bits=512 evp=aes-256-xts direction=encryption exit=0
    <openssl speed -mr output, verbatim>
    ## cipher=aes-xts-plain64 key_bits=512 evp=aes-256-xts direction=decryption exit=0
    ...

``openssl speed -mr`` (machine-readable, the same in every locale; run with ``LC_ALL=C``) ends with
``+H:<block sizes>`` and ``+F:<n>:<name>:<bytes per second per block size>``. Throughput is per
core: ``speed`` runs one process and divides by its CPU time.
"""

from __future__ import annotations

import re
from pathlib import Path

from luksbench.formats.layout import read_raw_file

OPENSSL_SPEED_FILE = "openssl-speed.txt"
FORMAT = "luksbench openssl-speed"
VERSION = 1
DIRECTIONS = ("encryption", "decryption")
SOURCE = "userspace estimate (openssl)"

OPENSSL_SPEED_COLUMNS = [
    "file",
    "cipher",  # the LUKS cipher spec: aes-xts-plain64
    "algorithm",  # as `cryptsetup benchmark` names it: aes-xts
    "key_bits",  # the LUKS key size (XTS: both halves), as `cryptsetup benchmark` gives it
    "evp",  # the OpenSSL cipher measured: aes-256-xts
    "direction",  # encryption | decryption
    "block_bytes",
    "mib_s",  # MiB/s on one core
    "available",
    "note",
    "openssl_version",
]

_MODES = ("xts", "cbc", "ecb", "ctr")
_HEADER = re.compile(r"^# luksbench openssl-speed (?P<version>\d+)\s*$")
_SECTION = re.compile(r"^## (?P<fields>(?:\w+=\S*\s*)+)$")
_VERSION_LINE = re.compile(r"^# openssl: (?P<version>.*)$")


class OpensslSpeedParseError(ValueError):
    """A file that is not luksbench's ``openssl-speed.txt``; the message names the file."""


def benchmark_algorithm(cipher: str | None) -> str | None:
    """LUKS cipher spec -> ``cryptsetup benchmark``'s algorithm: aes-xts-plain64 -> aes-xts."""
    if not cipher:
        return None
    parts = str(cipher).lower().split("-")
    return "-".join(parts[:2]) if len(parts) >= 2 else parts[0]


def evp_name(cipher: str, key_bits: int) -> str | None:
    """The OpenSSL EVP cipher of a LUKS cipher spec and key size, or None without one.

    XTS keys hold two AES keys (aes-xts-plain64 with 512 bits is aes-256-xts); the IV generator
    (plain64, essiv:sha256) is not part of it. AES and Camellia only: serpent, twofish, adiantum
    and the null cipher have no EVP equivalent to compare with."""
    algorithm = benchmark_algorithm(cipher) or ""
    block, _, mode = algorithm.partition("-")
    if block not in ("aes", "camellia") or mode not in _MODES:
        return None
    bits = key_bits // 2 if mode == "xts" else key_bits
    allowed = (128, 256) if mode == "xts" else (128, 192, 256)
    if bits not in allowed or (block == "camellia" and mode == "xts"):
        return None
    return f"{block}-{bits}-{mode}"


def speed_argv(openssl: str, evp: str, direction: str, seconds: int = 1) -> list[str]:
    """The ``openssl speed`` command for one cipher and direction (run it with ``LC_ALL=C``)."""
    argv = [openssl, "speed", "-mr", "-seconds", str(seconds)]
    return argv + (["-decrypt"] if direction == "decryption" else []) + ["-evp", evp]


def file_header(openssl_version: str) -> str:
    return f"# {FORMAT} {VERSION}\n# openssl: {openssl_version.strip()}\n"


def section(cipher: str, key_bits: int, evp: str, direction: str, exit_code: int, out: str) -> str:
    """One measured section: its header line, then the tool's output verbatim."""
    head = f"## cipher={cipher} key_bits={key_bits} evp={evp} direction={direction} "
    return head + f"exit={exit_code}\n" + out.rstrip("\n") + "\n"


def _fields(line: str) -> dict:
    return dict(item.split("=", 1) for item in line[3:].split())


def _throughput(body: list[str]) -> list[tuple[int, float]]:
    """(block bytes, bytes/s) from the ``+H`` and ``+F`` lines; empty without them."""
    sizes = [ln for ln in body if ln.startswith("+H:")]
    speeds = [ln for ln in body if ln.startswith("+F:")]
    if not sizes or not speeds:
        return []
    blocks = [int(b) for b in sizes[-1].strip().split(":")[1:]]
    values = [float(v) for v in speeds[-1].strip().split(":")[3:]]
    if len(blocks) != len(values):
        raise ValueError(f"{len(blocks)} block sizes but {len(values)} speeds")
    return list(zip(blocks, values, strict=True))


def _section_rows(path, fields: dict, body: list[str], version: str) -> list[dict]:
    for key in ("cipher", "key_bits", "evp", "direction", "exit"):
        if key not in fields:
            raise OpensslSpeedParseError(f"{path}: a section without {key}= ({fields})")
    if not fields["key_bits"].isdigit():
        raise OpensslSpeedParseError(f"{path}: key_bits={fields['key_bits']} is not a number")
    base = dict.fromkeys(OPENSSL_SPEED_COLUMNS)
    base.update(file=str(path), cipher=fields["cipher"], evp=fields["evp"])
    base.update(algorithm=benchmark_algorithm(fields["cipher"]), key_bits=int(fields["key_bits"]))
    base.update(direction=fields["direction"], openssl_version=version, available=True, note="")
    try:
        measured = _throughput(body)
    except ValueError as exc:
        raise OpensslSpeedParseError(f"{path}: {fields['evp']}: {exc}") from exc
    if not measured or fields["exit"] != "0":
        said = " ".join(ln.strip() for ln in body if ln.strip() and not ln.startswith("+"))
        note = f"openssl speed exit code {fields['exit']}" + (f": {said}" if said else "")
        return [base | {"available": False, "note": note[:300]}]
    return [base | {"block_bytes": b, "mib_s": bps / 2**20} for b, bps in measured]


def parse_openssl_speed_text(text: str, path: Path | str = "<text>") -> list[dict]:
    """Rows keyed by :data:`OPENSSL_SPEED_COLUMNS`, one per section and block size (a failed
    section: one row, ``available`` False, the tool's words as ``note``)."""
    lines = text.splitlines()
    head = _HEADER.match(lines[0]) if lines else None
    if head is None:
        raise OpensslSpeedParseError(f"{path}: not a luksbench openssl-speed file (no header)")
    if int(head["version"]) != VERSION:
        raise OpensslSpeedParseError(
            f"{path}: openssl-speed format version {head['version']}, this reader knows {VERSION}"
        )
    version, rows, fields, body = "", [], None, []
    for line in lines[1:]:
        if (match := _VERSION_LINE.match(line)) and fields is None:
            version = match["version"].strip()
        elif _SECTION.match(line):
            if fields is not None:
                rows += _section_rows(path, fields, body, version)
            fields, body = _fields(line), []
        elif fields is not None:
            body.append(line)
    if fields is not None:
        rows += _section_rows(path, fields, body, version)
    return rows


def parse_openssl_speed_file(path: Path) -> list[dict]:
    """:func:`parse_openssl_speed_text` of one file; unreadable: an OpensslSpeedParseError."""
    try:
        text = read_raw_file(path).decode("utf-8", errors="replace")
    except OSError as exc:
        raise OpensslSpeedParseError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    return parse_openssl_speed_text(text, path)
