"""Every sentence of the paper computed from the rows it talks about: each test builds a situation
(a withheld metric, all CPU withheld, a saturated or fio-bound baseline, sequential cells, a cell
or stack without results) in the processed tables of the shipped sample and checks the sentence
against the table; withheld data are not drawn as data; the answer comes first."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from luksbench.analysis.cpucost import NOT_ABOVE_IDLE
from luksbench.analysis.ingest_tables import plan_frames
from luksbench.analysis.loss import CPU_METRICS
from luksbench.analysis.tails import TOO_FEW
from luksbench.publish import (
    catalog,
    figures,
    figures_arms,
    paper_figures,
    paper_gaps,
    paper_sentences,
    paper_tables,
    references,
)
from luksbench.publish.render import render_paper
from luksbench.publish.run import Run, load_run
from luksbench.publish.style import interval_bars
from luksbench.publish.text import decision_kind, metric_heading

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def processed(processed_sample) -> Path:
    return processed_sample


def _situation(processed: Path, tmp: Path, **tables: pd.DataFrame) -> Path:
    """A copy of the sample's processed tables with ``tables`` replacing some."""
    out = tmp / "processed"
    shutil.copytree(processed, out, ignore=shutil.ignore_patterns("*.csv", "README.md"))
    for name, table in tables.items():
        table.to_parquet(out / f"{name}.parquet")
    return out


def _paper(processed_dir: Path, tmp: Path, figures_dir: Path | None = None) -> str:
    out = render_paper(processed_dir, figures_dir or tmp / "none", tmp / "post" / "index.md", "s")
    return out.read_text()


def _withhold_cpu(loss: pd.DataFrame, which=None) -> pd.DataFrame:
    """The loss table with the CPU rows (all, or ``which`` of them) withheld as the CPU cost
    step withholds them: net CPU within idle noise."""
    loss = loss.copy()
    rows = loss["metric"].isin(CPU_METRICS)
    if which is not None:
        rows &= which(loss)
    loss.loc[rows, ["note", "decision", "verdict"]] = [
        NOT_ABOVE_IDLE,
        "insufficient",
        "insufficient",
    ]
    loss.loc[rows, "n"] = 0
    loss.loc[rows, ["effect_pct", "ci_low", "ci_high"]] = np.nan
    return loss


def _section(text: str, heading: str) -> str:
    """The text of the Markdown section under ``heading`` (up to the next one of its level)."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    nxt = re.search(rf"^{level} ", text[start + len(heading) :], flags=re.M)
    return text[start : start + len(heading) + (nxt.start() if nxt else len(text))]


def test_a_withheld_metric_is_no_cell_on_one_stack_only(processed, tmp_path):
    loss = pd.read_parquet(processed / "loss.parquet")
    assert (loss["note"].str.startswith(TOO_FEW) & loss["n"].eq(0)).any()  # p99.9 withheld
    text = _paper(_situation(processed, tmp_path, loss=_withhold_cpu(loss)), tmp_path)
    assert "one stack only" not in text
    assert paper_gaps.unpaired_cells(_withhold_cpu(loss)) == []


def test_a_cell_measured_on_one_stack_is_named_with_the_stack_that_has_results(processed):
    loss = pd.read_parquet(processed / "loss.parquet")
    cell = loss["workload"] == "randread-4k-qd1"
    loss.loc[cell, ["n", "variant_mean", "effect_pct", "ci_low", "ci_high"]] = [0, *[np.nan] * 4]
    loss.loc[cell, "note"] = ""
    cells = paper_gaps.unpaired_cells(loss)
    assert cells == ["randread-4k-qd1 (only `plain`, comparison `luks` vs `plain`)"]
    run = load_run(processed)
    run = Run(run.processed_dir, run.tables | {"loss": loss})
    sentence = next(g for g in paper_gaps.gaps(run, {"latency", "cpu"}) if "one stack" in g)
    assert sentence.startswith("1 cells have results on one stack only")


def test_a_row_whose_pairs_were_all_dropped_is_said_so_not_called_one_stack_only(processed):
    loss = pd.read_parquet(processed / "loss.parquet")
    row = loss.index[(loss["workload"] == "read-4k-qd1") & (loss["metric"] == "bw_bytes")][0]
    loss.loc[row, ["n", "n_dropped", "effect_pct"]] = [0, 3, np.nan]
    assert paper_gaps.unpaired_cells(loss) == []
    assert paper_gaps.all_pairs_dropped(loss) == ["`luks` vs `plain` read-4k-qd1 Bandwidth"]


def test_a_planned_stack_without_results_is_named(processed):
    run = load_run(processed)
    planned = run.plan_stacks
    xts2 = planned[planned["stack"] == "luks"].assign(stack="xts2")
    run = Run(run.processed_dir, run.tables | {"plan_stacks": pd.concat([planned, xts2])})
    said = [g for g in paper_gaps.gaps(run, {"latency", "cpu"}) if "no results" in g]
    assert len(said) == 1 and "`xts2`" in said[0], said


def test_all_cpu_withheld_no_order_effect_over_cells_the_table_withholds(processed, tmp_path):
    loss = _withhold_cpu(pd.read_parquet(processed / "loss.parquet"))
    order = pd.read_parquet(processed / "order.parquet")
    cpu = order[order["metric"].isin(CPU_METRICS)]
    assert (cpu["n_cells"] >= 2).all()  # the order table has CPU cells all the same
    quoted = paper_sentences.order_effect_phrases(order, "plain", "luks", loss)
    assert quoted and not any(metric_heading(m) in q for m in CPU_METRICS for q in quoted)
    # every quoted count is the number of cells the loss table decides for that metric
    for q in quoted:
        name, n = re.match(r"(.*?) -?[\d.]+ % .* over (\d+) cells", q).groups()
        metric = next(m for m in order["metric"] if metric_heading(m) == name)
        decided = loss[(loss["metric"] == metric) & loss["note"].eq("") & loss["n"].ge(2)]
        assert int(n) == len(decided), q
    withheld = paper_sentences.order_withheld(order, "plain", "luks", loss)
    assert len(withheld) == len(CPU_METRICS)
    assert all("all its cells are withheld (net CPU <= 0)" in w for w in withheld)
    text = _paper(_situation(processed, tmp_path, loss=loss), tmp_path)
    methodology = _section(text, "## Methodology")
    for metric in CPU_METRICS:
        assert not re.search(rf"{metric_heading(metric)} -?[\d.]+ % \[", methodology), metric


def test_all_cpu_withheld_draws_no_cpu_figure_and_says_why(processed, tmp_path):
    loss = _withhold_cpu(pd.read_parquet(processed / "loss.parquet"))
    run = load_run(_situation(processed, tmp_path, loss=loss))
    specs = {s.name: s for s in catalog.figure_specs(run)}
    cpu = [s for s in specs.values() if s.family == "cpu"]
    assert cpu and all("all cells withheld (net CPU <= 0)" in s.skip for s in cpu)
    assert not specs["heatmap-bw_bytes"].skip and not specs["loss"].skip
    fig = figures.loss_figure(run.loss)
    titles = {ax.get_title() for ax in fig.axes if ax.get_visible()}
    assert not titles & {metric_heading(m) for m in CPU_METRICS}, titles
    assert "Not drawn: " in fig.get_suptitle()
    title = fig.get_suptitle().replace("\n", " ")
    for metric in CPU_METRICS:
        assert f"{metric_heading(metric)}: all cells withheld" in title
    plt.close(fig)
    # the index lists them as skipped, and the paper says why in their place
    figures_dir = tmp_path / "figures"
    catalog.write_index(figures_dir.mkdir() or figures_dir, "s", list(specs.values()))
    skipped = catalog.read_skipped(figures_dir)
    assert {e["name"] for e in skipped} >= {s.name for s in cpu}
    assert not {e["name"] for e in catalog.read_index(figures_dir)} & {s.name for s in cpu}
    sections = paper_figures.figure_sections(figures_dir, tmp_path / "p.md")
    said = next(s for s in sections if s["kind"] == "cpu")
    assert not said["figures"] and len(said["skipped"]) == len(cpu)
    # the reason is Markdown-escaped as every text in the paper: "<" is written "&lt;"
    assert all("net CPU <= 0" in html.unescape(s["reason"]) for s in said["skipped"])


def test_partly_withheld_cells_are_marked_not_drawn(processed):
    loss = pd.read_parquet(processed / "loss.parquet")
    loss = _withhold_cpu(loss, lambda t: t["bs_bytes"].eq(4096))
    arms = pd.read_parquet(processed / "arms.parquet")
    metric = "busy_cpu_s_per_gib"
    marked = figures.withheld_by_cell(loss, metric)
    assert len(marked) == 8 and set(marked.values()) == {"net CPU <= 0"}
    fig = figures_arms.cpu_figure(arms, metric, withheld_cells=marked)
    notes = [t for ax in fig.axes for t in ax.texts if t.get_text().startswith("withheld")]
    assert len(notes) == len(marked)
    heights = [p.get_height() for ax in fig.axes for p in ax.patches]
    drawn = arms[(arms["metric"] == metric) & arms["bs_bytes"].ne(4096)]
    assert np.isfinite(heights).sum() == len(drawn)  # no bar where the cell is withheld
    plt.close(fig)
    fig = figures.loss_figure(loss)
    panel = next(ax for ax in fig.axes if ax.get_title() == metric_heading(metric))
    assert sum(t.get_text() == "withheld: net CPU <= 0" for t in panel.texts) == 8
    plt.close(fig)


@pytest.mark.parametrize(
    ("flags", "bias"),
    [
        ({"fio_bound": True, "cpu_saturated": False}, paper_tables.BIAS_FIO_BOUND),
        ({"fio_bound": False, "cpu_saturated": True}, paper_tables.BIAS_UNKNOWN),
        ({"fio_bound": True, "cpu_saturated": True}, paper_tables.BIAS_UNKNOWN),
    ],
)
def test_a_limited_baseline_says_the_direction_of_its_bias_only_where_known(
    processed, tmp_path, flags, bias
):
    loss = pd.read_parquet(processed / "loss.parquet")
    cell = loss["workload"] == "read-4k-qd32"
    for flag, value in flags.items():
        loss[flag] = loss[flag].astype(bool)
        loss.loc[cell, flag] = value
    listed = paper_tables.limited_cells(loss)
    assert [c["cell"] for c in listed] == ["read-4k-qd32 read"]
    assert listed[0]["bias"] == bias
    text = _section(
        _paper(_situation(processed, tmp_path, loss=loss), tmp_path),
        "## Baselines limited by fio or the CPU",
    )
    row = next(line for line in text.splitlines() if "read-4k-qd32" in line)
    assert bias in row
    assert ("lower bound" in row) == (not flags["cpu_saturated"])


def test_one_word_per_row_everywhere_the_decision(processed, tmp_path):
    loss = pd.read_parquet(processed / "loss.parquet")
    # rows whose verdict and decision differ: significant but undecided
    differ = loss[(loss["verdict"] == "significant") & loss["decision"].str.startswith("undec")]
    assert len(differ)
    refs = references.read_references()
    scs = references.compare_scs(loss, refs["scs"])
    assert scs["rows"]
    for row in scs["rows"]:
        assert not re.search("significant|inconclusive|equivalent", row["ours"]), row
    words = {decision_kind(d) for d in loss["decision"]}
    assert all(re.search(r"\((\w+(?: gain)?),", r["ours"])[1] in words for r in scs["rows"])
    fig = figures.loss_figure(loss)
    legend = fig.legends[0]
    assert legend.get_title().get_text() == "decision"
    labels = {t.get_text() for t in legend.get_texts()}
    assert labels and labels <= words, labels
    plt.close(fig)


def test_each_heatmap_caption_names_its_effect():
    assert catalog.caption("heatmap-bw_bytes") == "Bandwidth: loss heatmap"
    assert catalog.caption("heatmap-clat_p99_ns") == "p99 completion latency: increase heatmap"


def test_no_path_of_the_measuring_machine_in_the_paper(processed, tmp_path):
    env = pd.read_parquet(processed / "env.parquet")
    scratch = "/srv/secret-box/luksbench/data/scratch/s/vm"
    doc = {"plan": {"scratch_dir": scratch}}
    doc["job_devices"] = [
        {"device": scratch.rsplit("/", 3)[0], "block_device": "sda", "numa_node": None}
    ]
    frames = plan_frames(env["run"].iloc[0], env["host"].iloc[0], doc)  # as ingest writes them
    env = env.assign(scratch_dir=scratch)
    situation = _situation(processed, tmp_path, env=env, job_devices=frames["job_devices"])
    text = _paper(situation, tmp_path)
    assert "/srv/secret-box" not in text
    assert "the scratch directory's disk, `sda`" in text
    machine = render_paper(
        situation, tmp_path / "none", tmp_path / "asked" / "index.md", "s", machine_paths=True
    )
    assert "/srv/secret-box" in machine.read_text()


def test_log_axes_clip_intervals_at_the_edge_not_at_an_invented_bound():
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    interval_bars(ax, [0, 1], [2.0, 2.0], [1.0, 5.0], 0.8, "C0", "arms")
    ax.set_ylim(0.5, 20)
    closed = [c for c in ax.collections]  # the error bar of the interval [1, 3]
    segments = np.concatenate([c.get_segments() for c in closed])
    assert np.allclose(sorted(segments[:, :, 1].ravel()), [1.0, 3.0])
    arrows = [t for t in ax.texts if t.arrow_patch is not None]
    assert len(arrows) == 1  # [-3, 7]: a whisker from 7 to the panel's edge, an arrow head
    (start, end) = arrows[0].xyann, arrows[0].xy
    assert start == (1, 7.0) and end == (1, 0) and arrows[0].xycoords == ("data", "axes fraction")
    plt.close(fig)


def test_no_ceiling_figure_without_a_ceiling(processed):
    run = load_run(processed)  # the sample's cipher benchmark could not run
    spec = next(s for s in catalog.figure_specs(run) if s.family == "ceiling")
    assert spec.skip.startswith("no crypto ceiling to draw") and "algif_skcipher" in spec.skip


def test_the_answer_comes_first_then_the_summary_figure(processed, tmp_path):
    figures_dir = tmp_path / "figures"
    run = load_run(processed)
    specs = catalog.figure_specs(run)
    figures_dir.mkdir()
    catalog.write_index(figures_dir, "s", specs)
    text = _paper(processed, tmp_path, figures_dir)
    body = text.split("\n---\n", 1)[1]
    order = [
        body.index("# "),
        body.index("**Recommendation.**"),
        body.index("![Bandwidth: loss heatmap](figures/heatmap-bw_bytes.png)"),
        body.index("**TL;DR.**"),
        body.index("## What was measured"),
        body.index("## Loss tables"),
    ]
    assert order == sorted(order), order
    assert body.count("](figures/heatmap-bw_bytes.png)") == 1  # not a second time below


def test_iops_at_a_fixed_block_size_is_folded_into_bandwidth(processed):
    loss = pd.read_parquet(processed / "loss.parquet")
    folded = paper_tables.same_test_as_bandwidth(loss)
    iops, bw = loss[folded], loss[loss["metric"] == "bw_bytes"]
    assert len(iops) == len(bw) and (loss[loss["metric"] == "iops"].index == iops.index).all()
    key = ["workload", "direction", "job_slot"]
    same = iops.set_index(key)["decision"].sort_index()
    assert same.equals(bw.set_index(key)["decision"].sort_index())
    assert not [t for t in paper_tables.scs_tables(loss) if ": IOPS" in t["title"]]
    titles = [t["title"] for t in paper_tables.scs_tables(loss) if "bandwidth" in t["title"]]
    assert titles and all("(and IOPS: the same test" in t for t in titles)
    sections = paper_tables.loss_sections(loss)
    assert "iops" not in {s["metric"] for s in sections}
    assert next(s for s in sections if s["metric"] == "bw_bytes")["iops_folded"]
    # an IOPS row with a decision of its own keeps its row
    other = loss.copy()
    first = other.index[other["metric"].eq("iops")][0]
    other.loc[first, "decision"] = "material"
    assert not paper_tables.same_test_as_bandwidth(other)[first]
    kept = next(s for s in paper_tables.loss_sections(other) if s["metric"] == "iops")
    assert len(kept["rows"]) == 1


def test_drift_and_moderation_sentences_count_the_rows_they_talk_about():
    """The intervals' adjustments are said from the loss table's drift and moderation columns:
    nothing widened, some widened (how many, by how much), some moderated, or none to say."""
    base = {
        "metric": "bw_bytes",
        "drift_rho": 0.1,
        "drift_inflation": 1.0,
        "drift_widening_pct": 0.0,
        "moderated": False,
        "prior_df": float("nan"),
    }
    (quiet,) = paper_sentences.interval_adjustments(pd.DataFrame([base]))
    assert "No drift" in quiet and "stand as computed" in quiet
    rows = [
        base,
        {**base, "drift_rho": 0.5, "drift_inflation": 1.44, "drift_widening_pct": 20.0},
        {**base, "metric": "clat_p99_ns", "drift_rho": 0.5, "drift_inflation": 1.21},
        {**base, "drift_inflation": float("nan"), "moderated": True, "prior_df": 4.0},
    ]
    rows[2]["drift_widening_pct"] = 10.0
    drift, moderated = paper_sentences.interval_adjustments(pd.DataFrame(rows))
    assert "bandwidth, p99 completion latency" in drift and "2 intervals were widened" in drift
    assert "15 % in the median and 20 % at most" in drift and "0.50 at most" in drift
    assert moderated.startswith("1 sessions interval(s)") and "4.0 in the median" in moderated
    no_columns = pd.DataFrame([{"metric": "bw_bytes"}])
    assert paper_sentences.interval_adjustments(no_columns) == []
