"""Cross-run queries: DuckDB views over data/processed/*/<table>.parquet."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from luksbench.analysis import ingest, warehouse
from luksbench.analysis.loss import write_loss

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "raw" / "sample"


@pytest.fixture(scope="module")
def processed_root(tmp_path_factory, processed_sample) -> Path:
    """Two analysed runs: the sample, and a two-host run (its host copied as a second box)."""
    base = tmp_path_factory.mktemp("warehouse")
    raw_b = base / "raw" / "fleet"
    shutil.copytree(SAMPLE, raw_b)
    shutil.copytree(raw_b / "vm", raw_b / "vm2")
    root = base / "processed"
    shutil.copytree(processed_sample, root / "sample")
    ingest.write_processed(raw_b, root / raw_b.name, workers=1)
    write_loss(root / raw_b.name)
    return root


def test_views_union_every_run(processed_root):
    con = warehouse.connect(processed_root)
    tables = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
    assert set(warehouse.TABLES) <= tables
    for table in ("fio", "latency", "loss", "schedule", "env"):
        got = con.execute(f"SELECT run, count(*) FROM {table} GROUP BY run").fetchall()
        want = {
            run: len(pd.read_parquet(processed_root / run / f"{table}.parquet"))
            for run in ("sample", "fleet")
        }
        assert dict(got) == want, table
    # loss.parquet has no run column: the view takes it from the folder
    hosts = con.execute("SELECT run, count(DISTINCT host) FROM loss GROUP BY run").fetchall()
    assert dict(hosts) == {"sample": 1, "fleet": 2}
    con.close()


def test_example_query_sets_runs_side_by_side(processed_root):
    df = warehouse.query(warehouse.EXAMPLE_QUERY, processed_root)
    bw = {
        run: pd.read_parquet(processed_root / run / "loss.parquet").query("metric == 'bw_bytes'")
        for run in ("sample", "fleet")
    }
    assert len(df) == sum(len(t) for t in bw.values())
    assert list(df.columns[:5]) == ["workload", "run", "host", "kernel", "variant"]
    assert df["kernel"].notna().all()  # joined with env on (run, host)
    one = df[(df["run"] == "fleet") & (df["host"] == "vm2") & (df["workload"] == "read-1m-qd1")]
    want = bw["fleet"][(bw["fleet"]["host"] == "vm2") & (bw["fleet"]["workload"] == "read-1m-qd1")]
    assert one["loss_pct"].item() == pytest.approx(round(want["effect_pct"].item(), 1))


def test_file_backed_database_keeps_the_views(processed_root, tmp_path, monkeypatch):
    db = tmp_path / "warehouse.duckdb"
    warehouse.connect(processed_root, db).close()
    monkeypatch.chdir(tmp_path)  # absolute paths: the views work from anywhere
    con = duckdb.connect(str(db))
    assert con.execute("SELECT count(*) FROM fio").fetchone()[0] == 2 * 96 + 96
    con.close()


def test_command_line(processed_root, capsys):
    def warehouse_cli(*args: str) -> list[str]:
        root = str(processed_root)
        return [
            sys.executable,
            "-m",
            "luksbench.analysis.warehouse",
            *args,
            "--processed-root",
            root,
        ]

    result = subprocess.run(
        warehouse_cli(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "loss_pct" in result.stdout and "fleet" in result.stdout
    # the rest in this process (main is what `python -m` runs, as the call above shows)
    root = ["--processed-root", str(processed_root)]
    sql = "SELECT run, count(*) AS n FROM fio GROUP BY run ORDER BY run"
    assert warehouse.main([sql, "--csv", *root]) == 0
    assert capsys.readouterr().out.splitlines() == ["run,n", "fleet,192", "sample,96"]
    assert warehouse.main(["SELECT * FROM nope", *root]) == 1
    assert "nope" in capsys.readouterr().err


def test_no_processed_runs_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no processed run"):
        warehouse.connect(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        warehouse.connect(tmp_path / "missing")
