"""luksbench.formats.cryptsetup against the 15 real `cryptsetup benchmark` outputs of
../shared/datasets/external (see PROVENANCE.md) and this machine's own output."""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys

import pytest

from luksbench.formats.cryptsetup import (
    CRYPTSETUP_COLUMNS,
    CryptsetupParseError,
    parse_cryptsetup_file,
    parse_cryptsetup_text,
)

REQUIRED_COLUMNS = [
    "file", "kind", "algorithm", "key_bits", "iterations_per_s", "memory_kib", "threads",
    "time_cost", "encryption_mib_s", "decryption_mib_s", "available", "note",
]  # fmt: skip

SCS = "SovereignCloudStack__website/cryptsetup_benchmark_scs_blog_testsystemA_2xXeonGold6151.txt"
BTTGER = "bttger__my-linux/cryptsetup_benchmark_FDE_md.txt"
FENDOS_NO_HASH = "Fendos__fendos/cryptsetup_benchmark_cipher_only.txt"
IMX_CAAM = "bgnetworks__meta-essa-mx6ul/cryptsetup_benchmark_imx6ul_with_caam.txt"
IMX_NO_CAAM = "bgnetworks__meta-essa-mx6ul/cryptsetup_benchmark_imx6ul_without_caam.txt"
RPI4 = "Kright__my-articles/cryptsetup_benchmark_rpi4b.txt"
RPI5_NA = "Kright__my-articles/cryptsetup_benchmark_rpi5.txt"
RYZEN3700X = "Kright__my-articles/cryptsetup_benchmark_ryzen3700x.txt"
RYZEN5950X_COMMA = "Kright__my-articles/cryptsetup_benchmark_ryzen5950x_comma_decimal.txt"
ADIANTUM = "Kright__my-articles/cryptsetup_benchmark_rpi4b_xchacha12_adiantum.txt"
ALGIF_MISSING = (
    "HelloVolla__ubuntu-touch-beta-tests/issue-114_cryptsetup_benchmark_algif_missing.txt"
)
HEADS_DMESG = "linuxboot__heads/issue-1396_cryptsetup_benchmark_qemu_pbkdf2_na_dmesg_TRUNCATED.txt"
M1_ONE_ROW = "AlexSSD7__linsk/issue-37_cryptsetup_benchmark_m1_vm_single_row.txt"
OLD_160 = "web__newbetuts.com/cryptsetup_1.6.0_benchmark_core2duo_comma_decimal.txt"

FULL_TABLE = {"pbkdf2": 5, "argon2": 2, "cipher": 12}
# Per file: number of rows of each kind, and rows that are not available.
EXPECTED = {
    SCS: dict(kinds=FULL_TABLE, unavailable=0),
    BTTGER: dict(kinds=FULL_TABLE, unavailable=0),
    FENDOS_NO_HASH: dict(kinds={"cipher": 12}, unavailable=0),
    IMX_CAAM: dict(kinds={"cipher": 2}, unavailable=0),
    IMX_NO_CAAM: dict(kinds={"cipher": 2}, unavailable=0),
    RPI4: dict(kinds=FULL_TABLE, unavailable=0),
    RPI5_NA: dict(kinds=FULL_TABLE, unavailable=4),
    RYZEN3700X: dict(kinds=FULL_TABLE, unavailable=0),
    RYZEN5950X_COMMA: dict(kinds=FULL_TABLE, unavailable=0),
    ADIANTUM: dict(kinds={"cipher": 1}, unavailable=0),
    ALGIF_MISSING: dict(kinds={"pbkdf2": 5, "cipher": 1}, unavailable=1),
    HEADS_DMESG: dict(kinds={"pbkdf2": 5, "argon2": 2, "cipher": 1}, unavailable=5),
    M1_ONE_ROW: dict(kinds={"cipher": 1}, unavailable=0),
    OLD_160: dict(kinds={"cipher": 12}, unavailable=0),
}
ALL_FILES = sorted(EXPECTED)


def _kinds(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["kind"]] = counts.get(row["kind"], 0) + 1
    return counts


def _cipher(rows: list[dict], algorithm: str, key_bits: int) -> dict:
    (row,) = [
        r
        for r in rows
        if (r["kind"], r["algorithm"], r["key_bits"]) == ("cipher", algorithm, key_bits)
    ]
    return row


def test_every_provenance_cryptsetup_file_is_covered(external_dir):
    provenance = (external_dir / "PROVENANCE.md").read_text()
    section = provenance.split("## 2. `cryptsetup benchmark` outputs")[1].split("## 3.")[0]
    listed = set(re.findall(r"^\| `([^`]+)`", section, re.MULTILINE))
    assert listed == set(EXPECTED)


def test_columns_start_with_the_contract():
    assert CRYPTSETUP_COLUMNS[: len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS


@pytest.mark.parametrize("relative", ALL_FILES)
def test_generic_shape(external_dir, relative):
    path = external_dir / relative
    rows = parse_cryptsetup_file(path)
    assert _kinds(rows) == EXPECTED[relative]["kinds"]
    assert sum(not row["available"] for row in rows) == EXPECTED[relative]["unavailable"]
    for row in rows:
        assert list(row) == CRYPTSETUP_COLUMNS
        assert row["file"] == str(path)
        if row["kind"] == "cipher" and row["available"]:
            assert re.fullmatch(r"[a-z0-9,-]+", row["algorithm"])
            assert row["key_bits"] in (128, 256, 512)
            assert 1 < row["encryption_mib_s"] < 100_000
            assert 1 < row["decryption_mib_s"] < 100_000
        if row["kind"] == "pbkdf2" and row["available"]:
            assert row["algorithm"].startswith("PBKDF2-")
            assert row["iterations_per_s"] > 10_000
        if row["kind"] == "argon2":
            assert row["algorithm"] in ("argon2i", "argon2id")
            assert row["memory_kib"] >= 1024 and row["threads"] >= 1 and row["time_cost"] >= 1
        if not row["available"]:
            assert row["encryption_mib_s"] is None and row["iterations_per_s"] is None
            assert row["note"]


def test_full_modern_table_values(external_dir):
    rows = parse_cryptsetup_file(external_dir / BTTGER)
    assert [row["algorithm"] for row in rows[:7]] == [
        "PBKDF2-sha1", "PBKDF2-sha256", "PBKDF2-sha512", "PBKDF2-ripemd160", "PBKDF2-whirlpool",
        "argon2i", "argon2id",
    ]  # fmt: skip
    sha256 = rows[1]
    assert (sha256["kind"], sha256["iterations_per_s"], sha256["key_bits"]) == (
        "pbkdf2",
        4088015,
        256,
    )
    argon2id = rows[6]
    assert (argon2id["kind"], argon2id["time_cost"], argon2id["memory_kib"], argon2id["threads"]) == (
        "argon2", 5, 1048576, 4,
    )  # fmt: skip
    assert (argon2id["key_bits"], argon2id["requested_ms"]) == (256, 2000)
    aes_xts = _cipher(rows, "aes-xts", 512)
    assert (aes_xts["encryption_mib_s"], aes_xts["decryption_mib_s"]) == (2334.9, 2329.1)
    assert aes_xts["available"] is True and aes_xts["note"] == ""


def test_decimal_comma(external_dir):
    rows = parse_cryptsetup_file(external_dir / RYZEN5950X_COMMA)
    aes_cbc = _cipher(rows, "aes-cbc", 128)
    assert (aes_cbc["encryption_mib_s"], aes_cbc["decryption_mib_s"]) == (1392.7, 3901.9)
    ripemd = next(row for row in rows if row["algorithm"] == "PBKDF2-ripemd160")
    assert ripemd["iterations_per_s"] == 1095690  # single space after the name


def test_rpi5_serpent_not_available(external_dir):
    rows = parse_cryptsetup_file(external_dir / RPI5_NA)
    unavailable = [row for row in rows if not row["available"]]
    assert {row["algorithm"] for row in unavailable} == {"serpent-cbc", "serpent-xts"}
    assert all(row["note"] == "N/A" and row["decryption_mib_s"] is None for row in unavailable)
    assert _cipher(rows, "serpent-xts", 512)["key_bits"] == 512
    assert _cipher(rows, "aes-xts", 256)["encryption_mib_s"] == 1644.9


def test_algif_missing_keeps_pbkdf_rows_and_records_failure(external_dir):
    rows = parse_cryptsetup_file(external_dir / ALGIF_MISSING)
    pbkdf2 = [row for row in rows if row["kind"] == "pbkdf2"]
    assert [row["iterations_per_s"] for row in pbkdf2] == [297890, 185129, 168907, 263196, 61134]
    assert all(row["key_bits"] is None for row in pbkdf2)  # old line without "for 256-bit key"
    (failure,) = [row for row in rows if row["kind"] == "cipher"]
    assert failure["algorithm"] == "" and failure["available"] is False
    assert "Required kernel crypto interface not available" in failure["note"]
    assert "algif_skcipher" in failure["note"]


def test_this_machine_without_af_alg(fixtures_dir):
    # `cryptsetup benchmark` (2.6.1) on the build machine, stdout+stderr: the error comes first.
    rows = parse_cryptsetup_file(fixtures_dir / "cryptsetup_benchmark_no_af_alg.txt")
    assert _kinds(rows) == {"pbkdf2": 5, "argon2": 2, "cipher": 1}
    assert all(row["available"] for row in rows if row["kind"] != "cipher")
    (failure,) = [row for row in rows if row["kind"] == "cipher"]
    assert failure["available"] is False
    assert failure["note"].startswith("Required kernel crypto interface not available.")


def test_old_160_layout(external_dir):
    rows = parse_cryptsetup_file(external_dir / OLD_160)
    assert [row["algorithm"] for row in rows[:3]] == ["aes-cbc", "serpent-cbc", "twofish-cbc"]
    aes_xts = _cipher(rows, "aes-xts", 256)
    assert (aes_xts["encryption_mib_s"], aes_xts["decryption_mib_s"]) == (156.4, 157.8)


def test_heads_ignores_dmesg_and_has_pbkdf2_na(external_dir):
    rows = parse_cryptsetup_file(external_dir / HEADS_DMESG)
    assert all(row["note"] == "N/A" for row in rows if row["kind"] == "pbkdf2")
    assert all(row["available"] for row in rows if row["kind"] == "argon2")
    (aes_cbc,) = [row for row in rows if row["kind"] == "cipher"]
    assert (aes_cbc["algorithm"], aes_cbc["encryption_mib_s"], aes_cbc["decryption_mib_s"]) == (
        "aes-cbc", 7.4, 8.0,
    )  # fmt: skip
    assert not any("random" in str(row["note"]) for row in rows)


def test_header_without_hash_and_single_cipher_header(external_dir):
    fendos = parse_cryptsetup_file(external_dir / FENDOS_NO_HASH)
    assert _cipher(fendos, "aes-xts", 256)["encryption_mib_s"] == 5346.1
    (adiantum,) = parse_cryptsetup_file(external_dir / ADIANTUM)
    assert (adiantum["algorithm"], adiantum["key_bits"], adiantum["encryption_mib_s"]) == (
        "xchacha12,aes-adiantum", 256, 188.1,
    )  # fmt: skip


def test_embedded_two_rows(external_dir):
    with_caam = parse_cryptsetup_file(external_dir / IMX_CAAM)
    without = parse_cryptsetup_file(external_dir / IMX_NO_CAAM)
    assert _cipher(with_caam, "aes-cbc", 256)["encryption_mib_s"] == 24.4
    assert _cipher(without, "aes-cbc", 256)["encryption_mib_s"] == 8.5


def test_single_row_m1(external_dir):
    (row,) = parse_cryptsetup_file(external_dir / M1_ONE_ROW)
    assert (row["algorithm"], row["key_bits"], row["decryption_mib_s"]) == ("aes-xts", 256, 3708.8)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "hello world\nnothing to see\n",
        "#     Algorithm |       Key |      Encryption |      Decryption\n",
    ],
    ids=["empty", "blank", "prose", "header-only"],
)
def test_nothing_recognisable_raises_naming_the_file(tmp_path, text):
    path = tmp_path / "bench.txt"
    path.write_text(text)
    with pytest.raises(CryptsetupParseError, match=r"bench\.txt: no recognisable"):
        parse_cryptsetup_file(path)


def test_fio_json_is_not_cryptsetup_output(external_dir):
    path = external_dir / "louwrentius__fio-plot/example_data/randread-01.json"
    with pytest.raises(CryptsetupParseError, match=re.escape(str(path))):
        parse_cryptsetup_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(CryptsetupParseError, match=r"nope\.txt: cannot read file"):
        parse_cryptsetup_file(tmp_path / "nope.txt")


def test_parse_text_argon2_na_and_prose_around():
    rows = parse_cryptsetup_text(
        "Here is my output:\nargon2id N/A\n    aes-xts   256b   1,5 MiB/s   N/A\nthanks\n", "pasted"
    )
    assert [(row["kind"], row["available"], row["note"]) for row in rows] == [
        ("argon2", False, "N/A"),
        ("cipher", False, "N/A"),
    ]
    assert rows[1]["encryption_mib_s"] == 1.5 and rows[1]["decryption_mib_s"] is None
    assert rows[0]["file"] == "pasted"


# --------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "luksbench.cli", "parse", "cryptsetup", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_cli_parse_cryptsetup(external_dir, fixtures_dir):
    result = _cli(
        str(external_dir / BTTGER), str(fixtures_dir / "cryptsetup_benchmark_no_af_alg.txt")
    )
    assert result.returncode == 0, result.stderr
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    assert list(table[0]) == CRYPTSETUP_COLUMNS
    assert len(table) == 19 + 8
    assert table[-1]["available"] == "False" and table[-1]["kind"] == "cipher"


def test_cli_parse_cryptsetup_bad_file_exits_1(external_dir, tmp_path):
    bad = tmp_path / "garbage.txt"
    bad.write_text("nothing here\n")
    result = _cli(str(external_dir / M1_ONE_ROW), str(bad))
    assert result.returncode == 1
    assert str(bad) in result.stderr
    assert len(list(csv.reader(io.StringIO(result.stdout)))) == 2
