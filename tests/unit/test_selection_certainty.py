"""What picking cells out of a family does to the paper's headline claims, and what the
selection-adjusted columns of the loss table (analysis/headline.py) give back: simulated raw runs
through ``luksbench loss``, each group of 16 cells one paper's family. Seeded; the measured
figures go to the README ("How sure: the statistics").

The scenario is the one where selection bites: 16 cells per paper with true throughput losses of
15-20 % (just below the 20 % material margin), each arm's noise sd 0.01-0.05, 3 pairs (the
default run). The paper quotes the largest loss (the cell whose own interval has the highest lower
end: picking it that way makes its own interval miss most often) and lists the material cells.
"""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from simulate import simulate_logs, write_raw_reps

from luksbench.analysis.headline import FAMILY_KEYS, HEADLINE_COLUMNS, selection_columns

PAPERS, CELLS, PAIRS = 300, 16, 3


def loss_rows(raw) -> pd.DataFrame:
    """``luksbench loss RAW --metric bw_bytes`` as a table."""
    done = subprocess.run(
        [sys.executable, "-m", "luksbench.cli", "loss", str(raw), "--metric", "bw_bytes"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return pd.read_csv(io.StringIO(done.stdout))


@pytest.mark.slow
def test_the_largest_cell_and_the_material_list_hold_after_selection(tmp_path):
    rng = np.random.default_rng(2028)
    n = PAPERS * CELLS
    true_loss = rng.uniform(15, 20, n)
    sigma = rng.uniform(0.01, 0.05, n)
    lb, lv = simulate_logs(rng, n, PAIRS, sigma, np.log1p(-true_loss / 100), order_drift=0)
    raw = tmp_path / "papers"
    write_raw_reps(raw, {"plain": lb, "luks": lv}, [range(1, PAIRS + 1)] * PAPERS, CELLS)
    rows = loss_rows(raw)
    assert len(rows) == n and set(HEADLINE_COLUMNS) <= set(rows.columns)
    assert (rows["family_cells"] == n).all()  # the CLI's family: the whole run
    # each workload (16 job slots) is one paper: its own family
    rows["paper"] = rows["iodepth"] - 1
    rows["truth"] = true_loss[rows["paper"] * CELLS + rows["job_slot"]]
    rows[HEADLINE_COLUMNS] = selection_columns(rows, by=[*FAMILY_KEYS, "paper"])
    assert (rows["family_cells"] == CELLS).all()

    picked = rows[rows["largest"]]
    assert len(picked) == PAPERS
    alone = picked["ci_low"].le(picked["truth"]) & picked["truth"].le(picked["ci_high"])
    adjusted = picked["selection_ci_low"].le(picked["truth"])
    adjusted &= picked["truth"].le(picked["selection_ci_high"])
    # the picked cell's own 95 % interval misses its truth more often than 1 in 20
    assert alone.mean() < 0.91, alone.mean()
    assert adjusted.mean() >= 0.93, adjusted.mean()

    # every truth is below the material margin: any cell called material is a false one
    said = rows[rows["decision"].eq("material")].groupby("paper").size()
    listed = rows[rows["material_listed"]].groupby("paper").size()
    false_said, false_listed = len(said) / PAPERS, len(listed) / PAPERS
    assert false_said > 0.05, false_said
    assert false_listed <= 0.025, false_listed
    print(
        f"largest cell covered: {alone.mean():.3f} own interval, {adjusted.mean():.3f} adjusted; "
        f"papers naming a false material cell: {false_said:.3f} on the decision, "
        f"{false_listed:.3f} listed"
    )
