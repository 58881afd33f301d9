"""The paper's numbers apart from its prose: the loss stage writes paper_numbers.parquet (one row
per number the answer quotes, naming the loss row it is read from), the TL;DR prints what that
table holds and refuses one written from another loss table; the template names only code that
exists."""

from __future__ import annotations

import importlib
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from luksbench.analysis import ingest
from luksbench.analysis.loss import write_loss
from luksbench.analysis.paper_numbers import NUMBERS_COLUMNS, main, quoted_rows
from luksbench.publish.render import render_paper

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
TEMPLATE = REPO / "src" / "luksbench" / "publish" / "templates" / "paper.md.j2"


@pytest.fixture(scope="module")
def processed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample")
    ingest.write_processed(SAMPLE, out, workers=1)
    write_loss(out)
    main([str(out / "paper_numbers.parquet")])
    return out


def _numbers(processed: Path) -> pd.DataFrame:
    return pd.read_parquet(processed / "paper_numbers.parquet")


def test_every_number_is_the_value_of_the_loss_row_it_names(processed):
    numbers, loss = _numbers(processed), pd.read_parquet(processed / "loss.parquet")
    assert list(numbers.columns) == NUMBERS_COLUMNS and numbers["key"].is_unique
    assert (processed / "paper_numbers.csv").exists()
    assert "## paper_numbers" in (processed / "README.md").read_text()  # in the dictionary
    largest = numbers[numbers["quantity"].eq("largest_effect_pct")]
    assert len(largest)  # the sample's 1 MiB cells cost: a largest effect is quoted
    for _, number in largest.iterrows():
        row = loss.iloc[int(number["source_row"])]
        assert row["largest"] and row["metric"] == number["metric"]
        assert number["value"] == pytest.approx(row["effect_pct"])
    high = numbers[numbers["quantity"].eq("largest_ci_high_pct")].iloc[0]
    assert high["value"] == loss.iloc[int(high["source_row"])]["selection_ci_high"]


def test_the_decision_counts_add_up_to_the_cells_of_their_family(processed):
    numbers, loss = _numbers(processed), pd.read_parquet(processed / "loss.parquet")
    quoted = quoted_rows(loss)
    for (variant, metric), family in numbers[numbers["metric"].ne("")].groupby(
        ["variant", "metric"]
    ):
        cells = family.loc[family["quantity"].eq("cells"), "value"].item()
        counts = family.loc[family["quantity"].eq("count"), "value"]
        assert counts.sum() == cells
        mine = quoted[quoted["variant"].eq(variant) & quoted["metric"].eq(metric)]
        assert cells == len(mine)
        material = family.loc[family["label"].eq("material"), "value"]
        assert material.sum() == mine["decision"].eq("material").sum()


def test_the_tldr_prints_the_numbers_table_not_its_own_arithmetic(processed, tmp_path):
    numbers = _numbers(processed)
    out = tmp_path / "processed"
    shutil.copytree(processed, out)
    key = numbers.loc[numbers["quantity"].eq("largest_effect_pct"), "key"].iloc[0]
    numbers.loc[numbers["key"].eq(key), "value"] = 987.6
    numbers.to_parquet(out / "paper_numbers.parquet")
    text = render_paper(out, tmp_path / "none", tmp_path / "post" / "index.md", "s").read_text()
    tldr = text.split("**TL;DR.**")[1].split("\n")[0]
    assert "987.6 %" in tldr


def test_a_numbers_table_of_another_loss_table_is_refused(processed, tmp_path):
    out = tmp_path / "processed"
    shutil.copytree(processed, out)
    loss = pd.read_parquet(out / "loss.parquet")
    loss.iloc[:-1].to_parquet(out / "loss.parquet")
    with pytest.raises(ValueError, match=r"paper_numbers\.parquet was written from a loss table"):
        render_paper(out, tmp_path / "none", tmp_path / "post" / "index.md", "s")


def test_the_template_names_only_code_that_exists():
    names = set(re.findall(r"\bluksbench(?:\.\w+)+", TEMPLATE.read_text()))
    assert names
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), name
                obj = getattr(obj, attr)
            break
        else:
            pytest.fail(f"{name}: no such module")
        assert cut > 1, name
