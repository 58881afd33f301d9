"""Publishing the processed tables: CSV beside every parquet table, and a column tablefiles
(README.md) generated from luksbench.analysis.tablefiles that documents every column."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from luksbench.analysis import headline, ingest, loss, saturation, tablefiles, tuning
from luksbench.analysis.stats import LOSS_COLUMNS, ORDER_COLUMNS
from luksbench.formats.cryptsetup import CRYPTSETUP_COLUMNS
from luksbench.formats.fio import FIO_COLUMNS


@pytest.fixture(scope="module")
def processed(processed_sample) -> Path:
    return processed_sample


def test_every_table_has_its_csv(processed):
    names = (*ingest.PROCESSED_TABLES, *loss.LOSS_TABLES)
    assert {p.stem for p in processed.glob("*.parquet")} == set(names)
    for name in names:
        table = pd.read_parquet(processed / f"{name}.parquet")
        csv = pd.read_csv(processed / f"{name}.csv")
        assert list(csv.columns) == list(table.columns) and len(csv) == len(table), name
    fio = pd.read_csv(processed / "fio.csv")
    assert fio["bw_bytes"].sum() == pd.read_parquet(processed / "fio.parquet")["bw_bytes"].sum()


def test_dictionary_documents_every_column_of_every_table(processed):
    readme = (processed / "README.md").read_text()
    for name in (*ingest.PROCESSED_TABLES, *loss.LOSS_TABLES):
        assert f"## {name} (`{name}.parquet`, `{name}.csv`)" in readme
        columns = pd.read_parquet(processed / f"{name}.parquet").columns
        missing = [c for c in columns if c not in tablefiles.COLUMNS]
        assert not missing, f"{name}: columns without unit and meaning: {missing}"
        assert all(f"`{c}`" in readme for c in columns)
    assert "undocumented" not in readme
    assert "| `bw_bytes` | B/s | bandwidth |" in readme


def test_the_column_lists_of_the_code_are_all_documented():
    # columns a table only gets on other runs (fleet, adaptive, patterns) are in these lists too
    lists = [FIO_COLUMNS, ingest.FIO_LAYOUT_COLUMNS, ingest.FIO_DERIVED_COLUMNS, LOSS_COLUMNS]
    lists += [ingest.ENV_COLUMNS, ingest.STACKS_COLUMNS, ingest.LATENCY_COLUMNS, ORDER_COLUMNS]
    lists += [ingest.SCHEDULE_COLUMNS, ingest.PROBLEMS_COLUMNS, CRYPTSETUP_COLUMNS]
    lists += [tuning.TUNING_COLUMNS, saturation.LOSS_FLAG_COLUMNS, headline.HEADLINE_COLUMNS]
    missing = sorted({c for columns in lists for c in columns} - set(tablefiles.COLUMNS))
    assert not missing


def test_a_new_column_shows_as_undocumented(tmp_path):
    pd.DataFrame({"host": ["h"], "new_thing": [1]}).to_parquet(tmp_path / "env.parquet")
    readme = tablefiles.write_dictionary(tmp_path).read_text()
    assert "| `new_thing` | | undocumented |" in readme and "`host`" in readme


def test_the_csv_holds_the_values_of_the_parquet_table(tmp_path):
    # read back with pandas: the same columns and values; times readable, with their UTC offset
    n = 25
    df = pd.DataFrame(
        {
            "x": [0.1 * i if i % 7 else float("nan") for i in range(n)],
            "big": [10.0**i for i in range(n)],
            "text": pd.array([f'r,"{i}"' if i % 5 else None for i in range(n)], dtype="string"),
            "flag": pd.array([[True, False, None][i % 3] for i in range(n)], dtype="boolean"),
            "n": range(n),
            "started": pd.date_range("2026-11-21 08:51:07.4", periods=n, freq="90s", tz="UTC"),
        }
    )
    df = df[df["n"] % 4 != 1]  # rows of a filtered table: its index has gaps
    tablefiles.write_tables(tmp_path, {"fio": df})
    written = pd.read_parquet(tmp_path / "fio.parquet")
    pd.testing.assert_frame_equal(written, df.reset_index(drop=True))
    csv = pd.read_csv(tmp_path / "fio.csv")
    assert list(csv.columns) == list(df.columns)
    assert csv["started"].str.fullmatch(r"2026-11-21[ T][\d:.]+(Z|\+00:00)").all()
    csv["started"] = pd.to_datetime(csv["started"], utc=True)
    csv["flag"] = csv["flag"].astype("boolean")
    pd.testing.assert_frame_equal(csv, written, check_dtype=False, rtol=1e-15)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "fio.csv", "fio.parquet"]
