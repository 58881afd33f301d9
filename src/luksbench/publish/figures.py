"""Figure families: functions that take processed tables and return matplotlib figures.

One function per family of :data:`luksbench.publish.catalog.FIGURE_FAMILIES`; every number drawn
comes from a processed table (loss, arms, reps, latency, cryptsetup).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import matplotlib.figure
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from luksbench.analysis.cells import with_pattern
from luksbench.analysis.contrasts import comparison_pairs
from luksbench.analysis.tails import MIN_BEYOND, PERCENTILES, TOO_FEW
from luksbench.formats.layout import bs_label
from luksbench.publish.ceilings import available_ciphers, cipher_label, is_estimate
from luksbench.publish.style import (
    DECISION_COLORS,
    house_style,
    interval_bars,
    legend_below,
    log_intervals,
    log_y,
    panels,
    wrap,
)
from luksbench.publish.text import (
    cell_name,
    cpu_basis,
    decision_kind,
    fmt_num,
    fmt_pct,
    metric_heading,
    metric_label,
    multi_job,
    rw_rank,
)


def _arm_rows(arms: pd.DataFrame, metric: str, host: str | None = None) -> pd.DataFrame:
    """The arms.parquet rows of one metric (and host) that have a mean."""
    rows = arms[arms["metric"] == metric]
    if host is not None:
        rows = rows[rows["host"] == host]
    return with_pattern(rows[np.isfinite(rows["mean"].astype(float))])


def _in_order(df: pd.DataFrame, by: list[str], column: str = "cell") -> list:
    """The distinct values of ``column``, ``df`` sorted by ``by``."""
    return list(dict.fromkeys(df.sort_values(by)[column]))


def _bar_groups(summ: pd.DataFrame, several: pd.DataFrame | None = None) -> pd.Series:
    """Bar group labels: block size, plus what tells cells apart when ``several`` (default:
    ``summ``) has more than one direction, host, job or config pattern — never summed."""
    several = summ if several is None else several
    group = summ["bs_bytes"].map(bs_label).astype(str)
    if summ["direction"].nunique() > 1:
        group = group + " " + summ["direction"]
    if "host" in several and several["host"].nunique() > 1:
        group = summ["host"] + " " + group
    if several["job_slot"].nunique() > 1:
        group = group + " #" + summ["job_slot"].astype(str)
    if several["pattern"].nunique() > 1:
        group = group.astype(str) + summ["pattern"].astype(str).map(
            lambda p: f" [{p}]" if p else ""
        )
    return group


def _stack_bars(ax, sub: pd.DataFrame, stacks, colors, scale: float = 1.0, reps=None) -> list:
    """One bar per stack and group of ``sub`` (columns group, stack, mean, ci_half); ``reps``
    (columns group, stack, value): every repetition as a dot on its bar. Returns the groups in
    x order."""
    order = sub.sort_values(["pattern", "bs_bytes", "group"])["group"].drop_duplicates().tolist()
    x = np.arange(len(order))
    width = 0.8 / max(1, len(stacks))
    for i, stack in enumerate(stacks):
        s = sub[sub["stack"] == stack].groupby("group")[["mean", "ci_half"]].mean().reindex(order)
        offset = (i - (len(stacks) - 1) / 2) * width
        interval_bars(
            ax, x + offset, s["mean"] / scale, s["ci_half"] / scale, width, colors[stack], stack
        )
        if reps is not None:
            r = reps[(reps["stack"] == stack) & reps["group"].isin(order)]
            # beside the error bar, not on it
            pos = r["group"].map({g: k for k, g in enumerate(order)}).to_numpy(float)
            pos = pos + offset + width / 4
            ax.scatter(pos, r["value"] / scale, s=10, color="black", zorder=3, edgecolors="white")
    long_labels = max((len(o) for o in order), default=0) > 8
    rotation, ha = (30, "right") if long_labels else (0, "center")
    ax.set_xticks(x, order, rotation=rotation, ha=ha)
    if order:  # every group keeps its place, drawn or withheld
        ax.set_xlim(-0.5, len(order) - 0.5)
    log_y(ax)
    return order


def throughput_figure(
    arms: pd.DataFrame,
    reps: pd.DataFrame | None,
    rw: str,
    metric: str = "bw_bytes",
    stacks: Iterable[str] | None = None,
    host: str | None = None,
    pattern: str | None = None,
) -> matplotlib.figure.Figure:
    """Grouped bars for one rw pattern: block size on x, stacks side by side, log y, one panel per
    iodepth; bar = mean over repetitions, error bar = its per-arm unpaired interval (arms), dots
    = the repetitions (reps). ``pattern``: only that config pattern's cells ("" = the main
    matrix); None = all, each pattern's cells in bar groups of their own."""
    house_style()
    summ = _arm_rows(arms, metric, host)
    summ = summ[summ["rw"] == rw]
    if pattern is not None:
        summ = summ[summ["pattern"] == pattern]
    if summ.empty:
        raise ValueError(f"no {rw} results to plot")
    stacks = list(stacks) if stacks is not None else sorted(summ["stack"].unique())
    summ = summ[summ["stack"].isin(stacks)]
    summ = summ.assign(group=_bar_groups(summ))
    depths = sorted(summ["iodepth"].unique())
    scale = {"bw_bytes": 2**20}.get(metric, 1)
    colors = dict(zip(stacks, sns.color_palette(n_colors=len(stacks)), strict=True))
    fig, axes = panels(1, len(depths), max(4.0, 3.2 * len(depths)) + 1.2, 3.8, sharey=True)
    if reps is not None:
        reps = reps[reps["stack"].isin(stacks) & (reps["rw"] == rw)]
        reps = reps[reps["host"] == host] if host else reps
        reps = reps.rename(columns={metric: "value"})
        reps = reps.assign(group=_bar_groups(reps, summ)) if len(reps) else None
    for ax, qd in zip(axes[0], depths, strict=True):
        at_qd = None if reps is None else reps[reps["iodepth"] == qd]
        _stack_bars(ax, summ[summ["iodepth"] == qd], stacks, colors, scale, at_qd)
        ax.set_title(f"iodepth {qd}")
        ax.set_xlabel("block size")
    axes[0][0].set_ylabel(metric_label(metric))
    # an interval reaching 0 or below cannot be drawn on a log axis: let it run off the bottom
    # (clipped) instead of stretching the axis over decades no bar reaches
    smallest = float(np.nanmin(summ["mean"].to_numpy(float))) / scale
    if np.isfinite(smallest) and smallest > 0:
        axes[0][0].set_ylim(bottom=smallest / 4)
    named = [p for p in summ["pattern"].unique() if p]
    fig.suptitle(
        f"{rw}{' [' + ', '.join(sorted(named)) + ']' if named else ''}: {metric_heading(metric)}\n"
        f"mean of {int(summ['n'].max())} repetitions (dots), "
        f"{float(summ['confidence'].iloc[0]):.0%} CI per arm, unpaired",
        fontsize="medium",
    )
    legend_below(fig, axes[0][0], "stack", ncols=len(stacks))
    return fig


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


_NINES = [0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999]


def percentile_curve(hist: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(x, latency_ns) of a histogram (columns ns, count): x = -log10(1 - p) at each bin's
    mid-rank, so p50, p90, p99 ... are evenly spaced; cut where fewer than
    :data:`~luksbench.analysis.tails.MIN_BEYOND` completions lie beyond (the loss table reports
    no percentile there either)."""
    h = hist.groupby("ns", sort=True)["count"].sum()
    counts = h.to_numpy(float)
    total = counts.sum()
    if total <= 0:
        return np.array([]), np.array([])
    p = (np.cumsum(counts) - counts / 2) / total
    kept = total * (1 - p) >= MIN_BEYOND
    return -np.log10(1 - p[kept]), h.index.to_numpy(float)[kept]


def _rows(table: pd.DataFrame, where: dict) -> pd.DataFrame:
    """The rows of ``table`` whose columns hold ``where``'s values."""
    return table[(table[list(where)] == pd.Series(where)).fillna(False).all(axis=1)]


def _latency_curves(ax, hist: pd.DataFrame, label: str, style: dict) -> float:
    """A thin percentile curve per repetition of one arm and cell; how far right they reach."""
    reach = 0.0
    for k, (_, rep) in enumerate(hist.groupby(["rep", "job_slot"])):
        x, y = percentile_curve(rep)
        reach = max(reach, float(x.max()) if len(x) else 0.0)
        ax.plot(x, y / 1e6, **style, alpha=0.5, linewidth=0.8, label=None if k else label)
    return reach


def _table_points(ax, arms: pd.DataFrame, color) -> None:
    """The loss table's percentiles of one arm and cell (arms.parquet: mean over repetitions of
    each repetition's percentile) with their t-intervals."""
    for metric, percent in PERCENTILES.items():
        row = arms[arms["metric"] == metric]
        if row.empty or pd.isna(row["mean"].iloc[0]):
            continue  # too few I/Os: the table has no number either
        mean, half = row["mean"].iloc[0] / 1e6, row["ci_half"].iloc[0] / 1e6
        x = -math.log10(1 - percent / 100)
        ax.plot([x], [mean], color=color, marker="o", markersize=4, linestyle="none")
        log_intervals(ax, [x], [mean], [mean - half], [mean + half], color=color)


def latency_figure(
    lat: pd.DataFrame,
    arms: pd.DataFrame,
    rw: str,
    stacks: Iterable[str] | None = None,
    host: str | None = None,
    pattern: str | None = None,
) -> matplotlib.figure.Figure:
    """Completion-latency percentile curves for one rw pattern: rows = block size (and config
    pattern, when there are several), columns = iodepth; per stack a thin curve per repetition and
    points with intervals at the loss table's percentiles (``arms``: the same quantity the table
    compares). ``pattern``: only that config pattern's cells."""
    house_style()
    df = lat[lat["rw"] == rw]
    if "pattern" not in df.columns:
        df = df.assign(pattern="")
    if host is not None:
        df, arms = df[df["host"] == host], arms[arms["host"] == host]
    if pattern is not None:
        df = df[df["pattern"] == pattern]
    if df.empty:
        raise ValueError(f"no {rw} latency histograms to plot")
    arms = arms[arms["rw"] == rw]
    stacks = list(stacks) if stacks is not None else sorted(df["stack"].unique())
    stacks = [s for s in stacks if s in set(df["stack"])]
    colors = dict(zip(stacks, sns.color_palette(n_colors=len(stacks)), strict=True))
    # one row per (pattern, block size): cells of two patterns are never pooled
    bss = sorted(map(tuple, df[["pattern", "bs_bytes"]].drop_duplicates().to_numpy().tolist()))
    multi_pattern = df["pattern"].nunique() > 1
    depths = sorted(df["iodepth"].unique())
    directions = sorted(df["direction"].unique())
    styles = dict(zip(directions, ["-", "--", ":"], strict=False))
    fig, axes = panels(
        len(bss), len(depths), 1.2 + 3.4 * len(depths), 1.2 + 2.6 * len(bss), sharex=True
    )
    max_x = -math.log10(1 - max(PERCENTILES.values()) / 100)
    for i, (pat, bs) in enumerate(bss):
        for j, qd in enumerate(depths):
            ax = axes[i][j]
            in_cell = {"pattern": pat, "bs_bytes": bs, "iodepth": qd}
            arms_here = []
            for stack in stacks:
                for direction in directions:
                    where = {**in_cell, "stack": stack, "direction": direction}
                    label = stack if len(directions) == 1 else f"{stack} {direction}"
                    style = {"color": colors[stack], "linestyle": styles[direction]}
                    max_x = max(max_x, _latency_curves(ax, _rows(df, where), label, style))
                    arms_here.append((_rows(arms, where), colors[stack]))
            log_y(ax)
            bottom = ax.get_ylim()[0]  # an interval reaching below the curves runs off the panel
            for rows, color in arms_here:
                _table_points(ax, rows, color)
            ax.set_ylim(bottom=bottom)
            where = f" ({pat or 'main'})" if multi_pattern else ""
            ax.set_title(f"bs {bs_label(int(bs))}, iodepth {qd}{where}", fontsize="medium")
            if j == 0:
                ax.set_ylabel("completion latency (ms)")
            if i == len(bss) - 1:
                ax.set_xlabel("percentile")
    ticks = [t for t in _NINES if -math.log10(1 - t) <= max_x + 0.5] or _NINES[:3]
    for ax in axes.flat:
        ax.set_xticks(
            [-math.log10(1 - t) for t in ticks], [f"p{100 * t:g}" for t in ticks], rotation=30
        )
    named = sorted(p for p in df["pattern"].unique() if p)
    fig.suptitle(
        f"{(host + ': ') if host else ''}{rw}{' [' + ', '.join(named) + ']' if named else ''}: "
        "completion-latency percentiles (json+ histograms)\n"
        f"lines: one repetition, cut where fewer than {MIN_BEYOND} I/Os lie beyond; "
        "points: the loss table's p50/p99/p99.9 (mean of repetitions, t-interval)",
        fontsize="medium",
    )
    legend_below(fig, axes, "stack", ncols=4)
    return fig


def cipher_figure(cryptsetup: pd.DataFrame) -> matplotlib.figure.Figure:
    """``cryptsetup benchmark`` cipher rows: encryption and decryption MiB/s per cipher and key
    size (one panel per host); raises ValueError when no cipher row is available."""
    house_style()
    cs = available_ciphers(cryptsetup)
    if cs.empty:
        raise ValueError("no cipher benchmark rows")
    hosts = sorted(cs["host"].unique())
    n = cs.groupby("host").size().max()
    fig, axes = panels(1, len(hosts), 1.5 + 4.5 * len(hosts), 1.4 + 0.32 * n * 2, sharex=True)
    palette = sns.color_palette(n_colors=2)
    for ax, host in zip(axes[0], hosts, strict=True):
        sub = cs[cs["host"] == host].reset_index(drop=True)
        labels = [cipher_label(r) for _, r in sub.iterrows()]
        y = np.arange(len(sub))
        ax.barh(y - 0.2, sub["encryption_mib_s"], 0.4, label="encryption", color=palette[0])
        ax.barh(y + 0.2, sub["decryption_mib_s"], 0.4, label="decryption", color=palette[1])
        ax.set_yticks(y, labels)
        ax.set_ylim(len(sub) - 0.5, -0.5)
        ax.set_xlabel("MiB/s (one core, memory only)")
        ax.set_title(host, fontsize="medium")
    estimated = any(is_estimate(r) for _, r in cs.iterrows())
    where = " (userspace estimates from openssl where marked)" if estimated else ""
    fig.suptitle(f"cryptsetup benchmark: cipher throughput{where}", fontsize="medium")
    legend_below(fig, axes[0][0], ncols=2)
    return fig


_CPU_WHAT = {
    "busy_cpu_s_per_gib": "CPU cost per GiB moved: all non-idle CPU time (user + system + irq …)",
    "sys_cpu_s_per_gib": "CPU cost per GiB moved: system (kernel) CPU time",
    "cpu_util_pct": "CPU utilisation: busy share of all CPUs during the run",
    "busy_cpu_us_per_io": "CPU cost per I/O: all non-idle CPU time",
}


def cpu_figure(
    arms: pd.DataFrame,
    metric: str = "busy_cpu_s_per_gib",
    stacks: Iterable[str] | None = None,
    host: str | None = None,
    net: bool = False,
    withheld_cells: dict | None = None,
) -> matplotlib.figure.Figure:
    """A CPU cost metric (:data:`~luksbench.analysis.loss.CPU_METRICS`) by block size (x), one bar
    per stack with its interval (arms.parquet); rows = iodepth, columns = rw pattern; log y.
    ``net``: the values are net of the idle baseline (the fio table's ``cpu_net``), else gross.
    ``withheld_cells``: {(rw, bs_bytes, iodepth): why} of the cells the loss table withholds:
    no bars there, the reason written in their place."""
    house_style()
    summ = _arm_rows(arms, metric, host)
    if summ.empty:
        raise ValueError(f"no {metric} values (no CPU sidecars?)")
    why = summ.apply(lambda r: (withheld_cells or {}).get(_cell_key(r), ""), axis=1)
    if len(summ) and why.ne("").all():
        raise ValueError(f"every cell's {metric} is withheld")
    summ = summ.assign(why=why)
    summ.loc[why.ne(""), ["mean", "ci_half"]] = np.nan
    stacks = list(stacks) if stacks is not None else sorted(summ["stack"].unique())
    stacks = [s for s in stacks if s in set(summ["stack"])]
    colors = dict(zip(stacks, sns.color_palette(n_colors=len(stacks)), strict=True))
    rws, depths = sorted(summ["rw"].unique()), sorted(summ["iodepth"].unique())
    fig, axes = panels(
        len(depths), len(rws), 1.2 + 2.6 * len(rws), 1.4 + 2.6 * len(depths), sharey=True
    )
    for i, qd in enumerate(depths):
        for j, rw in enumerate(rws):
            ax = axes[i][j]
            sub = summ[(summ["iodepth"] == qd) & (summ["rw"] == rw)]
            sub = sub.assign(group=_bar_groups(sub, summ))
            order = _stack_bars(ax, sub, stacks, colors)
            for group, reason in sub[sub["why"].ne("")].groupby("group")["why"].first().items():
                ax.text(
                    order.index(group),
                    0.5,
                    f"withheld:\n{reason}",
                    rotation=90,
                    transform=ax.get_xaxis_transform(),
                    ha="center",
                    va="center",
                    fontsize="x-small",
                    color="#555555",
                )
            ax.set_title(f"{rw}, iodepth {qd}", fontsize="medium")
            if i == len(depths) - 1:
                ax.set_xlabel("block size")
        axes[i][0].set_ylabel(metric_label(metric))
    fig.suptitle(
        f"{(host + ': ') if host else ''}{_CPU_WHAT.get(metric, metric)}\n"
        f"whole machine, /proc/stat, {cpu_basis(net)}; mean over repetitions, "
        f"{float(summ['confidence'].iloc[0]):.0%} CI",
        fontsize="medium",
    )
    legend_below(fig, axes[0][0], "stack", ncols=len(stacks))
    return fig


def _cell_key(row) -> tuple:
    """(rw, bs_bytes, iodepth): a cell of arms or loss rows, for matching the two."""
    return (str(row["rw"]), int(row["bs_bytes"]), int(row["iodepth"]))


def withheld_by_cell(loss: pd.DataFrame, metric: str, host: str | None = None) -> dict:
    """{(rw, bs_bytes, iodepth): why} of ``metric``'s withheld loss rows (any comparison)."""
    rows = loss[loss["metric"] == metric]
    if host is not None:
        rows = rows[rows["host"] == host]
    rows = rows.assign(why=withheld(rows))
    return {_cell_key(r): r["why"] for _, r in rows[rows["why"].ne("")].iterrows()}


def _ceiling_cells(arms: pd.DataFrame, ceilings: list[dict], host: str | None) -> pd.DataFrame:
    """Bandwidth of the LUKS stacks per cell (arms.parquet), with a ``cell`` label."""
    summ = _arm_rows(arms, "bw_bytes", host)
    summ = summ[summ["stack"].isin([c["stack"] for c in ceilings])]
    if summ.empty:
        raise ValueError("no LUKS stack bandwidth to draw")
    summ = summ.sort_values(["pattern", "rw", "bs_bytes", "iodepth", "direction"])
    return summ.assign(cell=summ.apply(cell_name, axis=1))


def _ceiling_note(ax, ceilings: list[dict]) -> None:
    """Where a ceiling is missing, the reason on the figure instead of a line."""
    notes = [f"{c['stack']}: no ceiling, {c['reason']}" for c in ceilings if c["reason"]]
    if not notes:
        return
    box = {"boxstyle": "round", "facecolor": "#fdf2e9", "edgecolor": "#c0392b"}
    text = "\n".join(wrap(n, 90) for n in notes)
    ax.text(
        0.5, 0.97, text, transform=ax.transAxes, ha="center", va="top", fontsize="small", bbox=box
    )
    ax.set_ylim(top=ax.get_ylim()[1] * 30)  # room for the note above the bars


def _ceiling_title(ceilings: list[dict], host: str | None) -> str:
    known = [
        f"{c['stack']}: {c['algorithm']} {c['key_bits']}-bit, {fmt_num(c['dec_mib_s'])} MiB/s "
        f"decryption / {fmt_num(c['enc_mib_s'])} MiB/s encryption per core \u00d7 {c['cpus']} CPUs"
        + (f" ({c['source']})" if is_estimate(c) else "")
        for c in ceilings
        if c["reason"] is None
    ]
    return f"{(host + ': ') if host else ''}Encrypted bandwidth and the crypto ceiling\n" + (
        wrap("; ".join(known), 110) if known else "cipher benchmark unavailable: no ceiling drawn"
    )


def ceiling_figure(
    arms: pd.DataFrame, ceilings: list[dict], host: str | None = None
) -> matplotlib.figure.Figure:
    """Measured bandwidth of each LUKS stack per cell (bars with their intervals) under the crypto
    ceiling (decryption x CPUs for reads, encryption x CPUs for writes). Where the cipher
    benchmark is missing, the figure says why instead of drawing a line: no number is invented."""
    house_style()
    ceilings = [c for c in ceilings if host is None or c["host"] == host]
    summ = _ceiling_cells(arms, ceilings, host)
    cells = list(dict.fromkeys(summ["cell"]))
    stacks = list(dict.fromkeys(summ["stack"]))
    colors = dict(zip(stacks, sns.color_palette(n_colors=len(stacks) + 1)[1:], strict=True))
    fig, ax = plt.subplots(figsize=(max(8.0, 2.0 + 0.55 * len(cells)), 4.6), layout="constrained")
    width = 0.8 / max(1, len(stacks))
    x = {c: i for i, c in enumerate(cells)}
    for k, stack in enumerate(stacks):
        s = summ[summ["stack"] == stack]
        offset = (k - (len(stacks) - 1) / 2) * width
        xs = s["cell"].map(x).to_numpy(float) + offset
        mean, half = s["mean"] / 2**20, s["ci_half"] / 2**20
        interval_bars(ax, xs, mean, half, width, colors[stack], f"{stack} measured", capsize=2)
        ceiling = next(c for c in ceilings if c["stack"] == stack)
        if ceiling["reason"] is None:  # over each bar: the read ceiling, for writes the write one
            tops = [
                ceiling[f"{'write' if d == 'write' else 'read'}_ceiling_mib_s"]
                for d in s["direction"]
            ]
            label = "crypto ceiling (cipher \u00d7 CPUs)"
            if is_estimate(ceiling):
                label = f"crypto ceiling, {ceiling['source']} (cipher \u00d7 CPUs)"
            ax.hlines(tops, xs - width / 2, xs + width / 2, colors="black", lw=2, label=label)
    log_y(ax)
    ax.set_xticks(range(len(cells)), cells, rotation=45, ha="right")
    ax.set_ylabel("bandwidth (MiB/s)")
    _ceiling_note(ax, ceilings)
    fig.suptitle(_ceiling_title(ceilings, host), fontsize="medium")
    legend_below(fig, ax, ncols=3)
    return fig
