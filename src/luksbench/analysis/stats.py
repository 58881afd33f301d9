"""Paired loss table: what does the variant stack (luks) cost against the baseline (plain)?

Rep k of every stack forms pair k (same cell, same session, run back to back). Per cell
(:data:`CELL_KEYS`; pairs never cross hosts) and metric, the log ratios of the complete pairs,
``d_k = ln(variant_k / baseline_k)``, get an interval on mean d (which one: :func:`luksbench.analysis.cellstats.cell_stats`);
``r = exp(mean d)`` is the geometric-mean ratio (effects multiply). The effect is always how much
worse the variant is, in percent: ``loss_pct = 100 (1 - r)`` for higher-is-better metrics
(bounds swapped), ``increase_pct = 100 (r - 1)`` for the others; ``effect_pct`` repeats the filled
one. Every column, decision and verdict: README, "How sure: the statistics". Comparing two runs
is :mod:`luksbench.analysis.runcompare`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as sps

from luksbench.analysis import drift
from luksbench.analysis import moderated as eb
from luksbench.analysis.cells import CELL_ATTRS, CELL_KEYS, active_rows, with_pattern
from luksbench.analysis.cellstats import CROSS_CHECK_COLUMNS, CellData, TestSettings, cell_stats  # noqa: F401

# the math the table rests on, named here too for the callers that know it as stats.*
from luksbench.analysis.statmath import (  # noqa: F401
    BOOTSTRAP_MIN_PAIRS,
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    OUTLIER_MIN_PAIRS,
    OUTLIER_Z,
    LogRatioCI,
    WelchLogCI,
    _check_confidence,
    _scale,
    _t_pvalue,
    _t_quantile,
    benjamini_hochberg,
    bonferroni,
    bootstrap_log_ratio_ci,
    decision,
    effect_bounds_from_ratio,
    effect_from_log_ratio,
    effect_with_equivalence,
    fieller_ratio_ci,
    flag_outliers,
    half_width_log,
    modified_z,
    paired_log_ratio_ci,
    paired_t_pvalue,
    session_components,
    stein_pairs,
    table_verdicts,
    tost_confidence,
    usable_pairs,
    welch_log_ratio_ci,
    welch_t_pvalue,
)

_HIGHER_IS_WORSE = ("lat_mean_ns", "clat_mean_ns", "clat_p50_ns", "clat_p99_ns", "clat_p999_ns")
_HIGHER_IS_WORSE += ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib", "cpu_util_pct")
_HIGHER_IS_WORSE += ("busy_cpu_us_per_io",)
#: metric -> higher is better?
METRICS = {"bw_bytes": True, "iops": True, **dict.fromkeys(_HIGHER_IS_WORSE, False)}
#: every metric but the mean latencies (the percentiles describe latency)
DEFAULT_METRICS = tuple(m for m in METRICS if "mean" not in m)
#: the Ceph arms' client and OSD CPU (analysis.ceph_tables): compared in the Ceph loss table only
_CEPH_CPU = ("client_cpu_s_per_gib", "client_cpu_us_per_io", "osd_cpu_s_per_gib")
METRICS |= dict.fromkeys((*_CEPH_CPU, "osd_cpu_us_per_io"), False)
#: metric -> family of its decision regions (config ``analysis.decision_regions``)
METRIC_FAMILIES = {m: "latency" for m in METRICS if "lat" in m}
METRIC_FAMILIES |= {"bw_bytes": "throughput", "iops": "throughput"}
METRIC_FAMILIES |= {m: "cpu" for m in METRICS if "cpu" in m}
#: family -> (lower, upper) margin in % of the effect: negligible within +-lower, moderate between
#: lower and upper, material beyond upper (gains likewise on the other side)
DEFAULT_DECISION_REGIONS = {"throughput": (5.0, 20.0), "latency": (10.0, 50.0), "cpu": (10.0, 50.0)}
#: metric -> the metric whose test it repeats at a fixed block size (``derived_from``)
DERIVED_FROM = {"iops": "bw_bytes", "busy_cpu_us_per_io": "busy_cpu_s_per_gib"}
DERIVED_FROM |= {f"{who}_cpu_us_per_io": f"{who}_cpu_s_per_gib" for who in ("client", "osd")}
#: +- percentage points inside which a cell counts as "equivalent" (config analysis.equivalence_margin_pct)
DEFAULT_EQUIVALENCE_MARGIN_PCT = 2.0
#: columns naming a row of a loss or comparison table: the cell, the metric and its direction
ROW_COLUMNS = ["workload", "rw", "bs_bytes", "iodepth", "direction", "job", "job_slot"]
ROW_COLUMNS += ["metric", "higher_is_better"]
#: the significance test and equivalence check of a row (loss and comparison tables alike)
TEST_COLUMNS = ["p_value", "q_value", "equivalence_margin_pct", "equiv_low", "equiv_high"]
TEST_COLUMNS += ["equivalent"]
#: loss.parquet's columns, in order (new columns are appended: the others keep their places)
LOSS_COLUMNS = [
    "host",
    *ROW_COLUMNS,
    *("baseline", "variant", "n", "n_dropped", "baseline_mean", "variant_mean"),
    *("mean_log_ratio", "sd_log_ratio", "ratio", "effect", "effect_pct", "loss_pct"),
    *("increase_pct", "ci_low", "ci_high", "confidence", "verdict"),
    *TEST_COLUMNS,
    *("fieller_low", "fieller_high", "boot_low", "boot_high"),
    *("n_outliers", "outlier_reps", "outliers_excluded", "target_pairs", "noisy", "pattern"),
    *("decision", "decision_lower_pct", "decision_upper_pct", "interval", "pilot_pairs"),
    *("pilot_sd_log_ratio", "derived_from", "covers", "sessions", "sd_within_session"),
    *("sd_between_sessions", "drift_rho", "drift_inflation", "drift_widening_pct"),
    *("moderated", "prior_df", "interval_df"),
    *("added", "added_low", "added_high"),
    *("n_fio_error", "n_ss_not_attained", "look_confidence", "remeasured_pairs"),
]
#: loss.parquet's text, integer and bool columns (the others are float64)
LOSS_DTYPES = {
    "string": [
        *("host", "workload", "rw", "direction", "job", "pattern", "metric", "baseline"),
        *("variant", "effect", "verdict", "outlier_reps", "decision", "interval", "derived_from"),
        "covers",
    ],
    "int64": (
        *("bs_bytes", "iodepth", "job_slot", "n", "n_dropped", "n_outliers", "sessions"),
        *("n_fio_error", "n_ss_not_attained"),
    ),
    "bool": ("higher_is_better", "equivalent", "outliers_excluded", "noisy", "moderated"),
}

VERDICTS = ("significant", "equivalent", "inconclusive", "insufficient")
#: the note of a row with ``interval`` "none"
NO_PILOT_NOTE = "no interval: fewer than 2 usable pilot pairs of this metric chose N"


def higher_is_better(metric: str) -> bool:
    try:
        return METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}") from None


def measured(fio: pd.DataFrame, metrics) -> list[str]:
    """The ``metrics`` with at least one value in ``fio``."""
    return [m for m in metrics if m in fio and pd.to_numeric(fio[m], errors="coerce").notna().any()]


#: per-rep quality flags carried from the fio table into the pairs (see :func:`flag_outliers`)
REP_FLAGS = ("fio_error", "ss_not_attained")


def _rep_flags(df: pd.DataFrame) -> pd.DataFrame:
    """fio_error: fio's error field is set; ss_not_attained: the job had a steady-state criterion
    (fio ``ss``) and fio reports it was not attained. Absent columns flag nothing."""
    missing = pd.Series(np.nan, index=df.index)
    error = pd.to_numeric(df.get("error", missing), errors="coerce")
    ss = pd.to_numeric(df.get("ss_attained", missing), errors="coerce")
    flags = {"fio_error": error.notna() & (error != 0), "ss_not_attained": ss.notna() & (ss == 0)}
    return pd.DataFrame({f: v.to_numpy(dtype=bool) for f, v in flags.items()}, index=df.index)


def rep_values(fio: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per (stack, rep, cell): jobs with several entries (numjobs without group_reporting)
    are combined — throughput summed, latency and CPU columns IOPS-weighted mean. The quality flags
    :data:`REP_FLAGS` are OR-ed over the entries."""
    df = active_rows(with_pattern(fio))
    if "session" not in df:  # a table ingested before sessions were recorded: one session
        df = df.assign(session="")
    keys = ["stack", "session", "rep", *CELL_KEYS]
    if df.empty:
        return pd.DataFrame(columns=[*keys, *CELL_ATTRS, *metrics, *REP_FLAGS])
    df = pd.concat([df, _rep_flags(df)], axis=1)
    if not df.duplicated(keys).any():  # one entry per rep and cell: nothing to combine
        return df[[*keys, *CELL_ATTRS, *metrics, *REP_FLAGS]].reset_index(drop=True)
    df = df.assign(_w=df["iops"].where(df["iops"] > 0, 1.0).fillna(1.0))

    def combine(g: pd.DataFrame) -> pd.Series:
        out, w = {a: g[a].iloc[0] for a in CELL_ATTRS}, g["_w"]
        for m in metrics:
            v = g[m]
            if METRICS[m]:
                out[m] = v.sum(min_count=len(g))  # any missing entry -> missing
            elif m in ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib", "cpu_util_pct"):
                out[m] = v.iloc[0] if v.nunique(dropna=False) == 1 else np.average(v, weights=w)
            else:
                out[m] = np.average(v, weights=w) if v.notna().all() else math.nan
        for f in REP_FLAGS:
            out[f] = bool(g[f].any())
        return pd.Series(out)

    grouped = df.groupby(keys, sort=True, dropna=False)
    rows = [{**dict(zip(keys, k, strict=True)), **combine(g)} for k, g in grouped]
    return pd.DataFrame(rows)


def pair_values(fio: pd.DataFrame, baseline: str, variant: str, metrics: list[str]) -> pd.DataFrame:
    """Long table: one row per cell x metric x pair (session, rep) with ``baseline_value`` and
    ``variant_value`` (NaN where that side is missing), and the :data:`REP_FLAGS` of either arm."""
    stacks = set(fio["stack"].dropna().unique()) if not fio.empty else set()
    for name in (baseline, variant):
        if name not in stacks:
            raise ValueError(f"stack {name!r} not in the data (stacks: {sorted(stacks)})")
    vals = rep_values(fio[fio["stack"].isin([baseline, variant])], metrics)
    id_vars = ["stack", "session", "rep", *CELL_KEYS, *CELL_ATTRS, *REP_FLAGS]
    long = vals.melt(id_vars=id_vars, value_vars=metrics, var_name="metric", value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce").astype("float64")
    base = long[long["stack"] == baseline].drop(columns="stack")
    var = long[long["stack"] == variant].drop(columns=["stack", *CELL_ATTRS])
    on = [*CELL_KEYS, "metric", "session", "rep"]  # a pair never crosses sessions
    names = {"value_baseline": "baseline_value", "value_variant": "variant_value"}
    paired = base.merge(var, on=on, how="outer", suffixes=("_baseline", "_variant"))
    paired = paired.rename(columns=names)
    for f in REP_FLAGS:
        paired[f] = paired[f"{f}_baseline"].eq(True) | paired[f"{f}_variant"].eq(True)
        paired = paired.drop(columns=[f"{f}_baseline", f"{f}_variant"])
    # cell attributes from whichever side exists
    attrs = vals[[*CELL_KEYS, *CELL_ATTRS]].drop_duplicates(CELL_KEYS)
    paired = paired.drop(columns=CELL_ATTRS).merge(attrs, on=CELL_KEYS, how="left")
    return paired.sort_values([*CELL_KEYS, "metric", "session", "rep"]).reset_index(drop=True)


def check_regions(regions: dict | None) -> dict[str, tuple[float, float]]:
    """Decision regions per metric family: :data:`DEFAULT_DECISION_REGIONS` updated with
    ``regions`` (family -> (lower, upper) or {"lower_pct", "upper_pct"}); 0 < lower < upper."""
    out = dict(DEFAULT_DECISION_REGIONS)
    for family, margins in (regions or {}).items():
        if family not in out:
            raise ValueError(
                f"decision_regions: unknown family {family!r}; known: {', '.join(out)}"
            )
        if isinstance(margins, dict):
            margins = (margins["lower_pct"], margins["upper_pct"])
        lower, upper = map(float, margins)
        if not 0 < lower < upper:
            raise ValueError(f"decision_regions.{family}: need 0 < lower < upper, not {margins}")
        out[family] = (lower, upper)
    return out


DESIGN_COLUMNS = ["target_pairs", "noisy", "pilot_pairs", "remeasured_pairs"]


def _design(fio: pd.DataFrame) -> pd.DataFrame:
    """Per (host, workload): the adaptive design's columns from ingest's (the run's targets.json;
    NaN/False for a fixed design)."""
    keys = ["host", "workload"]
    if fio.empty or "target_pairs" not in fio.columns:
        return pd.DataFrame(columns=[*keys, *DESIGN_COLUMNS, "look_confidence"])
    missing = pd.Series(math.nan, index=fio.index)
    df = fio[keys].assign(
        target_pairs=pd.to_numeric(fio["target_pairs"], errors="coerce"),
        noisy=fio.get("hit_cap", missing).eq(True),
        pilot_pairs=pd.to_numeric(fio.get("pilot_pairs", missing), errors="coerce"),
        look_confidence=pd.to_numeric(fio.get("look_confidence", missing), errors="coerce"),
        remeasured_pairs=pd.to_numeric(fio.get("remeasured_pairs", missing), errors="coerce"),
    )
    aggregate = dict.fromkeys([*DESIGN_COLUMNS, "look_confidence"], "max") | {"noisy": "any"}
    return df.groupby(keys, as_index=False).agg(aggregate)


def loss_table(
    fio: pd.DataFrame,
    baseline: str = "plain",
    variant: str = "luks",
    metrics: list[str] | tuple[str, ...] | None = None,
    confidence: float = 0.95,
    equivalence_margin_pct: float = DEFAULT_EQUIVALENCE_MARGIN_PCT,
    exclude_outliers: bool = False,
    decision_regions: dict | None = None,
) -> pd.DataFrame:
    """The paired loss table (columns :data:`LOSS_COLUMNS`) from a tidy fio table (``fio_table``).

    ``exclude_outliers``: leave flagged pairs out of every estimate (counted in ``n_outliers``
    either way). Each metric is its own Benjamini-Hochberg family, so a row's q-value, verdict
    and decision do not depend on which other metrics are computed."""
    _check_confidence(confidence)
    regions = check_regions(decision_regions)
    if not equivalence_margin_pct > 0:
        raise ValueError(f"equivalence margin must be > 0, not {equivalence_margin_pct}")
    # the default metrics a table has (CPU needs the sidecars); metrics asked for must be there
    metrics = list(metrics or [m for m in DEFAULT_METRICS if m in fio.columns])
    for m in metrics:
        higher_is_better(m)
        if m not in fio.columns:
            raise ValueError(f"metric {m!r} is not a column of the fio table")
    paired = pair_values(fio, baseline, variant, metrics)
    base_v = paired["baseline_value"].to_numpy(float)
    var_v = paired["variant_value"].to_numpy(float)
    reps = paired["rep"].to_numpy()
    sessions = paired["session"].to_numpy(dtype=object)
    planned = fio.groupby("host")["sessions_planned"].max() if "sessions_planned" in fio else {}
    flags = paired[list(REP_FLAGS)].to_numpy(bool)
    attrs = {a: paired[a].to_numpy(object) for a in CELL_ATTRS}
    design = _design(fio)
    shared = shared_idle_cells(fio, (baseline, variant))
    carries = baseline_carry(fio, baseline, variant) if shared else {}
    by_cell = design.set_index(["host", "workload"])
    pilots, levels = by_cell["pilot_pairs"].to_dict(), by_cell["look_confidence"].to_dict()
    groups = paired.groupby([*CELL_KEYS, "metric"], sort=True, dropna=False).indices
    # drift: d of every cell in the order measured, pooled per host and metric
    ok = usable_pairs(base_v, var_v)
    # in rep order, the order measured (pairs come sorted by session, and the sequential
    # design's rounds cycle the sessions)
    in_time = {k: p[np.argsort(reps[p], kind="stable")] for k, p in groups.items()}
    series = {k: np.log(var_v[p][ok[p]] / base_v[p][ok[p]]) for k, p in in_time.items()}
    drift_fits = drift.pooled_by(series, lambda key: (key[0], key[-1]))
    drift_fits |= _cycled_drift(series, planned, levels)
    settings = TestSettings(confidence, equivalence_margin_pct, exclude_outliers)
    rows, calls = [], []
    for key, pos in groups.items():
        cell = dict(zip([*CELL_KEYS, "metric"], key, strict=True))
        host, where = cell["host"], (cell["host"], cell["workload"])
        cpu = METRIC_FAMILIES[cell["metric"]] == "cpu"
        shared_ = cpu and where in shared
        carry = carries.get((*where, cell["metric"]))
        data = CellData(
            *(a[pos] for a in (base_v, var_v, reps, sessions, flags)),
            better_high=METRICS[cell["metric"]],
            pilot_pairs=float(pilots.get(where, math.nan)),
            all_or_none=cpu,
            sessions_planned=int(planned.get(host, 1)),
            look_confidence=float(levels.get(where, math.nan)),
            drift_fit=drift_fits[(host, cell["metric"])],
            shared_baseline=carry if shared_ and carry is not None else shared_,
        )
        calls.append(data)
        row = cell_stats(data, settings)
        rows.append({**cell, **{a: v[pos[0]] for a, v in attrs.items()}, **row})
    _moderate_sessions(rows, calls, settings)
    table = pd.DataFrame(
        rows, columns=[c for c in LOSS_COLUMNS if c not in (*DESIGN_COLUMNS, "look_confidence")]
    )
    table = table.assign(
        higher_is_better=table["metric"].map(METRICS),
        baseline=baseline,
        variant=variant,
        confidence=confidence,
        equivalence_margin_pct=equivalence_margin_pct,
        outliers_excluded=exclude_outliers,
    )
    table = table.merge(design, on=["host", "workload"], how="left")
    table["noisy"] = table["noisy"].eq(True)
    table["q_value"] = math.nan
    for idx in table.groupby("metric").indices.values():
        table.loc[table.index[idx], "q_value"] = benjamini_hochberg(table["p_value"].iloc[idx])
    n = table["n"].where(~table["interval"].isin(["none", "withheld"]), 0).to_numpy()
    table["verdict"] = table_verdicts(n, table["q_value"], table["equivalent"], confidence)
    table = _with_decisions(table, regions)
    table = table[LOSS_COLUMNS]
    if not table.empty:
        keys = ["host", "pattern", "rw", "bs_bytes", "iodepth", "job_slot", "direction", "_m"]
        table = table.assign(_m=table["metric"].map({m: i for i, m in enumerate(metrics)}))
        table = table.sort_values(keys).drop(columns="_m").reset_index(drop=True)
    return with_dtypes(table, LOSS_DTYPES)


def _cycled_drift(series: dict, planned, levels: dict) -> dict:
    """(host, metric) -> :func:`drift.pooled_rho_cycled` for the hosts of a sequential design
    over sessions (their rounds cycle the sessions: a look level and ``sessions_planned`` >= 2)."""
    sequential = {host for (host, _), level in levels.items() if level > 0}
    cycled = {h: int(planned.get(h, 1)) for h in sequential if int(planned.get(h, 1)) >= 2}
    members: dict = {}
    for key, d in series.items():
        if key[0] in cycled:
            members.setdefault((key[0], key[-1]), []).append(d)
    return {g: drift.pooled_rho_cycled(ds, cycled[g[0]]) for g, ds in members.items()}


def _moderate_sessions(rows: list[dict], cells: list[CellData], settings: TestSettings) -> None:
    """The "sessions" rows of ``rows`` over at most :data:`moderated.MODERATE_UP_TO` sessions
    again, each interval on its variance moderated by the prior of its host and metric
    (:func:`moderated.fit_prior` over all those rows' session-mean variances); rows of a host and
    metric with too few such cells stay as they are."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        if row["interval"] == "sessions":
            groups.setdefault((row["host"], row["metric"]), []).append(i)
    for members in groups.values():
        var = [rows[i]["sd_log_ratio"] ** 2 for i in members]
        prior = eb.fit_prior(var, [rows[i]["sessions"] - 1 for i in members])
        if prior is None:
            continue
        for i in members:
            if rows[i]["sessions"] <= eb.MODERATE_UP_TO:
                rows[i] |= cell_stats(cells[i], settings, prior=prior)


def shared_idle_cells(fio: pd.DataFrame, stacks) -> set[tuple]:
    """(host, workload) of the cells whose net CPU values on ``stacks`` come from an idle sample
    (ingest's ``idle_sample``) that nets runs of two or more repetitions: its error is shared."""
    if fio.empty or not {"idle_sample", "cpu_net"} <= set(fio.columns):
        return set()
    keys = ["host", "workload", "stack", "idle_sample"]
    net = fio[fio["cpu_net"].eq(True) & fio["stack"].isin(stacks) & fio["idle_sample"].notna()]
    reps = net.groupby(keys, observed=True)["rep"].nunique()
    return {(host, workload) for (host, workload, _, _), n in reps.items() if n >= 2}


def baseline_carry(fio: pd.DataFrame, baseline: str, variant: str) -> dict:
    """(host, workload, metric) -> (var_rate, df_rate, share, coef_b, coef_v) for
    ``cellstats._carried_scale``, for CPU busy time per GiB and per I/O: the variance of the
    host's idle busy rates over its distinct samples (m - 1 df; needs m >= 2), the share of the pairs'
    samples (baseline arm) and each arm's mean coefficient of the idle rate in the value
    (interval / GiB; 1e6 interval / I/Os)."""
    need = {"idle_sample", "cpu_net", "idle_busy_cpu_s", "cpu_interval_s", "io_gib", "file"}
    if fio.empty or not need <= set(fio.columns):
        return {}
    net = fio[fio["cpu_net"].eq(True) & fio["stack"].isin([baseline, variant])]
    net = net[net["idle_sample"].notna()]
    per_file = net.groupby("file")
    interval = net["cpu_interval_s"].astype(float)
    ios = (net["io_bytes"] / net["io_bs_bytes"]).groupby(net["file"]).transform("sum")
    net = net.assign(
        _rate=net["idle_busy_cpu_s"] / interval,
        _gib=interval / per_file["io_gib"].transform("sum"),
        _io=1e6 * interval / ios,
    )
    rates = net.drop_duplicates(["host", "idle_sample"]).groupby("host")["_rate"]
    spread = {h: (float(r.var(ddof=1)), r.size - 1) for h, r in rates if r.size >= 2}
    coefs = net.drop_duplicates("file").groupby(["host", "workload", "stack"])[["_gib", "_io"]]
    coefs = coefs.mean().to_dict("index")
    base = net[net["stack"] == baseline].drop_duplicates(["host", "workload", "rep"])
    out = {}
    for (host, workload), runs in base.groupby(["host", "workload"]):
        if host not in spread or runs.empty:
            continue
        share = float(((runs["idle_sample"].value_counts() / len(runs)) ** 2).sum())
        b, v = coefs.get((host, workload, baseline)), coefs.get((host, workload, variant))
        if b is None or v is None:
            continue
        for metric, col in (("busy_cpu_s_per_gib", "_gib"), ("busy_cpu_us_per_io", "_io")):
            out[(host, workload, metric)] = (*spread[host], share, b[col], v[col])
    return out


def _with_decisions(table: pd.DataFrame, regions: dict) -> pd.DataFrame:
    """The decision by magnitude of every row, its margins, and which test an IOPS or CPU-per-I/O
    row repeats."""
    margins = table["metric"].map(lambda m: regions[METRIC_FAMILIES[m]])
    table["decision_lower_pct"] = [lower for lower, _ in margins]
    table["decision_upper_pct"] = [upper for _, upper in margins]
    bounds = table[["ci_low", "ci_high", "decision_lower_pct", "decision_upper_pct"]]
    table["decision"] = [decision(*row) for row in bounds.to_numpy(float).tolist()]
    # at a fixed block size IOPS is bandwidth / block size and CPU per I/O is CPU per GiB times
    # it: the same test, not a second one
    fixed_bs = pd.to_numeric(table["bs_bytes"], errors="coerce").gt(0)
    table["derived_from"] = table["metric"].map(DERIVED_FROM).where(fixed_bs).fillna("")
    return table


def with_dtypes(
    table: pd.DataFrame, dtypes: dict, default: str = "float64", errors: str = "raise"
) -> pd.DataFrame:
    """``table`` typed by ``dtypes`` ({type, or function of a column's values: columns}), the other
    columns as ``default``: one schema however the rows came about. ``errors="coerce"``: an
    unreadable number is missing (values as a raw document holds them); else it raises."""
    types = {col: dtype for dtype, cols in dtypes.items() for col in cols}
    for col in table.columns:
        dtype = types.get(col, default)
        if callable(dtype):
            table[col] = dtype(table[col].tolist())
        elif dtype in ("int64", "Int64", "float64"):
            table[col] = pd.to_numeric(table[col], errors=errors).astype(dtype)
        else:
            table[col] = table[col].astype(dtype)
    return table


def loss_tables(fio: pd.DataFrame, comparisons, *args, **kwargs) -> pd.DataFrame:
    """:func:`loss_table` (same arguments after the pair) of every (baseline, variant) pair in
    ``comparisons``, concatenated in that order; each stays its own family of tests."""
    parts = [loss_table(fio, b, v, *args, **kwargs) for b, v in comparisons]
    if not parts:
        raise ValueError("no comparisons given")
    table = pd.concat(parts, ignore_index=True)[LOSS_COLUMNS]
    return with_dtypes(table, LOSS_DTYPES)


#: the columns that identify one arm's cell in :func:`arm_summary`
ARM_KEYS = ["host", "stack", "pattern", "rw", "bs_bytes", "iodepth", "direction", "job_slot"]


def arm_summary(fio: pd.DataFrame, metrics, confidence: float = 0.95) -> pd.DataFrame:
    """Mean over repetitions (:func:`rep_values`) per arm and cell (:data:`ARM_KEYS`) and metric,
    with the half width of its t-interval (NaN with fewer than two repetitions)."""
    _check_confidence(confidence)
    vals = rep_values(fio, list(metrics))
    rows = []
    for metric in metrics:
        for key, g in vals.groupby(ARM_KEYS, sort=True, dropna=False):
            v = pd.to_numeric(g[metric], errors="coerce").dropna().to_numpy(float)
            n = v.size
            mean = float(v.mean()) if n else math.nan
            half = math.nan
            if n >= 2:
                half = _t_quantile(confidence, n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
            rows.append([*key, metric, n, mean, half, confidence])
    return pd.DataFrame(rows, columns=[*ARM_KEYS, "metric", "n", "mean", "ci_half", "confidence"])


#: order.parquet's columns: the order effect of a comparison and metric over its cells
ORDER_COLUMNS = ["baseline", "variant", "metric", "n_cells", "n_in_order", "n_reversed"]
ORDER_COLUMNS += ["order_log", "order_pct", "ci_low", "ci_high", "p_value", "confidence"]


def pair_orders(schedule: pd.DataFrame, baseline: str, variant: str) -> pd.DataFrame:
    """Per (host, workload, rep): ``baseline_first``, whether the baseline ran before the variant
    in that pair (from the schedule table's ``position_in_cell``; a run measured again after a
    failure counts as it was last measured)."""
    cols = ["host", "workload", "rep", "stack", "position_in_cell"]
    sched = schedule[schedule["stack"].isin([baseline, variant])]
    if "status" in sched.columns:
        sched = sched[sched["status"].fillna("ok").eq("ok")]
    sched = sched[cols].dropna().drop_duplicates(cols[:4], keep="last")
    wide = sched.pivot(index=cols[:3], columns="stack", values="position_in_cell")
    if wide.empty or baseline not in wide or variant not in wide:
        return pd.DataFrame(columns=[*cols[:3], "baseline_first"])
    wide = wide.dropna()
    return (wide[baseline] < wide[variant]).rename("baseline_first").reset_index()


def order_effect(
    fio: pd.DataFrame,
    schedule: pd.DataFrame,
    baseline: str,
    variant: str,
    metrics,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """How much the second run of a pair measures above the first, per metric (columns
    :data:`ORDER_COLUMNS`). A shift o of the second run makes d = mean + o in pairs run baseline
    first and mean - o in the others: per cell with both orders, o is half the difference of
    their mean d; ``order_log`` its mean over cells with a t-interval over cells."""
    _check_confidence(confidence)
    paired = pair_values(fio, baseline, variant, list(metrics)).merge(
        pair_orders(schedule, baseline, variant), on=["host", "workload", "rep"]
    )
    paired = paired[usable_pairs(paired["baseline_value"], paired["variant_value"])]
    paired = paired.assign(d=np.log(paired["variant_value"] / paired["baseline_value"]))
    rows = []
    for metric in metrics:
        m = paired[paired["metric"] == metric]
        means = m.groupby([*CELL_KEYS, "baseline_first"])["d"].mean().unstack("baseline_first")
        both = means.shape[1] == 2
        o = ((means[True] - means[False]) / 2).dropna().to_numpy(float) if both else []
        ci = paired_log_ratio_ci(np.asarray(o, float), confidence)
        pct = [100 * math.expm1(x) for x in (ci.mean, ci.low, ci.high)]
        first = m["baseline_first"].astype(bool)
        rows.append([baseline, variant, metric, ci.n, int(first.sum()), int((~first).sum())])
        rows[-1] += [ci.mean, *pct, paired_t_pvalue(o), confidence]
    return pd.DataFrame(rows, columns=ORDER_COLUMNS)


def interval_scales(rows: pd.DataFrame) -> pd.DataFrame:
    """Per loss row, what its interval rests on (:func:`luksbench.analysis.cellstats.cell_stats`): ``sign`` (-1 where the
    effect is a loss: effect % = 100 sign (ratio - 1)), ``mean`` (mean d), ``half`` (the
    interval's half-width on d, from ``ci_low``/``ci_high``), ``df`` (``interval_df``: sessions,
    moderated or not, Stein's pilot, the pairs) and ``se``, the half-width over the row's own t
    quantile (its look's level for a sequential row): whatever widened the interval (drift, a
    carried idle baseline, moderation) is in it. NaN without an interval."""
    stein, two_level = rows["interval"].eq("stein"), rows["interval"].eq("sessions")
    n_eff = rows["sessions"].where(two_level, rows["n"]).astype(float)
    df = rows["pilot_pairs"].where(stein, n_eff).astype(float) - 1
    if "interval_df" in rows:
        df = rows["interval_df"].astype(float).fillna(df)
    level = rows["confidence"].astype(float)
    if "look_confidence" in rows:
        sequential = rows["interval"].eq("sequential")
        level = rows["look_confidence"].astype(float).where(sequential, level)
    sign = np.where(rows["higher_is_better"].astype(bool), -1.0, 1.0)
    bounds = np.log1p(sign[:, None] * rows[["ci_low", "ci_high"]].to_numpy(float) / 100)
    half = np.abs(bounds[:, 1] - bounds[:, 0]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        quantile = sps.t.ppf((1 + level.to_numpy(float)) / 2, df.to_numpy(float))
        se = half / quantile
    return pd.DataFrame(
        {
            "sign": sign,
            "mean": rows["mean_log_ratio"].to_numpy(float),
            "half": half,
            "se": se,
            "df": df.to_numpy(float),
        },
        index=rows.index,
    )
