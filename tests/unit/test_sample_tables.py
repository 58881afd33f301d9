"""What the shipped sample's tidy tables and loss table must satisfy, row by row (the notebooks
keep a one-line sanity check each; these are the invariants they used to assert inline)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from luksbench.analysis import cells, stats
from luksbench.analysis.contrasts import resolve
from luksbench.analysis.ingest import read_processed, write_processed
from luksbench.analysis.loss import loss_tables, read_tables, write_loss
from luksbench.analysis.losssettings import default_settings

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
MIN_PAIRS = 3  # the sample's repetitions (config.yaml)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> dict:
    processed = tmp_path_factory.mktemp("sample")
    write_processed(SAMPLE, processed)
    settings = default_settings()
    write_loss(processed, settings)
    tables = read_tables(processed)
    without = loss_tables(tables, settings.replaced(exclude_outliers=True))["loss"]
    return read_processed(processed) | {
        "processed": processed,
        "loss": pd.read_parquet(processed / "loss.parquet"),
        "without": without,
        "settings": settings,
    }


def test_the_tidy_tables_hold_one_run_of_good_results_on_every_cell(sample):
    fio, env, problems = sample["fio"], sample["env"], sample["problems"]
    assert len(fio) > 0 and set(fio["run"]) == {"sample"}
    assert fio["stack"].nunique() >= 2
    assert env["backend"].notna().all(), "env.json without backend"
    assert (fio["error"] == 0).all() and (fio["bw_bytes"] > 0).all(), "a bad result in the table"
    assert problems[problems["severity"] == "excluded"].empty
    assert len(cells.half_pairs(fio)) == 0
    n_stacks = fio.groupby(["host", "workload"])["stack"].nunique()
    assert (n_stacks == fio["stack"].nunique()).all(), "some stack is missing a cell"


def _checked(loss: pd.DataFrame, fio: pd.DataFrame) -> pd.DataFrame:
    """Rows of a measured metric on their host (CPU of a fleet's servers is not), not withheld."""
    values = fio.groupby("host").count()
    rows = loss[[values.at[h, m] > 0 for h, m in zip(loss["host"], loss["metric"], strict=True)]]
    return rows[loss.loc[rows.index, "note"].eq("")]


def test_every_row_rests_on_its_pairs_and_withheld_rows_say_why(sample):
    loss, fio = sample["loss"], sample["fio"]
    assert set(loss["metric"]) == set(stats.DEFAULT_METRICS)
    withheld = loss["note"].ne("")
    assert (loss.loc[withheld, "verdict"] == "insufficient").all()
    checked = _checked(loss, fio)
    assert not (checked["n"] < MIN_PAIRS).any()
    assert (checked["n_dropped"] == 0).all()  # no half pairs in the sample
    unmeasured = loss[~withheld].drop(index=checked.index)
    assert ((unmeasured["n"] == 0) & (unmeasured["verdict"] == "insufficient")).all()


def test_intervals_verdicts_and_decisions_follow_their_definitions(sample):
    loss, settings = sample["loss"], sample["settings"]
    paired = _checked(loss, sample["fio"])
    paired = paired[paired["n"] >= 2]
    effect = paired["effect_pct"]
    assert ((paired["ci_low"] <= effect) & (effect <= paired["ci_high"])).all()
    assert loss["verdict"].isin(stats.VERDICTS).all()
    assert (paired["q_value"] >= paired["p_value"] - 1e-12).all()
    sig = loss[loss["verdict"] == "significant"]
    assert ((sig["ci_low"] > 0) | (sig["ci_high"] < 0)).all(), "significant but the CI holds 0"
    assert (sig["q_value"] <= 1 - settings.confidence).all()
    eq = loss[loss["verdict"] == "equivalent"]
    margin = settings.equivalence_margin_pct
    assert ((eq["equiv_low"] > -margin) & (eq["equiv_high"] < margin)).all()
    assert (loss["n"] < stats.BOOTSTRAP_MIN_PAIRS).eq(loss["boot_low"].isna()).all()


def test_the_comparisons_cells_and_outliers_are_as_asked(sample):
    loss, fio, settings = sample["loss"], sample["fio"], sample["settings"]
    pairs = list(dict.fromkeys(zip(loss["baseline"], loss["variant"], strict=True)))
    asked = resolve(fio["stack"].unique(), settings.baseline, settings.variant, [])
    assert pairs == asked and pairs[0] == (settings.baseline, settings.variant)
    assert not loss.duplicated(["baseline", "variant", *stats.CELL_KEYS, "metric"]).any()
    assert (loss["pattern"] == loss["workload"].map(cells.pattern_of)).all()
    keys = ["baseline", "variant", "host", "workload", "job_slot", "direction", "metric"]
    both = loss.merge(sample["without"], on=keys, suffixes=("", "_without"))
    unflagged = both[both["n_outliers"] == 0]
    same = unflagged["effect_pct"] == unflagged["effect_pct_without"]
    assert (same | unflagged[["effect_pct", "effect_pct_without"]].isna().all(axis=1)).all()


def test_the_arm_and_cpu_tables_are_written_beside_the_loss_table(sample):
    arms = pd.read_parquet(sample["processed"] / "arms.parquet")
    assert len(arms) and (arms["ci_half"].isna() | (arms["ci_half"] >= 0)).all()
    assert (pd.read_parquet(sample["processed"] / "cpu_loss.parquet")["n"] >= 0).all()
