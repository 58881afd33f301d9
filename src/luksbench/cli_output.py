"""What ``luksbench`` prints: the loss table as aligned text, CSV (formula-like text neutralised)
or JSON. Standard library only at import (pandas is the caller's)."""

from __future__ import annotations

#: text a spreadsheet would evaluate as a formula starts with one of these (the same rule as
#: analysis.tablefiles.FORMULA_START, which needs pandas; a unit test keeps them equal)
FORMULA_START = "=+-@\t\r"


def csv_text_cell(value):
    """``value`` for a CSV a spreadsheet may open: text that starts like a formula gets a leading
    ``'`` (numbers, a negative one too, stay numbers)."""
    if isinstance(value, str) and value[:1] and value[0] in FORMULA_START:
        return f"'{value}"
    return value


#: the columns of ``luksbench loss --format table``: the decision first, then what it is about
TABLE_COLUMNS = ["decision", "host", "workload", "direction", "metric", "n", "effect"]


def loss_readable(table, confidence: float) -> list[list[str]]:
    """The loss table as a person reads it, as rows of cells (the header first): decision first,
    a few columns, the effect and its interval in % rounded to 0.1 (the full table is
    ``--format csv``); the host column only when the run has several."""
    columns = [c for c in TABLE_COLUMNS if c != "host" or table["host"].nunique() > 1]

    def pct(x) -> str:
        return "-" if x != x else f"{x:.1f}"  # NaN: no interval (too few pairs or withheld)

    rows = [[*columns, "effect %", f"{100 * confidence:g}% interval"]]
    for row in table.to_dict("records"):
        interval = f"{pct(row['ci_low'])} .. {pct(row['ci_high'])}"
        interval = "-" if interval == "- .. -" else interval
        rows.append([str(row[c]) for c in columns] + [pct(row["effect_pct"]), interval])
    return rows


def aligned(rows: list[list[str]], right: set[int]) -> str:
    """``rows`` as text columns, those at ``right`` right-aligned (numbers), the others left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    cells = [
        [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        for row in rows
    ]
    return "\n".join("  ".join(row).rstrip() for row in cells) + "\n"


def write_loss_output(table, fmt: str, out, confidence: float) -> None:
    """``luksbench loss``'s table to ``out`` as CSV, JSON or aligned text."""
    from luksbench.analysis.tablefiles import csv_safe_frame

    columns = list(table.columns)  # loss.parquet's: the workflow's loss table, row for row
    if fmt == "csv":  # cells a spreadsheet would evaluate neutralised (analysis.tablefiles)
        csv_safe_frame(table[columns]).to_csv(out, index=False)
    elif fmt == "json":
        out.write(table[columns].to_json(orient="records", indent=1) + "\n")
    else:
        rows = loss_readable(table, confidence)
        numbers = {rows[0].index("n"), len(rows[0]) - 2, len(rows[0]) - 1}
        out.write(aligned(rows, numbers))
