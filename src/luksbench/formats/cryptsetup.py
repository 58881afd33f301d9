"""``cryptsetup benchmark`` text output to tidy rows: one per PBKDF and per cipher.

Standard library only: the test box runs this on minimal servers. Layouts seen in real output:
cryptsetup >= 2.0 (PBKDF2, argon2, then the cipher table) and 1.6/1.7 (narrow columns, PBKDF2
lines without ``for 256-bit key``); the cipher header without its ``#`` (pasted into Markdown) or
wider (``-c <cipher>``), decimal commas, ``N/A`` rows, interleaved kernel messages. When the
cipher part fails as a whole (``Required kernel crypto interface not available.``: no AF_ALG),
the PBKDF rows are kept and ONE row of kind "cipher", ``available`` False, has the error as
``note``.

The test box runs cryptsetup with ``LC_ALL=C``. A capture made in another locale is read when it
is German (cryptsetup 2.x's own de translation: "Iterationen pro Sekunde", decimal commas) and
refused as a whole otherwise: a PBKDF or cipher line in a language this parser does not know
raises :class:`CryptsetupParseError` naming the line, so no row is silently left out.
"""

from __future__ import annotations

import re
from pathlib import Path

from luksbench.formats.layout import read_raw_file

CRYPTSETUP_COLUMNS = [
    "file",
    "kind",  # pbkdf2 | argon2 | cipher
    "algorithm",  # PBKDF2-sha256, argon2id, aes-xts, xchacha12,aes-adiantum
    "key_bits",
    "iterations_per_s",  # pbkdf2
    "memory_kib",  # argon2
    "threads",  # argon2
    "time_cost",  # argon2 iterations
    "encryption_mib_s",
    "decryption_mib_s",
    "available",
    "note",
    # Extra, after the fixed contract above.
    "requested_ms",  # argon2: the time target the cost parameters were calibrated to
]

NOT_AVAILABLE = "N/A"

# English (LC_ALL=C) or cryptsetup's German catalogue (de.po: "für 256-Bit-Schlüssel", ...)
_FOR_KEY = r"(?: (?:for|für) (?P<key_bits>\d+)-(?:bit key|Bit-Schlüssel))?"
_NA = r"(?P<na>N/A|\(nicht zutreffend\))"
_PBKDF2 = re.compile(
    r"^(?P<algorithm>PBKDF2-\S+)\s+"
    rf"(?:(?P<iterations>\d+) (?:iterations per second|Iterationen pro Sekunde){_FOR_KEY}"
    rf"|{_NA})\s*$"
)
_ARGON2 = re.compile(
    r"^(?P<algorithm>argon2\w*)\s+"
    r"(?:(?P<time_cost>\d+) (?:iterations|Iterationen), (?P<memory>\d+) (?:memory|Speicher), "
    r"(?P<threads>\d+) (?:parallel threads?|parallele Threads?) \(CPUs\)"
    rf"{_FOR_KEY}(?: \((?:requested (?P<requested_ms>\d+) ms time"
    r"|Zieldauer (?P<requested_ms_de>\d+) Millisekunden)\))?"
    rf"|{_NA})\s*$"
)
# A line that carries a result in a language (or layout) the patterns above do not read.
_UNREAD_RESULT = re.compile(r"^(?:PBKDF2-\S+|argon2\w*)\s|^\s*\S+\s+\d+\s?b\s+\d")
_SPEED = r"(?:\d+(?:[.,]\d+)? MiB/s|N/A)"  # one decimal mark: "1234.5" or "1234,5"
_CIPHER_ROW = re.compile(
    rf"^\s*(?P<algorithm>\S+)\s+(?P<key_bits>\d+)b\s+(?P<enc>{_SPEED})\s+(?P<dec>{_SPEED})\s*$"
)
_CIPHER_HEADER = re.compile(
    r"^\s*#?\s*Algorithm(?:us)?\s*\|.*(?:Encryption|Verschlüsselung)\s*\|"
    r"\s*(?:Decryption|Entschlüsselung)\s*$"
)
# Lines that carry no result: the "# Tests are approximate..." banner, kernel log lines.
_IGNORED = re.compile(r"^\s*(?:#.*|\[\s*\d+\.\d+\].*)?$")
# cryptsetup's message when the kernel crypto API (AF_ALG skcipher) cannot be used; cryptsetup
# follows it with hints ("Ensure you have algif_skcipher kernel module loaded.").
_CIPHER_FAILURE = re.compile(
    r"not available|kernel module|algif_|nicht verfügbar|Kernelmodul", re.IGNORECASE
)


class CryptsetupParseError(ValueError):
    """A file with no recognisable ``cryptsetup benchmark`` output; the message names the file."""


def _empty_row(path: Path, kind: str, algorithm: str) -> dict:
    row = dict.fromkeys(CRYPTSETUP_COLUMNS)
    row.update(file=str(path), kind=kind, algorithm=algorithm, available=True, note="")
    return row


def _int_or_none(text: str | None) -> int | None:
    return None if text is None else int(text)


def _mib_s(speed: str) -> float | None:
    if speed == NOT_AVAILABLE:
        return None
    return float(speed.removesuffix("MiB/s").strip().replace(",", "."))  # locale decimal comma


def _pbkdf2_row(path: Path, match: re.Match) -> dict:
    row = _empty_row(path, "pbkdf2", match["algorithm"])
    row["key_bits"] = _int_or_none(match["key_bits"])
    if match["na"]:
        row.update(available=False, note=NOT_AVAILABLE)
    else:
        row["iterations_per_s"] = int(match["iterations"])
    return row


def _argon2_row(path: Path, match: re.Match) -> dict:
    row = _empty_row(path, "argon2", match["algorithm"])
    if match["na"]:
        row.update(available=False, note=NOT_AVAILABLE)
        return row
    row.update(key_bits=_int_or_none(match["key_bits"]), time_cost=int(match["time_cost"]))
    row.update(memory_kib=int(match["memory"]), threads=int(match["threads"]))
    row["requested_ms"] = _int_or_none(match["requested_ms"] or match["requested_ms_de"])
    return row


def _cipher_row(path: Path, match: re.Match) -> dict:
    row = _empty_row(path, "cipher", match["algorithm"])
    row.update(key_bits=int(match["key_bits"]), encryption_mib_s=_mib_s(match["enc"]))
    row["decryption_mib_s"] = _mib_s(match["dec"])
    if row["encryption_mib_s"] is None or row["decryption_mib_s"] is None:
        row.update(available=False, note=NOT_AVAILABLE)
    return row


def parse_cryptsetup_text(text: str, path: Path | str = "<text>") -> list[dict]:
    """Rows keyed by :data:`CRYPTSETUP_COLUMNS` from ``cryptsetup benchmark`` output text, in file
    order; :class:`CryptsetupParseError` when nothing is recognised."""
    rows: list[dict] = []
    failure_lines: list[str] = []
    saw_cipher_header = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if match := _PBKDF2.match(stripped):
            rows.append(_pbkdf2_row(path, match))
        elif match := _ARGON2.match(stripped):
            rows.append(_argon2_row(path, match))
        elif match := _CIPHER_ROW.match(line):
            rows.append(_cipher_row(path, match))
        elif _CIPHER_HEADER.match(line):
            saw_cipher_header = True
        elif _IGNORED.match(line):
            continue
        elif _CIPHER_FAILURE.search(stripped):
            failure_lines.append(stripped)
        elif _UNREAD_RESULT.match(line):
            raise CryptsetupParseError(
                f"{path}: line {number} is a result this parser cannot read ({stripped[:80]!r}): "
                "captured in a locale other than English or German? The test box runs "
                "cryptsetup with LC_ALL=C; the file is left out rather than read in part"
            )
        # Anything else (prose left around a pasted output) carries no result: skip it.

    if failure_lines:
        failure = _empty_row(path, "cipher", "")
        failure.update(available=False, note=" ".join(failure_lines))
        rows.append(failure)
    if not rows:
        what = "a cipher table header but no rows" if saw_cipher_header else "no result lines"
        raise CryptsetupParseError(
            f"{path}: no recognisable `cryptsetup benchmark` output ({what}; expected lines "
            "like 'PBKDF2-sha256  1664406 iterations per second' or "
            "'aes-xts  256b  2734.6 MiB/s  2732.8 MiB/s')"
        )
    return rows


def parse_cryptsetup_file(path: Path) -> list[dict]:
    """:func:`parse_cryptsetup_text` of one file; an unreadable file is a CryptsetupParseError."""
    try:
        text = read_raw_file(path).decode("utf-8", errors="replace")
    except OSError as exc:
        raise CryptsetupParseError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    return parse_cryptsetup_text(text, path)
