"""Paired loss table: what does the variant stack (luks) cost against the baseline (plain)?

Design: rep k of every stack forms pair k (same cell, run back to back). For each cell (host,
workload, job slot, direction) and metric we take the log ratio of every complete pair,
``d_k = ln(variant_k / baseline_k)``, and a paired t-interval on the mean of ``d``. Ratios are the
natural scale for throughput and latency (effects multiply, the log makes them symmetric) and the
back-transformed mean is the geometric-mean ratio ``r = exp(mean d)``.

Reported effect, always "how much worse the variant is", in percent:

* higher-is-better metrics (bandwidth, IOPS): ``loss_pct = 100 (1 - r)``, bounds from the interval
  on ``d`` transformed and swapped (``ci_low = 100 (1 - exp(d_hi))``, ``ci_high = 100 (1 - exp(d_lo))``);
* higher-is-worse metrics (latency, CPU seconds per GiB): ``increase_pct = 100 (r - 1)``, bounds
  ``100 (exp(d_lo) - 1)``, ``100 (exp(d_hi) - 1)``.

Per row exactly one of ``loss_pct`` / ``increase_pct`` is filled; ``effect`` says which and
``effect_pct`` repeats it, so ``ci_low``/``ci_high`` always bound ``effect_pct``. Pairs with a
missing side or a value <= 0 are excluded and counted in ``n_dropped``.

One function per concern (pairing, interval, transform, verdict) so that multiple-testing control,
equivalence tests and Fieller intervals can slot in beside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

#: metric -> higher is better?
METRICS: dict[str, bool] = {
    "bw_bytes": True,
    "iops": True,
    "lat_mean_ns": False,
    "clat_mean_ns": False,
    "clat_p50_ns": False,
    "clat_p99_ns": False,
    "clat_p999_ns": False,
    "busy_cpu_s_per_gib": False,
    "sys_cpu_s_per_gib": False,
}
DEFAULT_METRICS = ("bw_bytes", "iops", "clat_p99_ns")

#: a cell: where one comparison lives (job_slot pairs jobs of multi-job files by their position)
CELL_KEYS = ["host", "workload", "job_slot", "direction"]
#: descriptive columns carried per cell
CELL_ATTRS = ["rw", "bs_bytes", "iodepth", "job"]

LOSS_COLUMNS = [
    "host",
    "workload",
    "rw",
    "bs_bytes",
    "iodepth",
    "direction",
    "job",
    "job_slot",
    "metric",
    "higher_is_better",
    "baseline",
    "variant",
    "n",
    "n_dropped",
    "baseline_mean",
    "variant_mean",
    "mean_log_ratio",
    "sd_log_ratio",
    "ratio",
    "effect",
    "effect_pct",
    "loss_pct",
    "increase_pct",
    "ci_low",
    "ci_high",
    "confidence",
    "verdict",
]

VERDICTS = ("significant", "inconclusive", "insufficient")

#: fio rw -> directions that carry its I/O (other directions of a job are not measurements)
ACTIVE_DIRECTIONS = {
    "read": {"read"},
    "randread": {"read"},
    "write": {"write"},
    "randwrite": {"write"},
    "rw": {"read", "write"},
    "readwrite": {"read", "write"},
    "randrw": {"read", "write"},
    "trim": {"trim"},
    "randtrim": {"trim"},
    "trimwrite": {"trim", "write"},
    "randtrimwrite": {"trim", "write"},
}


def higher_is_better(metric: str) -> bool:
    try:
        return METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}") from None


# ----------------------------------------------------------------------------------------- pairing


def active_rows(fio: pd.DataFrame) -> pd.DataFrame:
    """Rows whose direction carries the job's I/O (a randread job's write row is not a measurement).

    Unknown rw patterns fall back to ``io_bytes > 0``.
    """

    def active(row) -> bool:
        dirs = ACTIVE_DIRECTIONS.get(str(row["rw"]) if pd.notna(row["rw"]) else "")
        if dirs is None:
            return bool(pd.notna(row["io_bytes"]) and row["io_bytes"] > 0)
        return row["direction"] in dirs

    if fio.empty:
        return fio
    return fio[fio.apply(active, axis=1)]


def rep_values(fio: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per (stack, rep, cell): jobs with several entries (numjobs without group_reporting)
    are combined — throughput summed, latency and CPU columns IOPS-weighted mean."""
    df = active_rows(fio)
    keys = ["stack", "rep", *CELL_KEYS]
    df = df.assign(_w=df["iops"].where(df["iops"] > 0, 1.0).fillna(1.0))

    def combine(g: pd.DataFrame) -> pd.Series:
        out = {a: g[a].iloc[0] for a in CELL_ATTRS}
        for m in metrics:
            v = g[m]
            if METRICS[m]:
                out[m] = v.sum(min_count=len(g))  # any missing entry -> missing
            elif m in ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib"):
                out[m] = (
                    v.iloc[0] if v.nunique(dropna=False) == 1 else np.average(v, weights=g["_w"])
                )
            else:
                out[m] = np.average(v, weights=g["_w"]) if v.notna().all() else math.nan
        return pd.Series(out)

    if df.empty:
        return pd.DataFrame(columns=[*keys, *CELL_ATTRS, *metrics])
    grouped = df.groupby(keys, sort=True, dropna=False)
    rows = [{**dict(zip(keys, k, strict=True)), **combine(g)} for k, g in grouped]
    return pd.DataFrame(rows)


def pair_values(fio: pd.DataFrame, baseline: str, variant: str, metrics: list[str]) -> pd.DataFrame:
    """Long table: one row per cell x metric x rep with ``baseline_value`` and ``variant_value``
    (NaN where that side is missing)."""
    stacks = set(fio["stack"].dropna().unique()) if not fio.empty else set()
    for name in (baseline, variant):
        if name not in stacks:
            raise ValueError(f"stack {name!r} not in the data (stacks: {sorted(stacks)})")
    vals = rep_values(fio[fio["stack"].isin([baseline, variant])], metrics)
    long = vals.melt(
        id_vars=["stack", "rep", *CELL_KEYS, *CELL_ATTRS],
        value_vars=metrics,
        var_name="metric",
        value_name="value",
    )
    long["value"] = pd.to_numeric(long["value"], errors="coerce").astype("float64")
    base = long[long["stack"] == baseline].drop(columns="stack")
    var = long[long["stack"] == variant].drop(columns=["stack", *CELL_ATTRS])
    on = [*CELL_KEYS, "metric", "rep"]
    paired = base.merge(var, on=on, how="outer", suffixes=("_baseline", "_variant"))
    paired = paired.rename(
        columns={"value_baseline": "baseline_value", "value_variant": "variant_value"}
    )
    # cell attributes from whichever side exists
    attrs = vals[[*CELL_KEYS, *CELL_ATTRS]].drop_duplicates(CELL_KEYS)
    paired = paired.drop(columns=CELL_ATTRS).merge(attrs, on=CELL_KEYS, how="left")
    return paired.sort_values([*CELL_KEYS, "metric", "rep"]).reset_index(drop=True)


def usable_pairs(baseline: np.ndarray, variant: np.ndarray) -> np.ndarray:
    """Mask of pairs with both sides present and > 0 (a log ratio exists)."""
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    with np.errstate(invalid="ignore"):
        return np.isfinite(b) & np.isfinite(v) & (b > 0) & (v > 0)


# --------------------------------------------------------------------------------------- interval


@dataclass(frozen=True)
class LogRatioCI:
    n: int
    mean: float
    sd: float
    low: float
    high: float


def paired_log_ratio_ci(d: np.ndarray, confidence: float = 0.95) -> LogRatioCI:
    """Paired t-interval on the mean of log ratios ``d``; bounds NaN for n < 2."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    d = np.asarray(d, float)
    n = int(d.size)
    if n == 0:
        return LogRatioCI(0, math.nan, math.nan, math.nan, math.nan)
    mean = float(d.mean())
    if n < 2:
        return LogRatioCI(n, mean, math.nan, math.nan, math.nan)
    sd = float(d.std(ddof=1))
    half = float(sps.t.ppf(0.5 + confidence / 2, df=n - 1)) * sd / math.sqrt(n)
    return LogRatioCI(n, mean, sd, mean - half, mean + half)


# -------------------------------------------------------------------------------------- transform


def effect_from_log_ratio(
    mean: float, low: float, high: float, better_high: bool
) -> tuple[float, float, float]:
    """(effect_pct, ci_low, ci_high): loss for higher-is-better metrics, increase otherwise."""
    if better_high:
        return 100 * (1 - math.exp(mean)), 100 * (1 - math.exp(high)), 100 * (1 - math.exp(low))
    return 100 * (math.exp(mean) - 1), 100 * (math.exp(low) - 1), 100 * (math.exp(high) - 1)


# ---------------------------------------------------------------------------------------- verdict


def verdict(ci: LogRatioCI) -> str:
    """ "significant" if the interval on the log ratio excludes 0, "inconclusive" if it contains 0,
    "insufficient" with fewer than two pairs."""
    if ci.n < 2 or math.isnan(ci.low) or math.isnan(ci.high):
        return "insufficient"
    return "significant" if ci.low > 0 or ci.high < 0 else "inconclusive"


# ------------------------------------------------------------------------------------------ table


def loss_table(
    fio: pd.DataFrame,
    baseline: str = "plain",
    variant: str = "luks",
    metrics: list[str] | tuple[str, ...] | None = None,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """The paired loss table (columns :data:`LOSS_COLUMNS`) from a tidy fio table (``fio_table``)."""
    metrics = list(metrics or DEFAULT_METRICS)
    for m in metrics:
        higher_is_better(m)
        if m not in fio.columns:
            raise ValueError(f"metric {m!r} is not a column of the fio table")
    paired = pair_values(fio, baseline, variant, metrics)
    rows = []
    for key, g in paired.groupby([*CELL_KEYS, "metric"], sort=True, dropna=False):
        cell = dict(zip([*CELL_KEYS, "metric"], key, strict=True))
        metric = cell["metric"]
        better_high = METRICS[metric]
        b, v = g["baseline_value"].to_numpy(float), g["variant_value"].to_numpy(float)
        ok = usable_pairs(b, v)
        ci = paired_log_ratio_ci(np.log(v[ok] / b[ok]), confidence)
        if ci.n:
            effect_pct, lo, hi = effect_from_log_ratio(ci.mean, ci.low, ci.high, better_high)
            if math.isnan(ci.low):
                lo = hi = math.nan
        else:
            effect_pct = lo = hi = math.nan
        rows.append(
            {
                **cell,
                **{a: g[a].iloc[0] for a in CELL_ATTRS},
                "higher_is_better": better_high,
                "baseline": baseline,
                "variant": variant,
                "n": ci.n,
                "n_dropped": int((~ok).sum()),
                "baseline_mean": float(b[ok].mean()) if ci.n else math.nan,
                "variant_mean": float(v[ok].mean()) if ci.n else math.nan,
                "mean_log_ratio": ci.mean,
                "sd_log_ratio": ci.sd,
                "ratio": math.exp(ci.mean) if ci.n else math.nan,
                "effect": "loss" if better_high else "increase",
                "effect_pct": effect_pct,
                "loss_pct": effect_pct if better_high else math.nan,
                "increase_pct": math.nan if better_high else effect_pct,
                "ci_low": lo,
                "ci_high": hi,
                "confidence": confidence,
                "verdict": verdict(ci),
            }
        )
    table = pd.DataFrame(rows, columns=LOSS_COLUMNS)
    if not table.empty:
        order = {m: i for i, m in enumerate(metrics)}
        table = (
            table.assign(_m=table["metric"].map(order))
            .sort_values(["host", "rw", "bs_bytes", "iodepth", "job_slot", "direction", "_m"])
            .drop(columns="_m")
            .reset_index(drop=True)
        )
    return _loss_dtypes(table)


def _loss_dtypes(table: pd.DataFrame) -> pd.DataFrame:
    for col in (
        "host",
        "workload",
        "rw",
        "direction",
        "job",
        "metric",
        "baseline",
        "variant",
        "effect",
        "verdict",
    ):
        table[col] = table[col].astype("string")
    for col in ("bs_bytes", "iodepth", "job_slot", "n", "n_dropped"):
        table[col] = pd.to_numeric(table[col]).astype("int64")
    table["higher_is_better"] = table["higher_is_better"].astype(bool)
    for col in LOSS_COLUMNS:
        if col in (
            "baseline_mean",
            "variant_mean",
            "mean_log_ratio",
            "sd_log_ratio",
            "ratio",
            "effect_pct",
            "loss_pct",
            "increase_pct",
            "ci_low",
            "ci_high",
            "confidence",
        ):
            table[col] = table[col].astype("float64")
    return table


def loss_table_from_raw(
    raw_dir: Path,
    baseline: str = "plain",
    variant: str = "luks",
    metrics: list[str] | None = None,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """:func:`loss_table` straight from a raw run folder (strict ingest)."""
    from luksbench.ingest import fio_table

    return loss_table(fio_table(Path(raw_dir)), baseline, variant, metrics, confidence)


def write_loss(
    processed_dir: Path,
    baseline: str = "plain",
    variant: str = "luks",
    metrics: list[str] | None = None,
    confidence: float = 0.95,
) -> tuple[pd.DataFrame, Path]:
    """Read ``fio.parquet`` from ``processed_dir``, write ``loss.parquet`` beside it."""
    processed_dir = Path(processed_dir)
    table = loss_table(
        pd.read_parquet(processed_dir / "fio.parquet"), baseline, variant, metrics, confidence
    )
    path = processed_dir / "loss.parquet"
    table.to_parquet(path, index=False)
    return table, path
