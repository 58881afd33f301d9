"""Figures of what each stack measured (one arm at a time): throughput bars with every
repetition, completion-latency percentile curves, CPU cost, the cipher benchmark and the crypto
ceiling. Every number drawn comes from a processed table (arms, reps, latency, cryptsetup)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import matplotlib.figure
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from luksbench.analysis.cells import with_pattern
from luksbench.analysis.tails import MIN_BEYOND, PERCENTILES
from luksbench.formats.layout import bs_label
from luksbench.publish.ceilings import available_ciphers, cipher_label, is_estimate
from luksbench.publish.figures import cell_key
from luksbench.publish.style import (
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
    fmt_num,
    metric_heading,
    metric_label,
)


def _arm_rows(arms: pd.DataFrame, metric: str, host: str | None = None) -> pd.DataFrame:
    """The arms.parquet rows of one metric (and host) that have a mean."""
    rows = arms[arms["metric"] == metric]
    if host is not None:
        rows = rows[rows["host"] == host]
    return with_pattern(rows[np.isfinite(rows["mean"].astype(float))])


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
    why = summ.apply(lambda r: (withheld_cells or {}).get(cell_key(r), ""), axis=1)
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
