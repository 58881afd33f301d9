"""The crypto ceiling without AF_ALG: luksbench.formats.opensslspeed over this machine's real
``openssl speed -mr`` output (tests/fixtures/openssl_speed_*.txt, written by the test box's own
code), its cipher mapping, ingest into the cryptsetup table and the ceiling labelled as a
userspace estimate."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit.plans import plan_stacks

from luksbench.analysis import ingest
from luksbench.formats.opensslspeed import (
    OPENSSL_SPEED_COLUMNS,
    OPENSSL_SPEED_FILE,
    SOURCE,
    OpensslSpeedParseError,
    evp_name,
    parse_openssl_speed_file,
    parse_openssl_speed_text,
)
from luksbench.publish.ceilings import ceiling_text, crypto_ceilings
from luksbench.testbox.capture import plan_ciphers


@pytest.mark.parametrize(
    ("cipher", "key_bits", "evp"),
    [
        ("aes-xts-plain64", 512, "aes-256-xts"),  # XTS: two keys in one
        ("aes-xts-plain64", 256, "aes-128-xts"),
        ("aes-xts-plain64", 384, None),  # no 192-bit AES-XTS in OpenSSL
        ("aes-cbc-essiv:sha256", 256, "aes-256-cbc"),
        ("aes-cbc-essiv:sha256", 128, "aes-128-cbc"),
        ("camellia-cbc-plain", 192, "camellia-192-cbc"),
        ("serpent-xts-plain64", 512, None),
        ("twofish-xts-plain64", 512, None),
        ("xchacha12,aes-adiantum-plain64", 256, None),
        ("cipher_null-ecb", 0, None),
    ],
)
def test_luks_cipher_to_openssl(cipher, key_bits, evp):
    assert evp_name(cipher, key_bits) == evp


def _fixture(fixtures_dir: Path, name: str) -> Path:
    return fixtures_dir / name


def _plus_f(path: Path) -> list[list[float]]:
    """bytes/s of each +F line, read independently of the parser."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("+F:")]
    return [[float(v) for v in ln.split(":")[3:]] for ln in lines]


def test_parses_real_output_per_direction_and_block(fixtures_dir):
    path = _fixture(fixtures_dir, "openssl_speed_aes_xts.txt")
    rows = parse_openssl_speed_file(path)
    assert all(list(r) == OPENSSL_SPEED_COLUMNS for r in rows)
    enc = [r for r in rows if r["direction"] == "encryption"]
    dec = [r for r in rows if r["direction"] == "decryption"]
    assert [r["block_bytes"] for r in enc] == [16, 64, 256, 1024, 8192, 16384]
    assert len(dec) == 6 and all(r["available"] for r in rows)
    expected = _plus_f(path)
    assert [r["mib_s"] for r in enc] == pytest.approx([v / 2**20 for v in expected[0]])
    assert [r["mib_s"] for r in dec] == pytest.approx([v / 2**20 for v in expected[1]])
    first = rows[0]
    assert (first["cipher"], first["algorithm"], first["key_bits"], first["evp"]) == (
        "aes-xts-plain64",
        "aes-xts",
        512,
        "aes-256-xts",
    )
    assert first["openssl_version"].startswith("OpenSSL ")


def test_a_failed_section_is_one_row_with_the_tools_words(fixtures_dir):
    rows = parse_openssl_speed_file(_fixture(fixtures_dir, "openssl_speed_unknown_cipher.txt"))
    assert len(rows) == 1 and rows[0]["available"] is False
    assert "exit code 1" in rows[0]["note"] and "unknown cipher" in rows[0]["note"]
    assert rows[0]["mib_s"] is None


def test_refuses_other_files_and_versions(tmp_path):
    with pytest.raises(OpensslSpeedParseError, match="no header"):
        parse_openssl_speed_text("+H:16\n+F:1:x:5\n", "x.txt")
    with pytest.raises(OpensslSpeedParseError, match=r"x\.txt: .*version 2, this reader knows 1"):
        parse_openssl_speed_text("# luksbench openssl-speed 2\n", "x.txt")
    bad = (
        "# luksbench openssl-speed 1\n## cipher=a-b key_bits=1 evp=e direction=encryption exit=0\n"
    )
    with pytest.raises(OpensslSpeedParseError, match="2 block sizes but 1 speeds"):
        parse_openssl_speed_text(bad + "+H:16:64\n+F:1:E:5.0\n", "x.txt")
    with pytest.raises(OpensslSpeedParseError, match="without evp="):
        parse_openssl_speed_text(bad.replace("evp=e ", ""), "x.txt")


def test_plan_ciphers_every_luks_layer_once_without_null():
    plan = {
        "stacks": plan_stacks(
            {
                "plain": {"kind": "plain"},
                "luks": {"kind": "luks", "over": "d0"},
                "again": {"kind": "luks", "over": "d1"},
                "cbc": {
                    "kind": "luks",
                    "over": "d0",
                    "cipher": "aes-cbc-essiv:sha256",
                    "key_bits": 256,
                },
                "nullc": {"kind": "luks", "over": "d0", "cipher": "cipher_null-ecb"},
                "md": {"kind": "md", "members": [{"kind": "luks", "over": "d2", "key_bits": 256}]},
            }
        )
    }
    assert plan_ciphers(plan) == [
        ("aes-xts-plain64", 512),
        ("aes-cbc-essiv:sha256", 256),
        ("aes-xts-plain64", 256),
    ]


def _raw_host(tmp_path: Path, fixtures_dir: Path, openssl: bool) -> Path:
    host = tmp_path / "raw" / "r1" / "box"
    (host / "fio").mkdir(parents=True)  # a host folder as ingest finds one
    shutil.copy(
        fixtures_dir / "cryptsetup_benchmark_no_af_alg.txt", host / "cryptsetup-benchmark.txt"
    )
    if openssl:
        shutil.copy(fixtures_dir / "openssl_speed_aes_xts.txt", host / OPENSSL_SPEED_FILE)
    return host.parent


def _stacks_env(cpus: int = 2):
    stacks = pd.DataFrame(
        [
            {"host": "box", "stack": "plain", "kind": "plain", "cipher": None, "key_bits": None},
            {
                "host": "box",
                "stack": "luks",
                "kind": "luks",
                "cipher": "aes-xts-plain64",
                "key_bits": 512,
            },
        ]
    )
    stacks["available"], stacks["reason"] = True, None
    return stacks, pd.DataFrame([{"host": "box", "cpu_count": cpus}])


def test_ingest_adds_the_estimate_to_the_cryptsetup_table(tmp_path, fixtures_dir):
    raw = _raw_host(tmp_path, fixtures_dir, openssl=True)
    cs = ingest.cryptsetup_table(raw)
    estimate = cs[cs["source"] == SOURCE]
    assert len(estimate) == 1
    row = estimate.iloc[0]
    assert (row["kind"], row["algorithm"], row["key_bits"], row["block_bytes"]) == (
        "cipher",
        "aes-xts",
        512,
        16384,
    )
    enc, dec = (v[-1] / 2**20 for v in _plus_f(fixtures_dir / "openssl_speed_aes_xts.txt"))
    assert row["encryption_mib_s"] == pytest.approx(enc)
    assert row["decryption_mib_s"] == pytest.approx(dec)
    assert row["file"] == f"box/{OPENSSL_SPEED_FILE}"
    kernel = cs[cs["source"] == "cryptsetup benchmark"]
    assert len(kernel) == len(cs) - 1 and (kernel["file"] == "box/cryptsetup-benchmark.txt").all()


def test_ceiling_from_the_userspace_estimate_labelled_so(tmp_path, fixtures_dir):
    stacks, env = _stacks_env(cpus=2)
    without = crypto_ceilings(
        ingest.cryptsetup_table(_raw_host(tmp_path / "a", fixtures_dir, False)), stacks, env
    )
    assert without[0]["read_ceiling_mib_s"] is None
    assert "did not run" in without[0]["reason"]
    cs = ingest.cryptsetup_table(_raw_host(tmp_path / "b", fixtures_dir, True))
    (ceiling,) = crypto_ceilings(cs, stacks, env)
    row = cs[cs["source"] == SOURCE].iloc[0]
    assert ceiling["reason"] is None and ceiling["source"] == SOURCE
    assert ceiling["read_ceiling_mib_s"] == pytest.approx(row["decryption_mib_s"] * 2)
    assert ceiling["write_ceiling_mib_s"] == pytest.approx(row["encryption_mib_s"] * 2)
    text = ceiling_text(ceiling)
    assert "userspace estimate (openssl)" in text and "16384-byte buffers" in text
    assert re.search(r"OpenSSL's speed on this CPU, not dm-crypt's", text)


def test_the_kernels_benchmark_wins_over_the_estimate(tmp_path, fixtures_dir):
    cs = ingest.cryptsetup_table(_raw_host(tmp_path, fixtures_dir, True))
    kernel = cs[cs["source"] == SOURCE].assign(
        source="cryptsetup benchmark", encryption_mib_s=1000.0, decryption_mib_s=900.0
    )
    stacks, env = _stacks_env(cpus=4)
    (ceiling,) = crypto_ceilings(pd.concat([cs, kernel], ignore_index=True), stacks, env)
    assert ceiling["source"] == "cryptsetup benchmark"
    assert ceiling["read_ceiling_mib_s"] == pytest.approx(3600.0)
    assert "estimate" not in ceiling_text(ceiling)


def test_a_bad_estimate_file_is_a_named_problem(tmp_path, fixtures_dir):
    raw = _raw_host(tmp_path, fixtures_dir, False)
    (raw / "box" / OPENSSL_SPEED_FILE).write_text("garbage\n")
    with pytest.raises(Exception, match=OPENSSL_SPEED_FILE):
        ingest.cryptsetup_table(raw, strict=True)
    cs = ingest.cryptsetup_table(raw, strict=False)
    assert SOURCE not in set(cs["source"])
    ((path, why),) = cs.attrs["problems"]  # listed in problems.parquet by write_processed
    assert path.endswith(OPENSSL_SPEED_FILE) and "no header" in why


_HEAD = "# luksbench openssl-speed 1\n## cipher=aes-xts-plain64 key_bits=512 evp=aes-256-xts "
_LINE = st.one_of(
    st.text(max_size=40),
    st.builds(lambda t: "+H:" + t, st.text(alphabet="0123456789:.-e", max_size=30)),
    st.builds(lambda t: "+F:1:X:" + t, st.text(alphabet="0123456789:.-eEnaif", max_size=30)),
    st.builds(lambda t: "## " + t, st.text(alphabet="abcdeikrsy_=0123 ", max_size=40)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_LINE, max_size=8), st.sampled_from(["direction=encryption exit=0\n", ""]))
def test_corrupted_output_gives_rows_or_the_parsers_own_error(lines, tail):
    try:
        rows = parse_openssl_speed_text(_HEAD + tail + "\n".join(lines), "f.txt")
    except OpensslSpeedParseError as exc:
        assert str(exc).startswith("f.txt: ")
    else:
        assert all(list(r) == OPENSSL_SPEED_COLUMNS for r in rows)
