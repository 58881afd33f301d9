"""What the shipped sample's figures and paper must hold (the invariants notebooks 03 and 04
used to assert inline; the notebooks keep a one-line sanity check each)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pytest
from PIL import Image as PILImage

from luksbench.analysis.ingest import write_processed
from luksbench.analysis.loss import write_loss
from luksbench.analysis.losssettings import default_settings
from luksbench.publish import render
from luksbench.publish.catalog import make_figures, read_index, read_skipped
from luksbench.publish.run import load_run, unavailable_stacks

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
NOTEBOOK = "notebooks/03-figures.ipynb"


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("published")
    processed, figures_dir = root / "processed", root / "figures"
    write_processed(SAMPLE, processed)
    write_loss(processed, default_settings())
    figures = make_figures(processed, figures_dir, "sample", notebook=NOTEBOOK, workers=1)
    md = render.render_paper(
        processed,
        figures_dir,
        root / "paper" / "index.md",
        "sample",
        reference_dir=REPO / "data" / "reference",
    )
    return {
        "processed": processed,
        "figures_dir": figures_dir,
        "figures": figures,
        "md": md,
        "html": render.render_html(md),
    }


def test_every_figure_family_is_drawn_or_skipped_with_why(published):
    figures, figures_dir = published["figures"], published["figures_dir"]
    data = load_run(published["processed"])
    fio = data.fio
    skipped = {e["name"]: e["reason"] for e in read_skipped(figures_dir)}
    assert all(skipped.values()) and not set(skipped) & set(figures), skipped
    listed = {name.split("-")[0] for name in [*figures, *skipped]}
    assert {"throughput", "heatmap", "ceiling", "loss"} <= listed, listed
    multi_host = fio["host"].nunique() > 1
    # one throughput figure per access pattern and config pattern: two never share bars
    for host, rw, pattern in (
        fio[["host", "rw", "pattern"]].drop_duplicates().itertuples(index=False)
    ):
        for metric in ("bw_bytes", "iops"):
            parts = ("throughput", host if multi_host else "", rw, pattern, metric)
            assert "-".join(p for p in parts if p) in figures
    # one cost chart per comparison: the headline's is "loss"
    charts = {name for name in [*figures, *skipped] if name.split("-")[0] == "loss"}
    assert charts == {"loss", *(f"loss-{v}-vs-{b}" for b, v in data.pairs[1:])}, charts
    if fio["busy_cpu_s_per_gib"].notna().any():
        assert "cpu" in listed, listed


def test_every_figure_carries_its_provenance_and_is_indexed(published):
    figures, figures_dir = published["figures"], published["figures_dir"]
    for name, (png, svg) in figures.items():
        assert png.stat().st_size > 0 and svg.stat().st_size > 0, name
        text = PILImage.open(png).text
        assert text.get("run") == "sample" and text.get("figure") == name, (name, text)
        assert text.get("notebook") == NOTEBOOK and text.get("git_commit"), (name, text)
        assert text.get("config_hash") and text.get("fio_version"), (name, text)
        assert "luksbench" in svg.read_text()[:4000], name
    for name in (n for n in figures if n.startswith("ceiling")):
        params = json.loads(PILImage.open(figures[name][0]).text["params"])
        for c in params["ceilings"]:
            assert (c["read_ceiling_mib_s"] is None) == bool(c["unavailable"]), c
    index = read_index(figures_dir)
    assert [e["name"] for e in index] == list(figures), index
    for e in index:
        assert [figures_dir / f for f in e["files"]] == figures[e["name"]], e
        assert e["caption"] and e["inputs"], e


def test_the_paper_holds_its_sections_tables_and_figures(published):
    md, processed = published["md"], published["processed"]
    meta, _ = render.split_front_matter(md.read_text())
    text = md.read_text()
    assert meta.get("title") and meta.get("date") and meta.get("author"), meta
    assert "**TL;DR.**" in text and "**Recommendation.**" in text
    assert "dm-crypt" in text, "the paper must say which backend it measured"
    assert "## Loss tables" in text and "% loss |" in text
    assert "## Compared with published results" in text and "SCS" in text
    assert not re.search(r"\bnan\b", text, re.IGNORECASE), "a missing value leaked into the paper"
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links and all((md.parent / unquote(link)).exists() for link in links)
    # one section per comparison in the loss tables and in the results, the headline first
    pairs = load_run(processed).pairs
    for part in ("## Loss tables", "## Results"):
        section = text.split(part)[1].split("\n## ")[0]
        found = re.findall(r"^### `([^`]+)` against `([^`]+)`$", section, re.MULTILINE)
        assert [(b, v) for v, b in found] == pairs, (part, found, pairs)
    # every optional stack that could not be built is listed with its reason
    for u in unavailable_stacks(pd.read_parquet(processed / "stacks.parquet")):
        assert f"Stack `{u['stack']}`" in text and u["reason"] in text, u
    page = published["html"].read_text()
    assert "<table>" in page and page.count('src="data:image/png;base64,') == len(links)
