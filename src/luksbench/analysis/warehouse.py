"""Queries across runs: DuckDB views over every run's processed parquet files.

    python -m luksbench.analysis.warehouse ["SELECT ..."] [--csv] [--processed-root data/processed]
    python -m luksbench.analysis.warehouse --database data/processed/warehouse.duckdb   # keep the views

One view per processed table (:data:`TABLES`), the union by column name of
``<processed_root>/*/<table>.parquet``, with a ``run`` column. Views read the files at query
time: nothing is copied or rebuilt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb

from luksbench.analysis.ingest import PROCESSED_TABLES
from luksbench.analysis.tablefiles import csv_safe_frame

TABLES = (*PROCESSED_TABLES, "loss")
#: the run folder's name, for tables that do not carry the run themselves
RUN_FROM_FILENAME = r"regexp_extract(filename, '([^/\\]+)[/\\][^/\\]+$', 1) AS run, "

#: the default query: the bandwidth loss of every comparison per run, host and kernel
EXAMPLE_QUERY = """\
SELECT l.workload, l.run, l.host, e.kernel, l.variant, l.baseline,
       round(l.effect_pct, 1) AS loss_pct, round(l.ci_low, 1) AS ci_low,
       round(l.ci_high, 1) AS ci_high, l.n, l.verdict
FROM loss AS l LEFT JOIN env AS e USING (run, host)
WHERE l.metric = 'bw_bytes'
ORDER BY l.workload, l.baseline, l.variant, e.kernel, l.run, l.host
"""


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def create_views(con: duckdb.DuckDBPyConnection, processed_root: Path) -> list[str]:
    """(Re)create a view of every table with a parquet file; returns their names. Paths are
    absolute, so a file-backed database works from any directory."""
    root = Path(processed_root).resolve()
    made = []
    for table in TABLES:
        if not any(root.glob(f"*/{table}.parquet")):
            con.execute(f"DROP VIEW IF EXISTS {table}")
            continue
        glob = _quote(str(root / "*" / f"{table}.parquet"))
        source = f"read_parquet({glob}, union_by_name = true, filename = true)"
        columns = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        run = "" if "run" in columns else RUN_FROM_FILENAME
        con.execute(
            f"CREATE OR REPLACE VIEW {table} AS SELECT {run}* EXCLUDE (filename) FROM {source}"
        )
        made.append(table)
    return made


def connect(
    processed_root: Path = Path("data/processed"), database: str | Path = ":memory:"
) -> duckdb.DuckDBPyConnection:
    """DuckDB with the views of :func:`create_views`; a ``database`` file (not ``":memory:"``)
    keeps the view definitions for other DuckDB clients (``duckdb FILE``)."""
    processed_root = Path(processed_root)
    if not processed_root.is_dir():
        raise FileNotFoundError(f"processed folder not found: {processed_root}")
    con = duckdb.connect(str(database))
    if not create_views(con, processed_root):
        con.close()
        raise FileNotFoundError(
            f"no processed run under {processed_root} (expected <run>/fio.parquet ...): "
            "run the analysis first (snakemake ... or luksbench.analysis.ingest.write_processed)"
        )
    return con


def query(
    sql: str = EXAMPLE_QUERY,
    processed_root: Path = Path("data/processed"),
    database: str | Path = ":memory:",
):
    """``sql`` run against the views (:func:`connect`), as a pandas DataFrame."""
    with connect(processed_root, database) as con:
        return con.execute(sql).df()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m luksbench.analysis.warehouse", description=__doc__.splitlines()[0]
    )
    parser.add_argument("sql", nargs="?", default=EXAMPLE_QUERY, help="default: the example")
    parser.add_argument("--processed-root", type=Path, default=Path("data/processed"))
    parser.add_argument("--database", default=":memory:", help="file-backed DuckDB database")
    parser.add_argument("--csv", action="store_true", help="CSV instead of a text table")
    args = parser.parse_args(argv)
    try:
        df = query(args.sql, args.processed_root, args.database)
    except (FileNotFoundError, duckdb.Error) as exc:
        print(f"luksbench warehouse: {exc}", file=sys.stderr)
        return 1
    if args.csv:
        csv_safe_frame(df).to_csv(sys.stdout, index=False)
    else:
        print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
