"""The crypto ceiling on a box without AF_ALG, with this machine's real ``openssl speed``: the
shipped sample (whose ``cryptsetup benchmark`` could not run the kernel's ciphers) gets the test
box's userspace estimate beside it, and ingest, the loss tables, the ceiling figure and the paper's
text carry a ceiling labelled as a userspace estimate. Without the file they carry none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import matplotlib.collections
import pytest
from testkit.testbox import small_config
from testkit.testbox import testbox as run_testbox

from luksbench.analysis import ingest
from luksbench.analysis.loss import write_loss
from luksbench.formats.cryptsetup import parse_cryptsetup_file
from luksbench.formats.opensslspeed import OPENSSL_SPEED_FILE, SOURCE, parse_openssl_speed_file
from luksbench.publish import catalog, figures_arms, render
from luksbench.publish.ceilings import ceiling_text, crypto_ceilings
from luksbench.publish.run import load_run
from luksbench.testbox import lock
from luksbench.testbox.capture import benchmark_ciphers_userspace
from luksbench.testbox.planbuild import plan_from_config

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _sample_copy(tmp_path: Path) -> tuple[Path, Path]:
    raw = tmp_path / "raw" / "sample"
    shutil.copytree(SAMPLE, raw)
    for p in raw.rglob("*"):  # the shipped raw files are read-only; the copy gets a new file
        if p.is_dir():
            p.chmod(0o755)
    (host,) = [p for p in raw.iterdir() if (p / "env.json").exists()]
    return raw, host


def _ceiling_lines(fig) -> list:
    return [
        c
        for ax in fig.axes
        for c in ax.collections
        if isinstance(c, matplotlib.collections.LineCollection) and "ceiling" in c.get_label()
    ]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    raw, host = _sample_copy(tmp_path_factory.mktemp("openssl"))
    plan = json.loads((host / "env.json").read_text())["plan"]
    kernel = (host / "cryptsetup-benchmark.txt").read_text()
    assert "Required kernel crypto interface not available" in kernel
    evps = benchmark_ciphers_userspace(plan, kernel, host / OPENSSL_SPEED_FILE)
    processed = raw.parent.parent / "processed" / "sample"
    ingest.write_processed(raw, processed)
    write_loss(processed)
    return {
        "raw": raw,
        "host": host,
        "evps": evps,
        "run": load_run(processed),
        "processed": processed,
    }


def test_the_estimate_is_a_real_openssl_run(measured):
    assert measured["evps"] == ["aes-256-xts"]  # the sample's luks arm: aes-xts-plain64, 512 bits
    rows = parse_openssl_speed_file(measured["host"] / OPENSSL_SPEED_FILE)
    assert {r["direction"] for r in rows} == {"encryption", "decryption"}
    assert all(r["available"] and r["mib_s"] > 0 for r in rows)
    version = subprocess.run(["openssl", "version"], capture_output=True, text=True).stdout
    assert rows[0]["openssl_version"] == version.strip()
    again = benchmark_ciphers_userspace({"stacks": {}}, "", measured["host"] / OPENSSL_SPEED_FILE)
    assert again == []  # an existing raw file is kept, never rewritten


def test_ceiling_figure_and_text_say_userspace_estimate(measured):
    run = measured["run"]
    assert SOURCE in set(run.cryptsetup["source"])
    ceilings = crypto_ceilings(run.cryptsetup, run.stacks, run.env)
    luks = [c for c in ceilings if c["reason"] is None]
    assert luks and all(c["source"] == SOURCE for c in luks)
    assert all("userspace estimate (openssl)" in ceiling_text(c) for c in luks)
    fig = figures_arms.ceiling_figure(run.tables["arms"], ceilings)
    lines = _ceiling_lines(fig)
    assert lines and all(SOURCE in c.get_label() for c in lines)
    assert SOURCE in " ".join(fig._suptitle.get_text().split())  # wrapped
    cipher_fig = figures_arms.cipher_figure(run.cryptsetup)
    ticks = [t.get_text() for ax in cipher_fig.axes for t in ax.get_yticklabels()]
    assert any(SOURCE in t for t in ticks)


def test_the_paper_labels_the_ceiling_and_the_cipher_row(measured, tmp_path):
    processed = measured["processed"]
    figures_dir = tmp_path / "figures" / "sample"
    catalog.make_figures(processed, figures_dir, "sample")
    md = render.render_paper(processed, figures_dir, tmp_path / "paper" / "index.md", "sample")
    text = md.read_text()
    ceiling = next(ln for ln in text.splitlines() if ln.startswith("- `") and "/ `luks`" in ln)
    assert "**no crypto ceiling**" not in ceiling
    assert "read ceiling" in ceiling and "userspace estimate (openssl)" in ceiling
    assert "aes-xts (userspace estimate (openssl))" in text  # the cipher table's row


def test_without_the_estimate_no_ceiling_is_drawn(tmp_path):
    raw, _ = _sample_copy(tmp_path)
    cs = ingest.cryptsetup_table(raw)
    stacks, env = ingest.stacks_table(raw), ingest.env_table(raw)
    ceilings = crypto_ceilings(cs, stacks, env)
    assert ceilings and all(c["reason"] and c["read_ceiling_mib_s"] is None for c in ceilings)


@pytest.mark.device
def test_the_workflows_command_writes_the_estimate_beside_the_kernels(tmp_path):
    """`luksbench testbox benchmark-ciphers --plan P` (the benchmark_ciphers rule's command) on
    this machine: cryptsetup's output verbatim, and where it has no row for the plan's cipher,
    openssl-speed.txt beside it for that cipher; without --plan no estimate is made."""
    stacks = {"plain": {"kind": "plain"}, "luks": {"kind": "luks", "key_bits": 256}}
    config = small_config(f"ossl{os.getpid()}", stacks=stacks)
    plan = plan_from_config(config, "box", tmp_path / "scratch")
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "host" / "cryptsetup-benchmark.txt"
    try:
        run_testbox("benchmark-ciphers", "--plan", tmp_path / "plan.json", "--out", out)
    finally:
        lock.release(Path(plan["scratch_dir"]) / "state.json")
    estimate = out.with_name(OPENSSL_SPEED_FILE)
    kernel = [r for r in parse_cryptsetup_file(out) if r["kind"] == "cipher"]
    if any(r["available"] and r["algorithm"] == "aes-xts" and r["key_bits"] == 256 for r in kernel):
        assert not estimate.exists()  # the kernel's own benchmark measured it: no estimate
    else:
        rows = parse_openssl_speed_file(estimate)
        assert {(r["evp"], r["direction"]) for r in rows} == {
            ("aes-128-xts", "encryption"),
            ("aes-128-xts", "decryption"),
        }
    bare = tmp_path / "bare" / "cryptsetup-benchmark.txt"
    try:
        args = ("--cipher", "aes-xts-plain64", "--key-size", "256")
        run_testbox("benchmark-ciphers", "--out", bare, *args)
    finally:
        lock.release(bare.with_name(".benchmark-ciphers.state"))
    assert not bare.with_name(OPENSSL_SPEED_FILE).exists()
