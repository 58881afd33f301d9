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
    ``--format csv``); the host column only when the run has several. Where some rows are the
    sequential design's, a last column says what each interval is: theirs are repeated confidence
    intervals at the look where the cell stopped, at that look's level."""
    columns = [c for c in TABLE_COLUMNS if c != "host" or table["host"].nunique() > 1]
    sequential = "interval" in table and bool(table["interval"].eq("sequential").any())

    def pct(x) -> str:
        return "-" if x != x else f"{x:.1f}"  # NaN: no interval (too few pairs or withheld)

    header = [*columns, "effect %"]
    header += ["interval", "interval is"] if sequential else [f"{100 * confidence:g}% interval"]
    rows = [header]
    for row in table.to_dict("records"):
        interval = f"{pct(row['ci_low'])} .. {pct(row['ci_high'])}"
        interval = "-" if interval == "- .. -" else interval
        cells = [str(row[c]) for c in columns] + [pct(row["effect_pct"]), interval]
        if sequential:
            cells.append(interval_kind(row, confidence) if interval != "-" else "-")
        rows.append(cells)
    return rows


def interval_kind(row: dict, confidence: float) -> str:
    """What a loss row's interval is, in a few words (``luksbench loss --format table``)."""
    if row.get("interval") == "sequential":
        level = row.get("look_confidence")
        at = f"{100 * level:.4g}%" if level == level and level is not None else "its look's level"
        return f"repeated CI at the stopping look, {at}"
    return f"{100 * confidence:g}% CI"


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
        header = rows[0]
        numbers = {header.index("n"), header.index("effect %"), header.index("effect %") + 1}
        out.write(aligned(rows, numbers))
