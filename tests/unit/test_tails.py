"""Tail latency from the json+ histograms: fio's own percentile rule, runs of several job entries
merged, percentiles withheld where too few I/Os lie beyond, table and figure the same quantity.
Real fio json+ output: the shipped sample (fio 3.x on the development machine)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from luksbench.analysis import ingest, tails
from luksbench.formats import fio as fio_format
from luksbench.publish import figures, figures_arms, paper_sentences, text
from luksbench.publish.paper_tables import loss_sections
from luksbench.publish.text import metric_heading

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"


@pytest.fixture(scope="module")
def processed(processed_sample) -> Path:
    return processed_sample


def fio_rule(bins: list[tuple[int, int]], percent: float) -> float:
    """fio's stat.c: the first bin whose cumulative count reaches percent/100 of the total."""
    ns, counts = np.array(sorted(bins)).T
    cum = np.cumsum(counts)
    return float(ns[np.argmax(cum >= percent / 100.0 * cum[-1])])


def test_percentiles_are_fios_own_where_every_run_of_the_cell_has_enough_ios_beyond(processed):
    """Withheld for the whole cell (both stacks, every rep) where its fewest-I/O run has too few
    beyond: withholding only that run would drop the slow runs, those with the high tails."""
    fio = pd.read_parquet(processed / "fio.parquet")
    rows = fio[fio["clat_ios"].notna()]
    assert len(rows) == 96
    fewest = rows.groupby(tails.CELL_KEYS)["clat_ios"].transform("min")
    reported = withheld = 0
    for i, row in rows.iterrows():
        own = fio_format.parse_fio_file(SAMPLE / row["file"], warn=lambda _: None)
        own = next(r for r in own if r["direction"] == row["direction"])
        for column, percent in tails.PERCENTILES.items():
            beyond = fewest[i] * (100 - percent) / 100
            if beyond >= tails.MIN_BEYOND:
                assert row[column] == own[column]  # the histogram gives fio's very number
                reported += 1
            else:
                assert math.isnan(row[column]) and own[column] is not None
                withheld += 1
    assert reported and withheld  # the sample has both: 1 MiB cells of 2 s have few I/Os


def test_a_run_of_several_job_entries_is_one_mixture(tmp_path):
    """Two job entries of one run (numjobs without group_reporting): the percentile of the summed
    histogram, not the mean of the entries' percentiles."""
    raw = tmp_path / "raw" / "mix"
    shutil.copytree(SAMPLE, raw)
    for p in [raw, *raw.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    fast = json.loads((raw / "vm/fio/plain/randread-4k-qd1/rep1.json").read_text())
    slow = json.loads((raw / "vm/fio/plain/randread-4k-qd32/rep1.json").read_text())
    slow["jobs"][0]["jobname"] = fast["jobs"][0]["jobname"]
    fast["jobs"].append(slow["jobs"][0])
    target = raw / "vm/fio/plain/randread-4k-qd1/rep1.json"
    target.write_text(json.dumps(fast))
    fio, _ = ingest.fio_and_latency_tables(raw, workers=1)
    rows = fio[(fio["file"] == "vm/fio/plain/randread-4k-qd1/rep1.json")]
    assert len(rows) == 2 and rows["job_slot"].nunique() == 1
    bins = fio_format.document_histograms(fast)
    merged = [b for (_, d), hist in bins.items() if d == "read" for b in hist]
    own = [fio_format.parse_fio_file(target, warn=lambda _: None)[i] for i in (0, 1)]
    for column, percent in tails.PERCENTILES.items():
        mixture = fio_rule(merged, percent)
        assert (rows[column] == mixture).all()
        mean_of_quantiles = np.mean([o[column] for o in own])
        assert mixture != pytest.approx(mean_of_quantiles, rel=0.01)
    assert (rows["clat_ios"] == sum(c for _, c in merged)).all()


def test_the_loss_table_says_too_few_ios_and_the_paper_too(processed):
    loss = pd.read_parquet(processed / "loss.parquet")
    fio = pd.read_parquet(processed / "fio.parquet")
    p999 = loss[loss["metric"] == "clat_p999_ns"]
    few = fio.groupby("workload")["clat_ios"].min() < tails.min_ios(99.9)
    # randwrite-4k-qd1: one plain rep (4,226 I/Os) is short of 10,000, the others are not
    assert few.any() and (fio.groupby("workload")["clat_ios"].max()[few] >= 10_000).any()
    for _, row in p999.iterrows():
        if few[row["workload"]]:
            assert row["note"].startswith(tails.TOO_FEW), row["note"]
            assert row["n"] == 0 and row["verdict"] == "insufficient"
        else:
            assert row["note"] == "" and row["n"] == 3
    empty = p999[p999["n"] == 0]
    assert len(empty) and empty["effect_pct"].isna().all()
    assert (empty["verdict"] == "insufficient").all()
    section = next(s for s in loss_sections(loss) if s["metric"] == "clat_p999_ns")
    shown = {r["cell"]: r["effect"] for r in section["rows"]}
    assert list(shown.values()).count(tails.TOO_FEW) == len(empty)
    assert "n/a" not in shown.values()


def test_figure_points_are_the_loss_tables_percentiles(processed):
    loss = pd.read_parquet(processed / "loss.parquet")
    arms = pd.read_parquet(processed / "arms.parquet")
    lat = pd.read_parquet(processed / "latency.parquet")
    rows = loss[loss["metric"].isin(list(tails.PERCENTILES)) & (loss["rw"] == "randread")]
    complete = rows[(rows["n"] == 3) & (rows["n_dropped"] == 0)]
    keys = ["rw", "bs_bytes", "iodepth", "direction", "metric"]
    keyed = arms.set_index(["stack", *keys])["mean"]
    assert len(complete)
    for _, r in complete.iterrows():
        for side in ("baseline", "variant"):
            got = keyed[(r[side], *(r[k] for k in keys))]
            assert got == pytest.approx(r[f"{side}_mean"], rel=1e-12)
    fig = figures_arms.latency_figure(lat, arms, "randread", stacks=["plain", "luks"])
    points = sorted(
        round(float(y), 9)
        for ax in fig.axes
        for line in ax.get_lines()
        if line.get_marker() == "o"
        for y in line.get_ydata()
    )
    shown = arms[(arms["rw"] == "randread") & arms["metric"].isin(list(tails.PERCENTILES))]
    expected = sorted(round(v / 1e6, 9) for v in shown["mean"].dropna())
    assert points == expected and len(points) > 0


def test_the_tldr_counts_withheld_cells_so_they_add_up_to_the_matrix(processed):
    loss = pd.read_parquet(processed / "loss.parquet")
    sentences = paper_sentences.tldr_sentences(loss, [{"backend_short": "fio"}], {"reps_text": "3"})
    cells = loss.drop_duplicates(["host", "workload", "job_slot", "direction"])
    for metric in tails.PERCENTILES:
        rows = loss[loss["metric"] == metric]
        start = paper_sentences.sentence_start(metric_heading(metric))
        text = next(s for s in sentences if s.startswith(start))
        counts = re.search(r"margins\): (.*?) of (\d+) cells", text)
        assert int(counts[2]) == len(cells) == len(rows), text
        assert sum(int(n) for n in re.findall(r"(\d+) [a-z]", counts[1])) == len(cells), text
        withheld = int(rows["note"].str.startswith(tails.TOO_FEW).sum())
        assert (f"{withheld} withheld ({tails.TOO_FEW})" in text) == (withheld > 0), text
    assert any("withheld" in s for s in sentences)


def test_the_heatmap_marks_each_cell_with_the_loss_tables_decision(processed):
    loss = pd.read_parquet(processed / "loss.parquet")
    for metric in ("bw_bytes", "clat_p99_ns"):
        rows = loss[loss["metric"] == metric]
        fig = figures.loss_heatmap(loss, metric)
        shown = sorted(t.get_text().split("\n")[-1] for ax in fig.axes for t in ax.texts)
        withheld = rows["note"].str.startswith(tails.TOO_FEW)
        expected = [text.decision_kind(d) for d in rows.loc[~withheld, "decision"]]
        expected += ["I/Os"] * int(withheld.sum())  # "too few\nI/Os", as the table says
        assert shown == sorted(expected), metric
        assert {"undecided", "material"} <= set(shown) or {"undecided", "moderate"} <= set(shown)


def test_the_tldr_counts_every_withheld_row_with_its_reason(processed):
    from luksbench.analysis.cpucost import NOT_ABOVE_IDLE

    loss = pd.read_parquet(processed / "loss.parquet")
    cpu = loss.index[loss["metric"] == "busy_cpu_s_per_gib"]
    loss.loc[cpu[:2], ["note", "n", "decision"]] = [NOT_ABOVE_IDLE, 0, "insufficient"]
    sentences = paper_sentences.tldr_sentences(loss, [{"backend_short": "fio"}], {"reps_text": "3"})
    text = next(s for s in sentences if s.startswith(metric_heading("busy_cpu_s_per_gib")))
    counts = re.search(r"margins\): (.*?) of (\d+) cells", text)
    assert int(counts[2]) == len(cpu), text
    assert sum(int(n) for n in re.findall(r"(\d+) [a-z]", counts[1])) == len(cpu), text
    assert "2 withheld (net CPU <= 0)" in text, text
