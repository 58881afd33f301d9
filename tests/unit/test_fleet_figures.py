"""A fleet's figures are bounded by design: beyond config ``analysis.per_host_figures_max`` hosts
one figure per metric and comparison shows every host (no family per host), and the paper says
why the per-host figures are not there."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from simulate import fleet_tables

from luksbench.analysis import ingest
from luksbench.analysis.loss import write_loss
from luksbench.publish import catalog, figures, paper_figures
from luksbench.publish.run import load_run
from luksbench.studies import load_config

matplotlib.use("Agg")
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "raw" / "sample"


@pytest.fixture(scope="module")
def processed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample")
    ingest.write_processed(SAMPLE, out, workers=1)
    write_loss(out)
    return out


def _specs(processed: Path, tmp: Path, n_hosts: int, per_host_max: int):
    run = load_run(fleet_tables(processed, tmp / f"fleet{n_hosts}", n_hosts))
    return catalog.figure_specs(run, per_host_max)


def test_beyond_the_limit_the_figure_count_does_not_grow_with_the_hosts(processed, tmp_path):
    few, many = (_specs(processed, tmp_path, n, per_host_max=2) for n in (3, 12))
    assert [s.name for s in few] == [s.name for s in many]
    metrics = set(load_run(processed).loss["metric"])
    fleet = [s for s in many if s.family == "fleet"]
    assert len(fleet) == len(metrics)  # one per metric of the sample's one comparison
    assert all(s.skip.startswith("a fleet of 12 hosts") for s in many if s.family != "fleet")
    # up to the limit every host keeps its own families: the count grows with the hosts
    per_host = _specs(processed, tmp_path, 3, per_host_max=3)
    assert len(per_host) > len(few) and any(s.family == "throughput" for s in per_host)


def test_the_fleet_figure_draws_every_host_once_per_cell(processed, tmp_path):
    loss = load_run(fleet_tables(processed, tmp_path / "fleet", 12)).loss
    fig = figures.fleet_figure(loss, "bw_bytes")
    try:
        dots = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
        rows = loss[loss["metric"].eq("bw_bytes") & loss["effect_pct"].notna()]
        assert dots == len(rows) == 12 * rows["workload"].nunique()
        assert "on each of 12 hosts" in fig.get_suptitle()
    finally:
        plt.close(fig)


def test_the_paper_says_why_a_fleet_has_no_per_host_figures(processed, tmp_path):
    run = load_run(fleet_tables(processed, tmp_path / "fleet", 12))
    specs = catalog.figure_specs(run, 8)
    figures_dir = tmp_path / "figures"
    figures_dir.mkdir()
    catalog.write_index(figures_dir, "fleet", specs, {"hosts": 12, "per_host_max": 8})
    sections = paper_figures.figure_sections(figures_dir, tmp_path / "p" / "index.md")
    (fleet,) = [s for s in sections if s["kind"] == "fleet"]
    assert "This run has 12 hosts, more than `analysis.per_host_figures_max` (8)" in fleet["intro"]
    assert np.all([f["name"].startswith("fleet-") for f in fleet["figures"]])
    summary = paper_figures.summary_figure(sections)
    assert summary["name"] == "fleet-bw_bytes"


def test_the_limit_without_a_config_is_the_configs_default():
    config = load_config(Path(__file__).resolve().parents[2])
    assert catalog.per_host_figures_max() == config["analysis"]["per_host_figures_max"]
