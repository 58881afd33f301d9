"""``luksbench compare`` published: the run-A-vs-run-B table (computed by
:mod:`luksbench.analysis.runcompare`) as Markdown, table files and a figure."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd
import seaborn as sns

from luksbench.analysis.runcompare import RunData
from luksbench.analysis.tablefiles import write_csv
from luksbench.formats.layout import replace_file, replacing
from luksbench.publish.style import house_style, panels, save_figure
from luksbench.publish.text import (
    METRIC_UNITS,
    cell_name,
    fmt_ci,
    fmt_num,
    fmt_pct,
    md_escape,
    md_escape_frame,
    md_escape_keeping_code,
    md_table,
    metric_heading,
    multi_job,
)

OUTCOME_COLORS = {
    "better": "#27ae60",
    "worse": "#c0392b",
    "same": "#2980b9",
    "unclear": "#7f8c8d",
    "insufficient": "#bdc3c7",
    "only in A": "#bdc3c7",
    "only in B": "#bdc3c7",
}


_RATIO_TICKS = (0.01, 0.1, 0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 10.0, 100.0)


def _cell_labels(df: pd.DataFrame) -> pd.Series:
    """Cell names, with the stack and host pair where the table has several."""
    multi_host = df[["host_a", "host_b"]].drop_duplicates().shape[0] > 1
    multi_stack = df["stack"].nunique() > 1
    several_jobs = multi_job(df, host="host_a")

    def label(r) -> str:
        text = cell_name(r, several_jobs)
        if multi_stack:
            text = f"{r['stack']}: {text}"
        if multi_host:
            host = r["host_a"] if r["host_a"] == r["host_b"] else f"{r['host_a']}/{r['host_b']}"
            text = f"{host}: {text}"
        return text

    return df.apply(label, axis=1)


def _ratio_axis(ax, sub: pd.DataFrame) -> None:
    """Log x axis of the ratio B/A, ticks read as percent change, "no change" marked."""
    ax.axvline(1, color="black", linewidth=0.8)
    ax.set_xscale("log")
    values = pd.concat([sub["lo"], sub["hi"], sub["ratio_b_a"]]).dropna()
    lo, hi = min(float(values.min()), 0.9), max(float(values.max()), 1.1)
    ticks = [t for t in _RATIO_TICKS if lo / 1.05 <= t <= hi * 1.05]
    if len(ticks) > 5:  # wide intervals: every other tick, always keeping "no change"
        ticks = sorted({1.0, *ticks[::2]})
    labels = ["0" if t == 1 else f"{100 * (t - 1):+.0f} %" for t in ticks]
    ax.set_xticks(ticks, labels, rotation=45, ha="right")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlim(lo / 1.1, hi * 1.1)


def compare_figure(table: pd.DataFrame, metrics: Iterable[str] | None = None):
    """``luksbench compare``: change from run A to run B in % per cell and stack (seaborn points,
    interval as a line), one panel per metric; colour = outcome (better / worse by the metric's
    direction, same = equivalent, unclear); zero line = no change."""
    house_style()
    metrics = list(metrics) if metrics is not None else list(dict.fromkeys(table["metric"]))
    df = table[table["metric"].isin(metrics) & table["change_pct"].notna()].copy()
    if df.empty:
        raise ValueError("nothing to draw: no cell has a value on both sides")
    df["cell"] = _cell_labels(df)
    order = ["host_a", "stack", "rw", "bs_bytes", "iodepth", "job_slot"]
    cells = list(dict.fromkeys(df.sort_values(order)["cell"]))
    y = {c: i for i, c in enumerate(cells)}
    df["y"] = df["cell"].map(y)
    fig, axes = panels(
        1, len(metrics), 3.4 * len(metrics) + 2.0, 0.38 * len(cells) + 1.8, sharey=True
    )
    present = [o for o in OUTCOME_COLORS if (df["outcome"] == o).any()]
    # ratio B/A on a log axis: +100 % and -50 % are the same distance from "no change", and one
    # very noisy cell does not squash the others; ticks read as percent change
    df["ratio_b_a"] = 1 + df["change_pct"] / 100
    df["lo"], df["hi"] = 1 + df["ci_low"] / 100, 1 + df["ci_high"] / 100
    for ax, metric in zip(axes[0], metrics, strict=True):
        sub = df[df["metric"] == metric]
        lo, hi = sub["lo"].fillna(sub["ratio_b_a"]), sub["hi"].fillna(sub["ratio_b_a"])
        colors = [OUTCOME_COLORS.get(o, "black") for o in sub["outcome"]]
        ax.hlines(sub["y"], lo, hi, colors=colors, linewidth=1.6)
        sns.scatterplot(
            data=sub,
            x="ratio_b_a",
            y="y",
            hue="outcome",
            hue_order=present,
            palette=OUTCOME_COLORS,
            style="design",
            style_order=["paired", "sessions", "one session"],
            s=45,
            ax=ax,
            legend=ax is axes[0][-1],
            zorder=3,
        )
        _ratio_axis(ax, sub)
        ax.set(xlabel="change B vs A (%, log scale)", ylabel="", title=metric_heading(metric))
        ax.set_yticks(range(len(cells)), cells)
        ax.set_ylim(len(cells) - 0.5, -0.5)
    legend = axes[0][-1].get_legend()
    if legend is not None:
        handles, labels = axes[0][-1].get_legend_handles_labels()
        legend.remove()
        fig.legend(handles, labels, loc="outside right upper")
    conf = float(df["confidence"].iloc[0])
    run_a, run_b = df["run_a"].iloc[0], df["run_b"].iloc[0]
    fig.suptitle(
        f"{run_b} (B) vs {run_a} (A): change per cell, {conf:.0%} CI\n"
        "green better, red worse (by the metric's direction), blue equivalent, grey unclear",
        fontsize="medium",
    )
    return fig


def compare_markdown(table: pd.DataFrame, a: RunData, b: RunData, differences: list[str]) -> str:
    """The comparison as Markdown: design per host pair, what differs, one table per metric.
    Every text from the runs is escaped (:func:`~luksbench.publish.text.md_escape`)."""
    conf = fmt_num(100 * float(table["confidence"].iloc[0]), 0) if len(table) else "95"
    attrs = table.attrs
    table = md_escape_frame(table)
    table.attrs = attrs
    differences = [md_escape_keeping_code(d) for d in differences]
    lines = [
        f"# {md_escape(a.name)} (A) vs {md_escape(b.name)} (B)",
        "",
        md_escape_keeping_code(f"A: `{a.source}`; B: `{b.source}`.")
        + " Change = B relative to A, geometric mean over "
        f"repetitions, {conf} % confidence interval; verdicts after Benjamini-Hochberg across "
        "every row of this comparison.",
        "",
    ]
    for pair, d in table.attrs.get("designs", {}).items():
        ha, _, hb = (md_escape(h) for h in pair.partition("="))
        what = {
            "paired": "**paired** by repetition index",
            "sessions": "**unpaired**, sessions as replicates (Welch t-interval on session means)",
        }.get(d["design"], "**unpaired**, one session on a side: no interval")
        host = f"`{ha}`" if ha == hb else f"`{ha}` (A) vs `{hb}` (B)"
        lines.append(f"- Host {host}: {what}: {md_escape_keeping_code(d['reason'])}.")
    lines.append("")
    if differences:
        lines += ["What differs besides the measurements:", ""]
        lines += [f"- {d}" for d in differences] + [""]
    if skipped := table.attrs.get("skipped_metrics") or []:
        lines += [f"Not compared (no values in either run): {', '.join(skipped)}.", ""]
    multi_host = table[["host_a", "host_b"]].drop_duplicates().shape[0] > 1
    for metric in dict.fromkeys(table["metric"]):
        sub = table[table["metric"] == metric]
        heading, unit, div, dec = METRIC_UNITS.get(metric, (metric, "", 1, 2))
        header = ["cell", "stack", f"A ({unit}):", f"B ({unit}):", "change:", f"{conf} % CI"]
        header += ["verdict", "outcome", "n A / B"]
        rows = []
        for _, r in sub.iterrows():
            cell = cell_name(r)
            if multi_host:
                host = r["host_a"] if r["host_a"] == r["host_b"] else f"{r['host_a']}/{r['host_b']}"
                cell = f"{host}: {cell}"
            means = [fmt_num(r["a_mean"] / div, dec), fmt_num(r["b_mean"] / div, dec)]
            change = [fmt_pct(r["change_pct"]), fmt_ci(r["ci_low"], r["ci_high"])]
            verdict = [r["verdict"], r["outcome"], f"{int(r['n_a'])} / {int(r['n_b'])}"]
            rows.append([cell, f"`{r['stack']}`", *means, *change, *verdict])
        lines += [f"## {heading}", "", md_table(header, rows), ""]
    counts = table["outcome"].value_counts()
    outcomes = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
    lines.append(f"Outcomes: {outcomes}." if len(counts) else "No cell in common.")
    return "\n".join(lines) + "\n"


def write_compare(
    table: pd.DataFrame, out_dir: Path, a: RunData, b: RunData, differences: list[str]
) -> dict[str, Path]:
    """``compare.parquet``, ``compare.csv``, ``compare.md`` and the figure ``compare.png|svg``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = {"parquet": out_dir / "compare.parquet", "csv": out_dir / "compare.csv"}
    plain = table.copy()
    plain.attrs = {}
    with replacing(out["parquet"]) as tmp:  # every file replaced, never written through a link
        plain.to_parquet(tmp, index=False)
    write_csv(plain, out["csv"])
    out["md"] = replace_file(
        out_dir / "compare.md", compare_markdown(table, a, b, differences).encode()
    )
    if len(table):
        fig = compare_figure(table)
        png, svg = save_figure(
            fig,
            out_dir / "compare",
            {
                "title": f"luksbench compare: {a.name} vs {b.name}",
                "figure": "compare",
                "made_by": "luksbench.publish.comparepage.compare_figure",
                "run_a": a.source,
                "run_b": b.source,
                "designs": table.attrs.get("designs", {}),
            },
        )
        plt.close(fig)
        out["png"], out["svg"] = png, svg
    return out
