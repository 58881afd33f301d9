"""The numbers the paper's answer quotes, one row each, written by the loss stage beside the
loss table (as showyourwork writes every number a paper quotes to a file of its own).

``paper_numbers.parquet`` (+ CSV) holds, per comparison and metric (one family of the loss
table, the rows the TL;DR speaks of: :func:`quoted_rows`), how many cells it has, how many fall
into each decision, the decision margins and the largest cost with its interval adjusted for
picking it; per comparison its cells; for the run its confidence level and the loss table's row
count (the paper refuses a numbers table written from another loss table). Each row names where
its value comes from: ``source_table`` (``loss``) and ``source_row`` (the 0-based row of
``loss.parquet`` for a number read from one row; empty for a count over the family). Nothing
here computes a statistic: the values are counted or copied from the loss table.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from luksbench.analysis import tablefiles

NUMBERS_TABLE = "paper_numbers"
#: the columns of :data:`NUMBERS_TABLE`
NUMBERS_COLUMNS = ["key", "value", "unit", "quantity", "label", "baseline", "variant", "metric"]
NUMBERS_COLUMNS += ["source_table", "source_row"]
#: the decided regions, worst first (the loss table's ``decision``; "undecided: ..." apart)
DECIDED = ("material", "moderate", "negligible", "moderate gain", "material gain")
#: the largest cost of a family: quantity -> (the loss table's column, scale, unit)
_LARGEST = {
    "largest_effect_pct": ("effect_pct", 1.0, "%"),
    "largest_ci_low_pct": ("selection_ci_low", 1.0, "%"),
    "largest_ci_high_pct": ("selection_ci_high", 1.0, "%"),
    "largest_confidence_pct": ("selection_confidence", 100.0, "%"),
    "largest_pairs": ("n", 1.0, "pairs"),
    "family_cells": ("family_cells", 1.0, "cells"),
}


def notes(rows: pd.DataFrame) -> pd.Series:
    """loss.parquet's ``note`` ("" when none): why a row is withheld."""
    return rows.get("note", pd.Series("", index=rows.index)).fillna("").astype(str)


def decision_tally(rows: pd.DataFrame) -> list[tuple[str, int]]:
    """How many of ``rows`` fall into each decision, worst first: the decided regions, then
    ``undecided``, ``insufficient`` and ``withheld (<reason>)`` per withholding note."""
    why = notes(rows)
    reasons = "withheld (" + why.str.split(":").str[0] + ")"
    withheld = why.ne("")
    kinds = rows["decision"].astype(str).str.split(":").str[0].mask(withheld, reasons)
    counts = kinds.value_counts()
    order = [*DECIDED, "undecided", "insufficient", *sorted(set(reasons[withheld]))]
    return [(k, int(counts[k])) for k in order if k in counts]


def quoted_rows(loss: pd.DataFrame) -> pd.DataFrame:
    """The rows the paper's answer speaks of: measured in their own right (not IOPS derived from
    bandwidth) and with pairs or a withholding note (a cell with one stack only is a gap)."""
    derived = loss.get("derived_from", pd.Series("", index=loss.index)).fillna("")
    return loss[derived.eq("") & (loss["n"].gt(0) | notes(loss).ne(""))]


def comparison_pairs_of(loss: pd.DataFrame) -> list[tuple[str, str]]:
    """(baseline, variant) in the loss table's order (the headline first)."""
    pairs = loss[["baseline", "variant"]].drop_duplicates()
    return list(pairs.itertuples(index=False, name=None))


def paper_numbers(loss: pd.DataFrame) -> pd.DataFrame:
    """:data:`NUMBERS_COLUMNS` for the loss table ``loss`` (its rows numbered by position)."""
    loss = loss.reset_index(drop=True)
    rows = [_number("loss_rows", len(loss), "rows", "loss_rows")]
    if len(loss):
        confidence = 100 * float(loss["confidence"].iloc[0])
        rows.append(_number("confidence_pct", confidence, "%", "confidence_pct", row=0))
    quoted = quoted_rows(loss)
    for baseline, variant in comparison_pairs_of(loss):
        mine = quoted[quoted["baseline"].eq(baseline) & quoted["variant"].eq(variant)]
        cells = len(mine.drop_duplicates(["host", "workload", "job_slot", "direction"]))
        family = {"baseline": baseline, "variant": variant}
        rows.append(_number(_key(family, "cells"), cells, "cells", "comparison_cells", **family))
        for metric in dict.fromkeys(mine["metric"]):
            rows += _family_numbers(mine[mine["metric"].eq(metric)], family | {"metric": metric})
    return pd.DataFrame(rows, columns=NUMBERS_COLUMNS).astype(
        {"value": float, "source_row": "Int64"}
    )


def _family_numbers(rows: pd.DataFrame, family: dict) -> list[dict]:
    """One metric of one comparison: cells, decisions, margins, its largest cost."""
    out = [_number(_key(family, "cells"), len(rows), "cells", "cells", **family)]
    for label, count in decision_tally(rows):
        key = _key(family, "count", label)
        out.append(_number(key, count, "cells", "count", label=label, **family))
    for quantity, column in (
        ("margin_lower_pct", "decision_lower_pct"),
        ("margin_upper_pct", "decision_upper_pct"),
    ):
        at = int(rows.index[0])
        value = float(rows[column].iloc[0])
        out.append(_number(_key(family, quantity), value, "%", quantity, row=at, **family))
    largest = rows.get("largest", pd.Series(False, index=rows.index)).eq(True)
    if largest.any():
        at = int(rows.index[largest.to_numpy()][0])
        for quantity, (column, scale, unit) in _LARGEST.items():
            value = scale * float(rows.at[at, column])
            out.append(_number(_key(family, quantity), value, unit, quantity, row=at, **family))
    return out


def _key(family: dict, *parts: str) -> str:
    """``<variant>-vs-<baseline>[/<metric>]/<quantity>[/<label>]``."""
    scope = [f"{family['variant']}-vs-{family['baseline']}"]
    scope += [family["metric"]] if family.get("metric") else []
    return "/".join([*scope, *parts])


def _number(key, value, unit, quantity, label="", row=None, **family) -> dict:
    return {
        "key": key,
        "value": value,
        "unit": unit,
        "quantity": quantity,
        "label": label,
        "baseline": family.get("baseline", ""),
        "variant": family.get("variant", ""),
        "metric": family.get("metric", ""),
        "source_table": "loss",
        "source_row": row,
    }


def write_paper_numbers(processed_dir: Path) -> Path:
    """``<processed_dir>/paper_numbers.parquet`` and ``.csv`` from its ``loss.parquet``."""
    loss_path = Path(processed_dir) / "loss.parquet"
    if not loss_path.exists():
        raise FileNotFoundError(f"{loss_path} is missing: run the loss step (notebook 02) first")
    numbers = paper_numbers(pd.read_parquet(loss_path))
    return tablefiles.write_tables(Path(processed_dir), {NUMBERS_TABLE: numbers})[NUMBERS_TABLE]


def main(argv: list[str] | None = None) -> None:
    """``python -m luksbench.analysis.paper_numbers <processed_dir>/paper_numbers.parquet``:
    the workflow's loss rule writes it from the loss table in the same folder."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or Path(args[0]).name != f"{NUMBERS_TABLE}.parquet":
        raise SystemExit(f"usage: python -m {__spec__.name} PROCESSED_DIR/{NUMBERS_TABLE}.parquet")
    print(write_paper_numbers(Path(args[0]).parent))


if __name__ == "__main__":
    main()
