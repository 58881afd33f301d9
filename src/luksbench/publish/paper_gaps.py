""" "Not in this run": what the run lacks, in sentences, each computed from the rows it speaks
of (stacks not built or without results, cells without pairs, rows without a usable pair,
cipher benchmarks that did not run, figure families without data)."""

from __future__ import annotations

import pandas as pd

from luksbench.analysis.paper_numbers import notes
from luksbench.publish.run import Run, planned_stacks, unavailable_stacks
from luksbench.publish.text import fmt_num, metric_heading


def _stack_gaps(run: Run) -> list[str]:
    """Optional stacks that could not be built (with the reason), raw files left out at ingest,
    planned stacks without results."""
    unavailable = unavailable_stacks(run.stacks)
    out = []
    for u in unavailable:
        kind = f" ({u['kind']})" if u.get("kind") else ""
        out.append(
            f"Stack `{u['stack']}`{kind} could not be built on `{u['host']}`: {u['reason']}. It "
            "is optional, so the run went on without it: it is in no table or figure."
        )
    problems = run.table("problems", ["severity", "file", "reason"])
    for row in problems[problems["severity"] == "excluded"].itertuples():
        out.append(f"Raw file `{row.file}` was left out: {row.reason}.")
    gone = {(u["host"], u["stack"]) for u in unavailable}
    measured = {h: set(g["stack"].unique()) for h, g in run.fio.groupby("host")}
    for host, stacks in sorted(planned_stacks(run.plan_stacks).items()):
        absent = sorted(s for s in set(stacks) - measured.get(host, set()) if (host, s) not in gone)
        if absent:
            out.append(
                f"On `{host}` the plan listed stacks {', '.join(f'`{s}`' for s in absent)} that "
                "have no results: they were skipped and are not in any table or figure."
            )
    return out


def unpaired_cells(losses: pd.DataFrame) -> list[str]:
    """Cells measured on one stack of their comparison only: every loss row of the cell has no
    pair, no withholding note (a withheld metric is no missing stack) and one side's mean
    missing. Each named with the stack that has results."""
    if losses.empty:
        return []
    one_side = losses["baseline_mean"].isna() ^ losses["variant_mean"].isna()
    unpaired = losses["n"].eq(0) & notes(losses).eq("") & one_side
    keys = ["host", "baseline", "variant", "workload"]
    whole = unpaired.groupby([losses[k] for k in keys]).transform("all")
    rows = losses[unpaired & whole].drop_duplicates(keys)
    multi_host = losses["host"].nunique() > 1
    return sorted(
        f"{(str(r['host']) + ': ') if multi_host else ''}{r['workload']} "
        f"(only `{r['baseline'] if pd.notna(r['baseline_mean']) else r['variant']}`, "
        f"comparison `{r['variant']}` vs `{r['baseline']}`)"
        for _, r in rows.iterrows()
    )


def all_pairs_dropped(losses: pd.DataFrame) -> list[str]:
    """Rows (cell and metric) with pairs measured on both stacks but none usable: no withholding
    note, every pair dropped."""
    if losses.empty:
        return []
    rows = losses[losses["n"].eq(0) & notes(losses).eq("") & losses["n_dropped"].gt(0)]
    return sorted(
        f"`{r['variant']}` vs `{r['baseline']}` {r['workload']} {metric_heading(r['metric'])}"
        for _, r in rows.iterrows()
    )


def gaps(run: Run, figures_found: set[str]) -> list[str]:
    """Sentences on what this run lacks: stacks (:func:`_stack_gaps`), cells without pairs,
    cipher benchmarks that did not run, figure families without data."""
    out = _stack_gaps(run)
    cells = unpaired_cells(run.loss)
    if cells:
        out.append(
            f"{len(cells)} cells have results on one stack only (no pairs): {', '.join(cells)}."
        )
    dropped = all_pairs_dropped(run.loss)
    if dropped:
        out.append(
            f"{len(dropped)} rows have no usable pair (every pair dropped: a missing side or a "
            f"value at or below 0): {', '.join(dropped)}."
        )
    cs = run.cryptsetup
    for host in sorted(set(run.env["host"]) - set(cs["host"])):
        out.append(f"No `cryptsetup benchmark` output was recorded on `{host}`.")
    if len(cs):
        skipped = cs[
            (cs["kind"] == "cipher")
            & ~cs["available"].fillna(True).astype(bool)
            & cs["algorithm"].fillna("").astype(str).str.strip().ne("")
        ]
        for host, g in skipped.groupby("host"):
            pairs = zip(g["algorithm"], g["key_bits"], strict=True)
            ciphers = ", ".join(sorted({f"{a} {fmt_num(k, 0)}b" for a, k in pairs}))
            out.append(f"On `{host}` the cipher benchmark skipped {ciphers} (N/A).")
    if "latency" not in figures_found:
        out.append(
            "No completion-latency histograms: the raw files carry no json+ `bins`, so there is "
            "no latency table and no percentile figure."
        )
    if "cpu" not in figures_found:
        out.append("No CPU sidecars (`rep<k>.cpu.json`): no CPU-cost figure.")
    return out
