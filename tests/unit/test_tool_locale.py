"""Tools parsed in one locale: the test box runs every tool it parses with LC_ALL=C, and a
`cryptsetup benchmark` captured in another locale is read (German) or refused as a whole, named in
ingest's problems (any other language): never read in part.

Fixtures: cryptsetup_benchmark_de_no_af_alg.txt and cryptsetup_benchmark_fr_no_af_alg.txt are this
machine's real output (cryptsetup 2.6.1, `LC_ALL=C.UTF-8 LANGUAGE=de|fr cryptsetup benchmark`, no
AF_ALG); cryptsetup_benchmark_de_DE.txt is the external bttger__my-linux capture with every line
translated by cryptsetup 2.6.1's own German catalogue (de.mo) and decimal commas, as a de_DE
locale prints it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from luksbench.analysis.ingest import cryptsetup_table
from luksbench.formats.cryptsetup import CryptsetupParseError, parse_cryptsetup_file
from luksbench.testbox import commands as testbox_cli
from luksbench.testbox import sysutil
from luksbench.testbox.capture import benchmark_ciphers

BTTGER = "bttger__my-linux/cryptsetup_benchmark_FDE_md.txt"
GERMAN_CATALOGUE = Path("/usr/share/locale/de/LC_MESSAGES/cryptsetup.mo")


def without_file(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "file"} for row in rows]


def test_a_german_capture_reads_as_its_english_original(external_dir, fixtures_dir):
    german = parse_cryptsetup_file(fixtures_dir / "cryptsetup_benchmark_de_DE.txt")
    english = parse_cryptsetup_file(external_dir / BTTGER)
    assert len(german) == 5 + 2 + 12
    assert without_file(german) == without_file(english)


def test_a_real_german_capture_without_af_alg_keeps_every_row(fixtures_dir):
    german = parse_cryptsetup_file(fixtures_dir / "cryptsetup_benchmark_de_no_af_alg.txt")
    english = parse_cryptsetup_file(fixtures_dir / "cryptsetup_benchmark_no_af_alg.txt")
    shape = [(r["kind"], r["algorithm"], r["key_bits"], r["available"]) for r in english]
    assert [(r["kind"], r["algorithm"], r["key_bits"], r["available"]) for r in german] == shape
    argon2id = next(r for r in german if r["algorithm"] == "argon2id")
    assert (argon2id["time_cost"], argon2id["threads"], argon2id["requested_ms"]) == (4, 4, 2000)
    assert "Kernelmodul" in german[-1]["note"]


def test_a_capture_in_another_language_is_refused_naming_the_line(fixtures_dir):
    with pytest.raises(CryptsetupParseError, match="line 4 is a result this parser cannot read"):
        parse_cryptsetup_file(fixtures_dir / "cryptsetup_benchmark_fr_no_af_alg.txt")


def test_ingest_lists_the_refused_capture_in_problems(fixtures_dir, tmp_path):
    host = tmp_path / "raw" / "locale-run" / "box"
    host.mkdir(parents=True)
    (host / "env.json").write_text("{}")
    shutil.copy(
        fixtures_dir / "cryptsetup_benchmark_fr_no_af_alg.txt", host / "cryptsetup-benchmark.txt"
    )
    table = cryptsetup_table(host.parent, strict=False)
    assert table.empty
    [(path, why)] = table.attrs["problems"]
    assert path.endswith("box/cryptsetup-benchmark.txt")
    assert "locale other than English or German" in why and "LC_ALL=C" in why


# --- the tools the test box runs ---------------------------------------------------------------


@pytest.fixture
def german_operator(monkeypatch):
    """An operator's shell in German; the catalogue must be there for the test to mean anything."""
    if shutil.which("cryptsetup") is None or not GERMAN_CATALOGUE.exists():
        pytest.skip("needs cryptsetup and its German catalogue")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("LANGUAGE", "de")
    said = subprocess.run(["cryptsetup", "--help"], capture_output=True, text=True).stdout
    assert "Verwendung:" in said  # this shell's tools do speak German


def test_run_tool_and_run_quiet_run_in_the_c_locale(german_operator):
    assert "Usage:" in sysutil.run_tool(["cryptsetup", "--help"], "help").stdout
    assert "Usage:" in sysutil.run_quiet(["cryptsetup", "--help"]).stdout


def test_the_cipher_benchmark_is_captured_in_the_c_locale(german_operator, tmp_path):
    benchmark_ciphers(tmp_path / "out.txt", ["--cipher", "aes-xts-plain64", "--key-size", "256"])
    text = (tmp_path / "out.txt").read_text()
    assert "verfügbar" not in text and "Verschlüsselung" not in text, text


def test_the_testbox_commands_set_the_c_locale_for_every_child(german_operator):
    """Every `luksbench testbox` command runs through cli._run: fio, losetup, dmsetup, ... all
    inherit the C locale, also those spawned without run_tool."""
    said = []

    def command(args) -> int:
        said.append(subprocess.run(["cryptsetup", "--help"], capture_output=True, text=True).stdout)
        return 0

    assert testbox_cli._run(command)(argparse.Namespace(testbox_command="probe")) == 0
    assert "Usage:" in said[0]
