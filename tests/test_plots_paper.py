"""Figures and paper from the real-fio raw layout of test_ingest (smoke + the paper's promises)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from PIL import Image

from luksbench import ingest, paper, plots, stats


@pytest.fixture(scope="module")
def processed(external_dir, tmp_path_factory) -> Path:
    from test_ingest import build_raw  # tests/ is on sys.path (rootdir-relative import mode)

    base = tmp_path_factory.mktemp("pp")
    raw = build_raw(external_dir, base / "raw" / "tumrun")
    out = base / "processed" / "tumrun"
    ingest.write_processed(raw, out)
    stats.write_loss(out)
    return out


@pytest.fixture(scope="module")
def figures(processed) -> dict:
    return plots.make_figures(processed, processed.parent.parent / "figures" / "tumrun", "tumrun")


def test_figures_written_with_provenance(figures, processed):
    fio = ingest.read_processed(processed)["fio"]
    cells = fio[["host", "rw"]].drop_duplicates().itertuples(index=False)
    expected = {"loss"} | {
        f"throughput-{h}-{rw}-{m}" for h, rw in cells for m in ("bw_bytes", "iops")
    }
    assert set(figures) == expected
    for name, (png, svg) in figures.items():
        assert png.suffix == ".png" and svg.suffix == ".svg"
        assert png.stat().st_size > 1000 and svg.stat().st_size > 1000
        text = Image.open(png).text
        assert text["run"] == "tumrun" and text["figure"] == name
        assert text["made_by"].startswith("luksbench.plots.")
        assert "fio.parquet" in json.loads(text["sources_sha256"])
        head = svg.read_text()
        assert "luksbench.plots." in head and "<dc:date>" not in head


def test_figures_are_byte_stable(figures, processed, tmp_path):
    again = plots.make_figures(processed, tmp_path / "again", "tumrun")
    for name, (png, svg) in figures.items():
        assert again[name][0].read_bytes() == png.read_bytes(), name
        assert again[name][1].read_bytes() == svg.read_bytes(), name


def test_save_figure_accepts_suffix(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    paths = plots.save_figure(fig, tmp_path / "x.png", {"run": "r", "nested": {"a": 1}})
    plt.close(fig)
    assert [p.name for p in paths] == ["x.png", "x.svg"]
    assert json.loads(Image.open(paths[0]).text["nested"]) == {"a": 1}


def test_paper_contains_loss_table_and_no_nan(processed, figures, tmp_path):
    out = tmp_path / "paper" / "tumrun" / "index.md"
    md = paper.render_paper(
        processed, processed.parent.parent / "figures" / "tumrun", out, "tumrun"
    )
    text = md.read_text()
    assert text.startswith("# ")
    assert "**TL;DR.**" in text and "significant" in text
    assert "kernel dm-crypt" in text  # the backend the run recorded, said explicitly
    assert "### Bandwidth (loss)" in text and "### p99 completion latency (increase)" in text
    assert "| tum-direct2: randread 4k QD1, job `alat randread` |" in text
    assert not re.search(r"\bnan\b", text, re.IGNORECASE)
    assert "[n/a]" in text  # the single-pair host has no interval, and says so
    assert "insufficient" in text
    # cryptsetup: the cipher table of host A and the recorded failure of the other host
    assert "| aes-xts | 512 | 1,983.0 | 1,979.6 |" in text
    assert "did not run" in text
    # every figure linked relative to the .md and present
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == len(figures)
    for link in links:
        assert not Path(link).is_absolute() and (md.parent / link).exists(), link
    html = paper.render_html(md)
    assert "<table>" in html.read_text()


def test_paper_numbers_come_from_the_tables(processed, figures, tmp_path):
    """The TL;DR's largest significant loss is the table's, formatted."""
    loss = ingest.read_processed(processed)["loss"]
    sig = loss[(loss["metric"] == "bw_bytes") & (loss["verdict"] == "significant")]
    md = paper.render_paper(
        processed, processed.parent.parent / "figures" / "tumrun", tmp_path / "p.md", "tumrun"
    )
    tldr = md.read_text().split("**TL;DR.**")[1].split("\n")[0]
    if sig.empty:
        assert "no significant loss" in tldr
    else:
        worst = sig.loc[sig["effect_pct"].idxmax()]
        assert paper.fmt_pct(worst["effect_pct"]) in tldr
        assert paper.fmt_ci(worst["ci_low"], worst["ci_high"]) in tldr


def test_userspace_backend_is_named(processed, figures, tmp_path):
    import pandas as pd

    env = pd.read_parquet(processed / "env.parquet")
    alt = tmp_path / "processed"
    alt.mkdir()
    for p in processed.glob("*.parquet"):
        (alt / p.name).write_bytes(p.read_bytes())
    env.assign(backend="userspace").to_parquet(alt / "env.parquet", index=False)
    md = paper.render_paper(
        alt, processed.parent.parent / "figures" / "tumrun", tmp_path / "u.md", "tumrun"
    )
    assert "qemu-storage-daemon's LUKS driver via FUSE, not dm-crypt" in md.read_text()
