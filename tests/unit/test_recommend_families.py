"""The paper's recommendation weighs every metric an operator pays for, on real processed tables:
simulated raw runs (fio JSON with json+ histograms, tests/simulate.py) through ingest, the loss
stage and the paper's own rendering. Seeded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from simulate import simulate_logs, write_raw_reps

from luksbench.analysis import ingest
from luksbench.analysis.loss import write_loss
from luksbench.publish import paper, render

WORKLOADS, JOBS, PAIRS = 4, 4, 3  # 16 cells


def simulated_paper(base: Path, tail_log: float, tail_sd=0.02, ios=None, seed=1) -> tuple:
    """(recommendation context, rendered Markdown) of a run whose bandwidth does not change
    (each arm's noise sd 0.004) and whose p99 and p99.9 latency move by e^tail_log (each run's
    tail noise sd ``tail_sd``); ``ios`` completions per run in the histograms."""
    rng = np.random.default_rng(seed)
    cells = WORKLOADS * JOBS
    lb, lv = simulate_logs(rng, cells, PAIRS, np.full(cells, 0.004), np.zeros(cells), 0)
    tails = {
        "plain": rng.normal(0, tail_sd, (cells, PAIRS)),
        "luks": tail_log + rng.normal(0, tail_sd, (cells, PAIRS)),
    }
    raw, out = base / "raw" / "sim", base / "processed" / "sim"
    logs = {"plain": lb, "luks": lv}
    write_raw_reps(raw, logs, [range(1, PAIRS + 1)] * WORKLOADS, JOBS, tails=tails, ios=ios)
    ingest.write_processed(raw, out)
    write_loss(out)
    md = render.render_paper(out, base / "figures", base / "paper" / "index.md", "sim")
    context = paper.paper_context(out, base / "figures", base / "paper" / "index.md", "sim")
    return context["recommendation"], Path(md).read_text()


def _section(md: str) -> str:
    return md.split("**Recommendation.**")[1].split("\n## ")[0]


def test_latency_material_with_bandwidth_negligible_is_no_turn_it_on(tmp_path):
    """The review's case: bandwidth negligible in 16 of 16 cells, p99 latency +80 % in all."""
    rec, md = simulated_paper(tmp_path, np.log(1.8))
    (verdict,) = rec["verdicts"]
    assert not verdict["turn_on"]
    assert "do not turn it on" in verdict["text"] and "turn it on:" not in verdict["text"]
    assert "p99 completion latency and p99.9 completion latency stand in the way" in verdict["text"]
    bandwidth, p99, p999 = verdict["metrics"]
    assert bandwidth.startswith("Bandwidth loss (5 / 20 % margins): no cost")
    assert "in 16 of 16 cells" in bandwidth
    assert p99.startswith("p99 completion latency increase (10 / 50 % margins): material (listed")
    assert "Benjamini-Hochberg" in p99 and "in 16 of 16 cells" in p99
    # the largest cell with its selection-adjusted interval and the decision on that interval
    assert "adjusted for picking it from 16 cells: material on it." in p99
    assert p999.startswith("p99.9 completion latency increase") and "in 16 of 16 cells" in p999
    assert verdict["not_measured"] == "Busy CPU time per GiB and Busy CPU time per I/O"
    section = _section(md)
    assert verdict["text"] in section and f"- {p99}" in section
    # the TL;DR quotes the largest latency increase with its selection-adjusted interval
    tldr = md.split("**TL;DR.**")[1].split("\n\n")[0]
    assert "adjusted for picking the largest of 16 cells" in tldr


def test_nothing_in_the_way_is_turn_it_on_and_a_withheld_metric_is_named(tmp_path):
    """Tails unchanged: turn it on. With 5,000 completions per run p99.9 (10,000 needed) is
    withheld in every cell: not evidence for turning it on, and the paper says so."""
    rec, md = simulated_paper(tmp_path, 0.0, tail_sd=0.005, ios=5000, seed=2)
    (verdict,) = rec["verdicts"]
    assert verdict["turn_on"] and "turn it on: no cell of" in verdict["text"]
    assert "Not decided in every cell" in verdict["text"]
    assert verdict["text"].endswith("p99.9 completion latency.")
    p999 = next(m for m in verdict["metrics"] if m.startswith("p99.9"))
    assert "not decided in 16 of 16 cells (too few I/Os: 16)" in p999
    assert "Bandwidth" in verdict["text"].split("Not decided")[0]
    assert "p99.9" not in verdict["text"].split("Not decided")[0]
    assert verdict["text"] in _section(md) and f"- {p999}" in _section(md)


@pytest.mark.slow
def test_an_undecided_cell_reaching_the_material_margin_stands_in_the_way(tmp_path):
    """p99 latency +40 % with noisy tails: intervals straddle the 50 % margin: not decided
    material, but not turn it on either."""
    rec, _ = simulated_paper(tmp_path, np.log(1.4), tail_sd=0.08, seed=3)
    (verdict,) = rec["verdicts"]
    assert not verdict["turn_on"] and "stand in the way" in verdict["text"]
    p99 = next(m for m in verdict["metrics"] if m.startswith("p99 "))
    assert "undecided, the interval reaching past 50 % (material)" in p99
