"""Figures of the comparison, from the loss table: the cost per cell against the decision
regions, loss heatmaps, hosts side by side and, for a fleet, every host's effect per cell in one
figure. The figures of one arm at a time are in :mod:`luksbench.publish.figures_arms`; the catalog
(:mod:`luksbench.publish.catalog`) says which figures a run gets. Every number drawn comes from a
processed table.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import matplotlib.figure
import numpy as np
import pandas as pd
import seaborn as sns

from luksbench.analysis.cells import with_pattern
from luksbench.analysis.contrasts import comparison_pairs
from luksbench.analysis.tails import TOO_FEW
from luksbench.formats.layout import bs_label
from luksbench.publish.style import (
    DECISION_COLORS,
    house_style,
    legend_below,
    panels,
    wrap,
)
from luksbench.publish.text import (
    cell_name,
    decision_kind,
    fmt_num,
    fmt_pct,
    metric_heading,
    multi_job,
    rw_rank,
)


def _in_order(df: pd.DataFrame, by: list[str], column: str = "cell") -> list:
    """The distinct values of ``column``, ``df`` sorted by ``by``."""
    return list(dict.fromkeys(df.sort_values(by)[column]))


LOSS_PANELS_PER_ROW = 3


def withheld(rows: pd.DataFrame) -> pd.Series:
    """Why each loss row has no effect to draw ("" where it has one): the loss table's ``note``
    up to its first colon ("too few I/Os", "net CPU <= 0"), else "no pairs"."""
    notes = rows.get("note", pd.Series("", index=rows.index)).fillna("").astype(str)
    reason = notes.str.split(":").str[0].str.strip()
    effect = pd.to_numeric(rows["effect_pct"], errors="coerce")
    return reason.mask(reason.eq("") & effect.isna(), "no pairs").where(
        reason.ne("") | effect.isna(), ""
    )


def all_withheld(rows: pd.DataFrame) -> str:
    """Why none of ``rows`` can be drawn ("" when some can): their reasons, joined."""
    if rows.empty:
        return "no rows"
    why = withheld(rows)
    return "" if why.eq("").any() else "all cells withheld (" + ", ".join(sorted(set(why))) + ")"


def loss_figure(
    loss: pd.DataFrame,
    metrics: Iterable[str] | None = None,
    comparison: tuple[str, str] | None = None,
) -> matplotlib.figure.Figure:
    """Effect in % (loss for throughput, increase for latency/CPU) per cell with its CI against
    the decision regions (shaded: negligible band, material beyond the upper margin); one panel
    per metric; colour = decision. A withheld cell is written as such where its point would be;
    a metric whose cells are all withheld gets no panel and is named, with why, under the title.
    One comparison per figure: ``comparison`` (baseline, variant), or the only one the table
    holds."""
    house_style()
    metrics = list(metrics) if metrics is not None else list(dict.fromkeys(loss["metric"]))
    if loss.empty or not metrics:
        raise ValueError("empty loss table")
    loss = _one_comparison(loss, comparison)
    df = loss[loss["metric"].isin(metrics)].copy()
    left_out = {m: all_withheld(df[df["metric"] == m]) for m in metrics}
    metrics = [m for m in metrics if not left_out[m]]
    if not metrics:
        raise ValueError("every metric's cells are withheld")
    df = df[df["metric"].isin(metrics)].assign(why=lambda d: withheld(d))
    several_jobs = multi_job(df)
    df["cell"] = df.apply(lambda r: cell_name(r, several_jobs), axis=1)
    if df["host"].nunique() > 1:
        df["cell"] = df["host"] + ": " + df["cell"]
    cells = _in_order(df, ["host", "pattern", "rw", "bs_bytes", "iodepth", "job_slot", "direction"])
    y = {c: i for i, c in enumerate(cells)}
    # at most LOSS_PANELS_PER_ROW panels side by side: the figure stays legible at page width
    ncols = min(LOSS_PANELS_PER_ROW, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig, axes = panels(nrows, ncols, 4.6 * ncols + 2.5, (0.3 * len(cells) + 1.2) * nrows + 0.9)
    for ax in axes.flat[len(metrics) :]:
        ax.set_visible(False)
    for k, (ax, metric) in enumerate(zip(axes.flat, metrics, strict=False)):
        _loss_panel(ax, df[df["metric"] == metric], y)
        ax.set_yticks(range(len(cells)), cells if k % ncols == 0 else [])
        ax.set_ylim(len(cells) - 0.5, -0.5)
    conf = float(df["confidence"].iloc[0])
    base, var = df["baseline"].iloc[0], df["variant"].iloc[0]
    gone = [f"{metric_heading(m)}: {why}" for m, why in left_out.items() if why]
    fig.suptitle(
        f"Cost of {var} vs {base} (paired, {conf:.0%} CI); shaded: negligible band (green), "
        "beyond the material margin (red)"
        + ("\n" + wrap("Not drawn: " + "; ".join(gone), 140) if gone else "")
    )
    legend_below(fig, axes, "decision", ncols=1, loc="outside right upper")
    return fig


def _loss_panel(ax, sub: pd.DataFrame, y: dict) -> None:
    """One metric's cells: regions, points coloured by decision, withheld cells in words."""
    lower, upper = (float(sub[c].iloc[0]) for c in ("decision_lower_pct", "decision_upper_pct"))
    shown = sub[sub["why"].eq("")]
    ax.axvspan(-lower, lower, color=DECISION_COLORS["negligible"], alpha=0.12, lw=0)
    ax.axvspan(
        upper,
        max(upper, float(shown["ci_high"].max())) * 1.05 + 1,
        color="#c0392b",
        alpha=0.07,
        lw=0,
    )
    kinds = shown["decision"].map(decision_kind)
    for kind in [k for k in DECISION_COLORS if k in set(kinds)]:
        g = shown[kinds == kind]
        color = DECISION_COLORS[kind]
        _effect_points(ax, g, g["cell"].map(y).to_numpy(float), 3, color=color, label=kind)
    for _, r in sub[sub["why"].ne("")].iterrows():
        ax.text(
            0.02,
            y[r["cell"]],
            f"withheld: {r['why']}",
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize="x-small",
            color="#555555",
        )
    ax.axvline(0, color="black", linewidth=0.8)
    kind = "increase" if (sub["effect"] == "increase").any() else "loss"
    ax.set_xlabel(f"{kind} (%)")
    ax.set_title(metric_heading(str(sub["metric"].iloc[0])))


def _effect_points(ax, rows: pd.DataFrame, y, capsize: int, **style) -> np.ndarray:
    """Each row's effect at ``y`` with its interval as an error bar; returns the effects."""
    eff, lo, hi = (rows[c].to_numpy(float) for c in ("effect_pct", "ci_low", "ci_high"))
    err = np.vstack([np.nan_to_num(eff - lo), np.nan_to_num(hi - eff)])
    ax.errorbar(eff, y, xerr=err, fmt="o", capsize=capsize, **style)
    return eff


def _one_comparison(loss: pd.DataFrame, comparison: tuple[str, str] | None) -> pd.DataFrame:
    """The rows of one comparison; ValueError when ``comparison`` is None and there are several
    (their cells would be drawn on top of each other)."""
    loss = with_pattern(loss)
    pairs = list(dict.fromkeys(zip(loss["baseline"], loss["variant"], strict=True)))
    if comparison is None:
        if len(pairs) > 1:
            raise ValueError(f"the loss table holds {len(pairs)} comparisons: name one")
        return loss
    out = loss[(loss["baseline"] == comparison[0]) & (loss["variant"] == comparison[1])]
    if out.empty:
        raise ValueError(f"no rows of {comparison[1]} against {comparison[0]}")
    return out


def _row_label(row, several_jobs: bool, multi_pattern: bool = False) -> str:
    label = str(row["rw"])
    if row["rw"] in ("rw", "readwrite", "randrw", "trimwrite", "randtrimwrite"):
        label += f" {row['direction']}"
    if several_jobs:
        label += f" #{int(row['job_slot'])}"
    if multi_pattern:
        label += f" ({row['pattern'] or 'main'})"
    return label


def loss_heatmap(
    losses: pd.DataFrame, metric: str = "bw_bytes", host: str | None = None
) -> matplotlib.figure.Figure:
    """Block size (x) x rw pattern (y), one panel per comparison (rows) and iodepth (columns);
    colour = effect in %, each cell annotated with effect, interval and decision. Cells of
    different config patterns get rows of their own."""
    house_style()
    df = with_pattern(losses[losses["metric"] == metric])
    if host is not None:
        df = df[df["host"] == host]
    if df.empty:
        raise ValueError(f"no {metric} rows to draw")
    several = (multi_job(df), df["pattern"].nunique() > 1)
    df = df.assign(
        row=df.apply(lambda r: _row_label(r, *several), axis=1), _o=df["rw"].map(rw_rank)
    )
    comparisons = comparison_pairs(df)
    depths = sorted(df["iodepth"].unique())
    bss = sorted(df["bs_bytes"].unique())
    rows = _in_order(df, ["pattern", "_o", "rw", "direction", "job_slot"], "row")
    effects = np.abs(df["effect_pct"].to_numpy(float))
    # every cell withheld (too few I/Os): an empty colour scale, not an all-NaN maximum
    lim = float(np.nanmax(effects)) if np.isfinite(effects).any() else 1.0
    lim = min(max(lim, 1.0), 100.0) if df["higher_is_better"].all() else max(lim, 1.0)
    cmap = sns.color_palette("vlag", as_cmap=True)
    fig, axes = panels(
        len(comparisons),
        len(depths),
        1.0 + 1.9 * len(bss) * len(depths),
        0.8 + 0.75 * len(rows) * len(comparisons) + 1,
    )
    kind = str(df["effect"].iloc[0])
    for i, (base, var) in enumerate(comparisons):
        for j, qd in enumerate(depths):
            ax = axes[i][j]
            sub = df[(df["baseline"] == base) & (df["variant"] == var) & (df["iodepth"] == qd)]
            grid = _annotate_cells(ax, sub, rows, bss)
            mesh = ax.imshow(grid, cmap=cmap, vmin=-lim, vmax=lim, aspect="auto")
            ax.set_xticks(range(len(bss)), [bs_label(int(b)) for b in bss])
            ax.set_yticks(range(len(rows)), rows)
            ax.grid(False)
            ax.set_title(f"{var} vs {base}, iodepth {qd}", fontsize="medium")
            ax.set_xlabel("block size")
    conf = float(df["confidence"].iloc[0])
    lower, upper = (fmt_num(df[c].iloc[0], 0) for c in ("decision_lower_pct", "decision_upper_pct"))
    fig.suptitle(
        f"{(host + ': ') if host else ''}{metric_heading(metric)} {kind} in % "
        f"[{conf:.0%} CI]\ndecision: negligible within ±{lower} %, "
        f"moderate {lower} to {upper} %, material beyond {upper} %",
        fontsize="medium",
    )
    fig.colorbar(mesh, ax=axes, label=f"{kind} (%)", shrink=0.8)
    return fig


def _annotate_cells(ax, sub: pd.DataFrame, rows: list[str], bss: list) -> np.ndarray:
    """Write each (row, block size) cell's effect, interval and decision on a heatmap panel;
    returns the effects as a rows x block sizes grid (NaN: not measured)."""
    sub = sub.assign(why=withheld(sub))
    at = sub.drop_duplicates(["row", "bs_bytes"]).set_index(["row", "bs_bytes"])
    grid = np.full((len(rows), len(bss)), np.nan)
    # black on a light box: the same mark on every cell, pale or dark
    box = {"boxstyle": "round,pad=0.25", "fc": "white", "alpha": 0.8, "lw": 0}
    for (a, r), (b, bs) in itertools.product(enumerate(rows), enumerate(bss)):
        if (r, bs) not in at.index:
            ax.text(b, a, "not measured", ha="center", va="center", fontsize="x-small")
            continue
        cell = at.loc[(r, bs)]
        text = (
            f"{fmt_pct(cell['effect_pct'])}\n[{fmt_num(cell['ci_low'])}, {fmt_num(cell['ci_high'])}]"
            f"\n{decision_kind(cell['decision'])}"
        )
        if cell["why"] == TOO_FEW:
            text = TOO_FEW.replace(" I/Os", "\nI/Os")  # as the tables say
        elif cell["why"]:
            text = f"withheld:\n{cell['why']}"
        else:  # a withheld cell stays uncoloured: no effect to show
            grid[a, b] = cell["effect_pct"]
        ax.text(b, a, text, ha="center", va="center", fontsize="small", bbox=box)
    return grid


#: the hosts figure's axis stops at -this % (intervals reaching further are labelled at the edge)
HOSTS_AXIS_MIN_PCT = 100.0
_EDGE_LABEL = dict(xytext=(2, 0), textcoords="offset points", va="center", fontsize="x-small")


def hosts_figure(losses: pd.DataFrame, metric: str = "bw_bytes") -> matplotlib.figure.Figure:
    """Several test boxes side by side: the effect per cell (rows) with its interval, one colour
    per host (dodged), one panel per comparison. Each host's effect comes from its own pairs
    only; the figure sets them beside each other, it does not pool them."""
    house_style()
    df = with_pattern(losses[losses["metric"] == metric].copy())
    if df.empty or df["host"].nunique() < 2:
        raise ValueError(f"need {metric} rows of at least two hosts")
    several_jobs = multi_job(df)
    df["cell"] = df.apply(lambda r: cell_name(r, several_jobs), axis=1)
    df["_o"] = df["rw"].map(rw_rank)
    cells = _in_order(df, ["pattern", "_o", "bs_bytes", "iodepth", "job_slot", "direction"])
    hosts = sorted(df["host"].unique())
    comparisons = comparison_pairs(df)
    colors = dict(zip(hosts, sns.color_palette(n_colors=len(hosts)), strict=True))
    step = 0.7 / len(hosts)
    fig, axes = panels(
        1, len(comparisons), 4.2 * len(comparisons) + 2.2, 0.45 * len(cells) + 1.8, sharey=True
    )
    kind = str(df["effect"].iloc[0])
    for ax, (baseline, variant) in zip(axes[0], comparisons, strict=True):
        sub = df[(df["baseline"] == baseline) & (df["variant"] == variant)]
        for k, host in enumerate(hosts):
            h = sub[sub["host"] == host]
            y = h["cell"].map({c: i for i, c in enumerate(cells)}).to_numpy(float)
            y = y + (k - (len(hosts) - 1) / 2) * step
            eff = _effect_points(ax, h, y, 2, color=colors[host], label=host)
            sig = (h["verdict"] == "significant").to_numpy(bool)
            ax.scatter(eff[sig], y[sig], s=70, facecolors="none", edgecolors="black", zorder=3)
            # an interval far below -100 % (a noisy cell, the variant maybe faster) would squash
            # every other cell: cut the axis there and write the bound at the edge
            for yy, lo in zip(y, h["ci_low"].to_numpy(float), strict=True):
                if np.isfinite(lo) and lo < -HOSTS_AXIS_MIN_PCT:
                    at = (-HOSTS_AXIS_MIN_PCT, yy)
                    ax.annotate(f"\u25c0 {lo:,.0f}", at, color=colors[host], **_EDGE_LABEL)
        bounds = sub[["ci_low", "ci_high", "effect_pct"]].to_numpy(float)
        bounds = bounds[np.isfinite(bounds)] if np.isfinite(bounds).any() else np.array([-1.0, 1.0])
        low, high = float(bounds.min()), float(bounds.max())  # all withheld: an axis around 0
        span = max(high, 0) - max(min(low, 0), -HOSTS_AXIS_MIN_PCT)
        ax.set_xlim(max(min(low, 0), -HOSTS_AXIS_MIN_PCT) - 0.05 * span, max(high, 0) + 0.05 * span)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(cells)), cells)
        ax.set_ylim(len(cells) - 0.5, -0.5)
        ax.set_xlabel(f"{kind} (%)")
        ax.set_title(f"{variant} vs {baseline}", fontsize="medium")
    conf = float(df["confidence"].iloc[0])
    fig.suptitle(
        f"{metric_heading(metric)} {kind} per host, {conf:.0%} CI\n"
        "each host paired with its own baseline; black ring = significant (BH-adjusted)",
        fontsize="medium",
    )
    legend_below(fig, axes[0][0], "host", ncols=len(hosts))
    return fig


def cell_key(row) -> tuple:
    """(rw, bs_bytes, iodepth): a cell of arms or loss rows, for matching the two."""
    return (str(row["rw"]), int(row["bs_bytes"]), int(row["iodepth"]))


def withheld_by_cell(loss: pd.DataFrame, metric: str, host: str | None = None) -> dict:
    """{(rw, bs_bytes, iodepth): why} of ``metric``'s withheld loss rows (any comparison)."""
    rows = loss[loss["metric"] == metric]
    if host is not None:
        rows = rows[rows["host"] == host]
    rows = rows.assign(why=withheld(rows))
    return {cell_key(r): r["why"] for _, r in rows[rows["why"].ne("")].iterrows()}


#: the fleet figure's axis stops at -this % (a host's effect further left is drawn at the edge)
FLEET_AXIS_MIN_PCT = HOSTS_AXIS_MIN_PCT


def fleet_figure(
    losses: pd.DataFrame, metric: str = "bw_bytes", comparison: tuple[str, str] | None = None
) -> matplotlib.figure.Figure:
    """A fleet in one figure: per cell (rows), every host's effect as one dot (the hosts spread
    across the cell's row in name order), coloured by that host's decision, against the decision
    regions; how many hosts of a cell are withheld is written beside it. Each host is paired
    with its own baseline; no pooled estimate and no interval is drawn (every host's is in the
    loss table). One comparison (``comparison``, or the only one)."""
    house_style()
    df = _one_comparison(losses[losses["metric"] == metric], comparison)
    if df.empty:
        raise ValueError(f"no {metric} rows")
    df = df.assign(why=withheld(df))
    several_jobs = multi_job(df)
    keys = ["pattern", "rw", "bs_bytes", "iodepth", "job_slot", "direction", "workload"]
    names = df.drop_duplicates(keys)
    names = names.assign(cell=names.apply(lambda r: cell_name(r, several_jobs), axis=1))
    df = df.merge(names[[*keys, "cell"]], on=keys, how="left")
    df["_o"] = df["rw"].map(rw_rank)
    cells = _in_order(df, ["pattern", "_o", "bs_bytes", "iodepth", "job_slot", "direction"])
    hosts = sorted(df["host"].unique())
    spread = {h: (k / max(len(hosts) - 1, 1) - 0.5) * 0.7 for k, h in enumerate(hosts)}
    y = df["cell"].map({c: i for i, c in enumerate(cells)}).to_numpy(float)
    y = y + df["host"].map(spread).to_numpy(float)
    fig, axes = panels(1, 1, 9.5, 0.42 * len(cells) + 2.2)
    ax = axes[0][0]
    lower, upper = (float(df[c].iloc[0]) for c in ("decision_lower_pct", "decision_upper_pct"))
    ax.axvspan(-lower, lower, color=DECISION_COLORS["negligible"], alpha=0.12, lw=0)
    shown = df["why"].eq("").to_numpy()
    effect = np.maximum(df["effect_pct"].to_numpy(float), -FLEET_AXIS_MIN_PCT)
    high = max(upper, float(np.nanmax(effect[shown])) if shown.any() else upper) * 1.05 + 1
    ax.axvspan(upper, high, color=DECISION_COLORS["material"], alpha=0.07, lw=0)
    kinds = df["decision"].map(decision_kind)
    size = max(2.0, min(20.0, 400 / len(hosts)))
    for kind in [k for k in DECISION_COLORS if k in set(kinds[shown])]:
        at = shown & kinds.eq(kind).to_numpy()
        color = DECISION_COLORS[kind]
        ax.scatter(effect[at], y[at], s=size, color=color, label=kind, lw=0, rasterized=True)
    _fleet_withheld(ax, df, cells)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlim(left=min(-lower, float(np.nanmin(effect[shown])) if shown.any() else 0) - 2)
    ax.set_yticks(range(len(cells)), cells)
    ax.set_ylim(len(cells) - 0.5, -0.5)
    kind = str(df["effect"].iloc[0])
    ax.set_xlabel(f"{kind} (%), one dot per host")
    base, var = df["baseline"].iloc[0], df["variant"].iloc[0]
    conf = float(df["confidence"].iloc[0])
    fig.suptitle(
        wrap(
            f"{metric_heading(metric)} {kind} of {var} vs {base} on each of {len(hosts)} hosts, "
            f"per cell; colour = the host's decision ({conf:.0%} CI, each host paired with its "
            "own baseline)",
            110,
        ),
        fontsize="medium",
    )
    legend_below(fig, ax, "decision", ncols=4)
    for handle in fig.legends[0].legend_handles if fig.legends else []:
        handle.set_sizes([30])  # the legend's dots legible however small the hosts' are
    return fig


def _fleet_withheld(ax, df: pd.DataFrame, cells: list[str]) -> None:
    """Beside each cell: how many hosts have no effect to draw there, and why."""
    gone = df[df["why"].ne("")]
    for cell, rows in gone.groupby("cell", sort=False):
        counts = rows.groupby("why")["host"].nunique()
        text = "; ".join(f"{n} withheld: {why}" for why, n in counts.items())
        ax.text(
            1.01,
            cells.index(cell),
            text,
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize="x-small",
            color="#555555",
        )
