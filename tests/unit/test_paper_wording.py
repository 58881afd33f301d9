"""The TL;DR's wording on the shipped sample: the largest cell's sentence says which interval each
decision rests on (so it cannot read as contradicting the tables), every sentence starts with a
capital, and the CPU metrics say what they measure (whole machine, gross or net)."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from luksbench.analysis.ingest import read_processed
from luksbench.analysis.stats import METRIC_FAMILIES
from luksbench.publish import render
from luksbench.publish.paper_sentences import sentence_start, tldr_sentences
from luksbench.publish.text import cpu_basis, cpu_net, decision_words, metric_heading

HOSTS = [{"backend_short": "userspace"}]
MATRIX = {"reps_text": "3"}


@pytest.fixture(scope="module")
def tables(processed_sample) -> dict[str, pd.DataFrame]:
    return read_processed(processed_sample)


def largest_rows(loss: pd.DataFrame) -> pd.DataFrame:
    return loss[loss["largest"].eq(True) & loss["derived_from"].fillna("").eq("")]


def test_the_largest_cell_names_the_interval_of_each_decision(tables):
    loss = tables["loss"]
    sentences = tldr_sentences(loss, HOSTS, MATRIX)
    rows = largest_rows(loss)
    checked = set()
    for _, row in rows.iterrows():
        start = sentence_start(metric_heading(row["metric"])) + f" {row['effect']} ("
        (text,) = [s for s in sentences if s.startswith(start)]
        if " Largest " not in text:
            continue  # no cell costs: no largest-cell sentence
        adjusted = f"adjusted for picking the largest of {int(row['family_cells'])} cells"
        assert f"with the interval {adjusted}" in text
        said = f"{decision_words(row['selection_decision'])} on it"
        if row["selection_decision"] == row["decision"]:
            assert f"{said}, as on the cell's own interval in the tables" in text
        else:
            own = f"{decision_words(row['decision'])} on the cell's own interval"
            assert f"{said}; {own}, as the tables list it" in text, text
            checked.add(row["metric"])
    assert "bw_bytes" in checked, "the sample's largest bandwidth cell: material on its own"


def test_every_tldr_sentence_starts_with_a_capital(tables):
    tldr = " ".join(tldr_sentences(tables["loss"], HOSTS, MATRIX))
    starts = [s[0] for s in re.split(r"(?<=\.) (?=\S)", tldr)]
    assert all(c.isupper() or c == "`" for c in starts), tldr
    assert "Median completion latency increase" in tldr and "The p99 completion latency" in tldr
    assert sentence_start("p99.9 completion latency") == "The p99.9 completion latency"
    assert sentence_start("median x") == "Median x"


@pytest.mark.parametrize("net", [False, True])
def test_the_cpu_metrics_say_what_they_measure_once(tables, net):
    sentences = tldr_sentences(tables["loss"], HOSTS, MATRIX, cpu_net=net)
    basis = f"% margins; CPU of the whole machine, {cpu_basis(net)})"
    cpu = [s for s in sentences if any(metric_heading(m) in s for m in _cpu_metrics(tables))]
    assert basis in cpu[0] and sum(basis in s for s in sentences) == 1
    # said after the margins, not inside the metric's name ("Busy CPU time per GiB increase")
    assert re.search(r"per GiB increase \(\d+ / \d+ % margins; CPU of", cpu[0]), cpu[0]
    assert cpu_basis(not net) not in " ".join(sentences)


def _cpu_metrics(tables) -> list[str]:
    return [m for m in tables["loss"]["metric"].unique() if METRIC_FAMILIES.get(m) == "cpu"]


def test_the_paper_says_it_from_the_fio_tables_cpu_net(processed_sample, tmp_path):
    md = render.render_paper(
        processed_sample, tmp_path / "figures", tmp_path / "p" / "index.md", "s"
    )
    tldr = md.read_text().split("**TL;DR.**")[1].split("\n")[0]
    net = cpu_net(read_processed(processed_sample)["fio"])
    assert f"% margins; CPU of the whole machine, {cpu_basis(net)})" in tldr
