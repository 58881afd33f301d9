"""What changed from run A to run B (two kernels, two hosts, before/after a flag), per cell and stack.

``luksbench compare RUN_A RUN_B --out DIR`` (published by :mod:`luksbench.publish.comparepage`). For
every host pair, stack, cell and metric: ``change_pct = 100 (r - 1)``, ``r`` the geometric-mean
ratio B / A, with an interval from log values: **paired** (t on ``d_k = ln(B_k / A_k)``) only
when the runs were measured side by side (:func:`pairing_design`), else **sessions** (Welch over
each side's session means of ln value: two runs differ by whatever differs between sessions),
none with one session on a side (**one session**, ``insufficient``). Verdicts as in the loss
table (Benjamini-Hochberg over the whole comparison); ``outcome`` reads them by the metric's
direction: better, worse, same, unclear, insufficient, only in A / only in B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from luksbench.analysis import ingest, stats
from luksbench.analysis import moderated as eb

#: metrics compared by default: throughput, tail latency and CPU cost (all non-idle CPU, which
#: counts userspace encryption too)
COMPARE_METRICS = ("bw_bytes", "iops", "clat_p99_ns", "busy_cpu_s_per_gib")

COMPARE_COLUMNS = [
    *("run_a", "run_b", "host_a", "host_b", "stack"),
    *stats.ROW_COLUMNS,
    *("design", "n_a", "n_b", "n", "a_mean", "b_mean", "mean_log_ratio", "se_log_ratio", "df"),
    *("ratio", "change_pct", "ci_low", "ci_high", "confidence"),
    *stats.TEST_COLUMNS,
    *("verdict", "outcome", "pattern", "moderated", "prior_df"),
]
#: the comparison table's text, integer and bool columns (the others are float64)
COMPARE_DTYPES = {
    "string": [
        *("run_a", "run_b", "host_a", "host_b", "stack", "workload", "rw", "direction", "job"),
        *("pattern", "metric", "design", "verdict", "outcome"),
    ],
    "int64": ("bs_bytes", "iodepth", "job_slot", "n_a", "n_b", "n"),
    "bool": ("higher_is_better", "equivalent", "moderated"),
}

#: env facts whose difference between A and B is worth saying (a kernel change is the usual point)
ENV_FACTS = ("kernel", "cpu_model", "cpu_count", "aes", "vaes", "backend", "fio_version")
ENV_FACTS += ("cryptsetup_version", "qemu_version")


class CompareError(ValueError):
    """The two runs cannot be compared as asked (missing run, no common host or stack ...)."""


@dataclass
class RunData:
    """The tables of one run that a comparison needs."""

    name: str
    source: str
    fio: pd.DataFrame
    env: pd.DataFrame
    schedule: pd.DataFrame
    #: the plans' fio options (the plan_fio table: host, option, option_value)
    plan_fio: pd.DataFrame = field(default_factory=pd.DataFrame)


def load_run_data(
    spec: str | Path,
    processed_root: Path = Path("data/processed"),
    raw_root: Path = Path("data/raw"),
) -> RunData:
    """A run by processed folder (``data/processed/<run>``), raw run folder (``data/raw/<run>``,
    ingested in memory) or run name (looked up in both, processed first)."""
    spec = Path(spec)
    tried = []
    for folder in (spec, Path(processed_root) / spec.name, Path(raw_root) / spec.name):
        tried.append(str(folder))
        if (folder / "fio.parquet").is_file():
            tables = ingest.read_processed(folder)
            name = str(tables["fio"]["run"].iloc[0]) if len(tables["fio"]) else folder.name
            raw = Path(raw_root) / folder.name
            if "schedule" not in tables and raw.is_dir():  # processed before schedules were kept
                tables["schedule"] = ingest.schedule_table(raw, strict=False)
        elif folder.is_dir() and ingest.host_dirs(folder):
            tables = ingest.ingest_run(folder, strict=False, workers=1)
            name = ingest.run_name(folder)
        else:
            continue
        env, schedule, plan_fio = (
            tables.get(t, pd.DataFrame()) for t in ("env", "schedule", "plan_fio")
        )
        return RunData(name, str(folder), tables["fio"], env, schedule, plan_fio)
    raise CompareError(
        f"run {str(spec)!r} not found: no fio.parquet or raw host folders in {', '.join(tried)}"
    )


def host_pairs(a: RunData, b: RunData, specs: list[str] | None = None) -> list[tuple[str, str]]:
    """(host of A, host of B) to compare: ``specs`` ``NAME`` (that host in both runs) or
    ``A_HOST=B_HOST``; default the hosts the runs share, or, sharing none, their only hosts."""
    hosts_a, hosts_b = (sorted(run.fio["host"].dropna().unique()) for run in (a, b))
    if specs:
        pairs = []
        for spec in specs:
            ha, _, hb = spec.partition("=")
            hb = hb or ha
            for host, hosts, run in ((ha, hosts_a, a), (hb, hosts_b, b)):
                if host not in hosts:
                    raise CompareError(
                        f"host {host!r} is not in run {run.name} (hosts: {', '.join(hosts)})"
                    )
            pairs.append((ha, hb))
    else:
        pairs = [(h, h) for h in hosts_a if h in hosts_b]
        if not pairs and len(hosts_a) == 1 and len(hosts_b) == 1:
            pairs = [(hosts_a[0], hosts_b[0])]
    if not pairs:
        raise CompareError(
            f"no host to compare: run {a.name} has {', '.join(hosts_a) or 'none'}, run {b.name} "
            f"has {', '.join(hosts_b) or 'none'}; name them with --host A_HOST=B_HOST"
        )
    for ha, hb in pairs:
        if a.source == b.source and ha == hb:
            raise CompareError(f"host {ha!r} of run {a.name} compared with itself")
    return pairs


def _sessions(schedule: pd.DataFrame, host: str) -> pd.DataFrame:
    if schedule.empty:
        return pd.DataFrame()
    sched = schedule[(schedule["host"] == host) & (schedule["status"] == "ok")]
    return sched.drop_duplicates(["stack", "workload", "rep"], keep="last")


def pairing_design(
    a: RunData, b: RunData, host_a: str, host_b: str, unpaired: bool = False
) -> tuple[str, str]:
    """("paired" | "sessions", why). Paired only when every repetition k measured on both sides ran
    in the same round k of sessions that overlap in time (measured side by side)."""
    if unpaired:
        return "sessions", "unpaired by request (--unpaired)"
    sa = _sessions(a.schedule, _layout_host(a, host_a))
    sb = _sessions(b.schedule, _layout_host(b, host_b))
    if sa.empty or sb.empty:
        return "sessions", "no session schedule recorded for one side, so no pairing can be shown"
    both = sa.merge(sb, on=["stack", "workload", "rep"], suffixes=("_a", "_b"))
    if both.empty:
        return "sessions", "the two sides share no (stack, cell, repetition)"
    same_round = (both["round_a"] == both["round_b"]).fillna(False)
    overlap = (both["session_started_a"] <= both["session_ended_b"]) & (
        both["session_started_b"] <= both["session_ended_a"]
    )
    if bool((same_round & overlap.fillna(False)).all()):
        return "paired", (
            "repetition k of A and of B ran in the same round k of sessions that overlap in time "
            f"({_span(sa)} and {_span(sb)}): pairs share the session's drift"
        )
    if not bool(overlap.fillna(False).any()):
        why = f"the sessions did not overlap in time ({_span(sa)} vs {_span(sb)})"
    else:
        why = "repetitions with the same number ran in different rounds"
    return "sessions", f"{why}: repetition k of A has nothing in common with repetition k of B"


def _by_sessions(design: str, why: str, sa: pd.DataFrame, sb: pd.DataFrame) -> tuple[str, str]:
    """The unpaired design's replicates: sessions, when each side has two or more."""
    counts = [side["session"].nunique() if "session" in side else 1 for side in (sa, sb)]
    if design == "paired" and max(counts) == 1:
        return design, why
    if min(counts) >= 2:  # paired repetitions of several sessions would share their effects
        return "sessions", why + (f"; sessions are the replicates ({counts[0]} and {counts[1]})")
    return "one session", (
        f"{why}; {counts[0]} and {counts[1]} session(s): with one session on a side the "
        "session-to-session variation that separates two runs cannot be estimated, so no "
        "interval (measure with sessions >= 2)"
    )


def _layout_host(run: RunData, host: str) -> str:
    """The raw folder whose manifests scheduled ``host``'s results: the host itself, or for the
    fio servers of a fleet run the coordinating host (ingest's ``host_dir``)."""
    if "host_dir" in run.fio:
        dirs = run.fio.loc[run.fio["host"] == host, "host_dir"].dropna().unique()
        if len(dirs) == 1:
            return str(dirs[0])
    return host


def _span(sched: pd.DataFrame) -> str:
    lo, hi = sched["session_started"].min(), sched["session_ended"].max()
    if pd.isna(lo) or pd.isna(hi):
        return "unknown times"
    return f"{lo:%Y-%m-%d %H:%M} to {hi:%Y-%m-%d %H:%M} UTC"


def _cell_change(
    va: dict, vb: dict, design: str, confidence: float, margin_pct: float, prior=None
) -> dict:
    """One row's statistics: values by (session, repetition) on each side -> change % with its
    interval; ``n_a``/``n_b`` count the replicates (repetitions when paired, else sessions).
    ``prior`` (sessions design): the moderated two-sample t (:func:`moderated.two_sample_t`)
    instead of Welch's."""
    nan = math.nan
    a, b = _positive(va), _positive(vb)
    a_mean, b_mean = (float(np.mean(list(side.values()))) if side else nan for side in (a, b))
    out = {"a_mean": a_mean, "b_mean": b_mean, "moderated": False, "prior_df": nan}
    eq_conf = stats.tost_confidence(confidence)
    if design == "paired":
        a, b = ({rep: v for (_, rep), v in side.items()} for side in (a, b))
        out |= {"n_a": len(a), "n_b": len(b)}
        reps = sorted(set(a) & set(b))
        d = np.log(np.array([b[k] for k in reps]) / np.array([a[k] for k in reps]))
        ci = stats.paired_log_ratio_ci(d, confidence)
        eq = stats.paired_log_ratio_ci(d, eq_conf) if eq_conf > 0 and ci.n >= 2 else None
        n, mean, se, df = ci.n, ci.mean, ci.sd / math.sqrt(ci.n) if ci.n >= 2 else nan, ci.n - 1
        p = stats.paired_t_pvalue(d)
    else:
        la, lb = (_session_means(side) for side in (a, b))
        out |= {"n_a": la.size, "n_b": lb.size}
        ci = stats.welch_log_ratio_ci(la, lb, confidence)
        eq = stats.welch_log_ratio_ci(la, lb, eq_conf) if eq_conf > 0 else None
        n, mean, se, df = min(ci.n_a, ci.n_b), ci.mean, ci.se, ci.df
        p = stats.welch_t_pvalue(la, lb)
        if prior is not None and n >= 2:
            mean, se, df = eb.two_sample_t(la, lb, prior)
            ci, eq = (_t_interval(mean, se, df, c) for c in (confidence, eq_conf))
            p = stats._t_pvalue(mean, se, df)
            out |= {"moderated": True, "prior_df": prior.df}
    change, bounds = stats.effect_with_equivalence(ci, eq, False, margin_pct)
    return {
        **out,
        "n": int(n),
        "mean_log_ratio": mean,
        "se_log_ratio": se,
        "df": float(df) if n >= 2 else nan,
        "ratio": math.exp(mean) if not math.isnan(mean) else nan,
        "change_pct": change,
        "p_value": p,
        **bounds,
    }


def _t_interval(mean: float, se: float, df: float, confidence: float):
    """``mean +- t se`` as the bounds a Welch interval has (None at confidence <= 0)."""
    if confidence <= 0:
        return None
    half = stats._t_quantile(confidence, df) * se
    return stats.WelchLogCI(2, 2, mean, se, df, mean - half, mean + half)


def _sessions_priors(rows: list[dict], values: list[tuple]) -> dict:
    """Per (host pair, metric): the prior of the sessions rows' pooled session-mean variances."""
    groups: dict[tuple, list] = {}
    for row, (va, vb) in zip(rows, values, strict=True):
        if row["design"] == "sessions" and row["n"] >= 2:
            la, lb = (_session_means(_positive(v)) for v in (va, vb))
            groups.setdefault((row["host_a"], row["host_b"], row["metric"]), []).append(
                eb.pooled_variance(la, lb)
            )
    return {key: eb.fit_prior(*zip(*parts, strict=True)) for key, parts in groups.items()}


def _positive(values: dict) -> dict:
    return {k: v for k, v in values.items() if np.isfinite(v) and v > 0}


def _outcome(row) -> str:
    if row["n_a"] == row["n_b"] == 0:
        return "insufficient"  # in both runs, e.g. a latency percentile of too few I/Os
    if row["n_a"] == 0:
        return "only in B"
    if row["n_b"] == 0:
        return "only in A"
    if row["verdict"] == "significant":
        return "better" if (row["change_pct"] > 0) == bool(row["higher_is_better"]) else "worse"
    return {"equivalent": "same", "inconclusive": "unclear"}.get(row["verdict"], row["verdict"])


def compare_runs(
    a: RunData,
    b: RunData,
    hosts: list[str] | None = None,
    stacks: list[str] | None = None,
    metrics: list[str] | tuple[str, ...] | None = None,
    confidence: float = 0.95,
    equivalence_margin_pct: float = stats.DEFAULT_EQUIVALENCE_MARGIN_PCT,
    unpaired: bool = False,
    moderate: bool = True,
) -> pd.DataFrame:
    """The comparison table (columns :data:`COMPARE_COLUMNS`); ``attrs["designs"]`` holds the
    design and its reason per host pair, ``attrs["skipped_metrics"]`` metrics without values.
    ``moderate``: sessions rows of few sessions on the moderated t (else Welch's)."""
    stats._check_confidence(confidence)
    metrics = list(metrics or COMPARE_METRICS)
    for m in metrics:
        stats.higher_is_better(m)
    either = {*stats.measured(a.fio, metrics), *stats.measured(b.fio, metrics)}
    present = [m for m in metrics if m in either]
    pairs = host_pairs(a, b, hosts)
    stacks_a, stacks_b = set(a.fio["stack"].dropna()), set(b.fio["stack"].dropna())
    common = sorted(stacks_a & stacks_b)
    if stacks:
        if missing := [s for s in stacks if s not in common]:
            raise CompareError(
                f"stack(s) {', '.join(missing)} not in both runs (A: {', '.join(sorted(stacks_a))};"
                f" B: {', '.join(sorted(stacks_b))})"
            )
        common = list(stacks)
    if not common:
        raise CompareError(f"runs {a.name} and {b.name} have no stack in common")
    vals_a = stats.rep_values(a.fio[a.fio["stack"].isin(common)], present)
    vals_b = stats.rep_values(b.fio[b.fio["stack"].isin(common)], present)
    cell = ["stack", "workload", "job_slot", "direction"]
    rows, designs, values = [], {}, []
    for ha, hb in pairs:
        sa, sb = vals_a[vals_a["host"] == ha], vals_b[vals_b["host"] == hb]
        design, why = _by_sessions(*pairing_design(a, b, ha, hb, unpaired), sa, sb)
        designs[f"{ha}={hb}"] = {"design": design, "reason": why}
        attrs = pd.concat([sa, sb]).drop_duplicates(cell).set_index(cell)[stats.CELL_ATTRS]
        info_of = attrs.to_dict("index")
        ga, gb = sa.groupby(cell).indices, sb.groupby(cell).indices
        for key in sorted(set(ga) | set(gb), key=str):
            for metric in present:
                va = _by_rep(sa, ga.get(key), metric)
                vb = _by_rep(sb, gb.get(key), metric)
                change = _cell_change(va, vb, design, confidence, equivalence_margin_pct)
                rows.append({"host_a": ha, "host_b": hb, **dict(zip(cell, key, strict=True))})
                rows[-1] |= {**info_of[key], "metric": metric, "design": design, **change}
                values.append((va, vb))
    if moderate:
        _moderate(rows, values, confidence, equivalence_margin_pct)
    table = pd.DataFrame(rows, columns=[c for c in COMPARE_COLUMNS if c != "q_value"])
    table = table.assign(
        run_a=a.name,
        run_b=b.name,
        higher_is_better=table["metric"].map(stats.METRICS),
        confidence=confidence,
        equivalence_margin_pct=equivalence_margin_pct,
    )
    table["q_value"] = stats.benjamini_hochberg(table["p_value"].to_numpy(float))
    table["verdict"] = stats.table_verdicts(
        table["n"].to_numpy(), table["q_value"], table["equivalent"].to_numpy(bool), confidence
    )
    table["outcome"] = [_outcome(r) for _, r in table.iterrows()] if len(table) else []
    table = table.assign(_m=table["metric"].map({m: i for i, m in enumerate(present)}))
    table = table.sort_values(
        ["host_a", "host_b", "stack", "rw", "bs_bytes", "iodepth", "job_slot"]
    )
    table = table.sort_values("_m", kind="stable").reset_index(drop=True)[COMPARE_COLUMNS]
    table = stats.with_dtypes(table, COMPARE_DTYPES)
    table.attrs["designs"] = designs
    table.attrs["skipped_metrics"] = [m for m in metrics if m not in present]
    return table


def _moderate(rows: list[dict], values: list[tuple], confidence: float, margin: float) -> None:
    """Sessions rows with at most :data:`moderated.MODERATE_UP_TO` sessions on a side again, on
    the moderated two-sample t of their host pair and metric (where a prior is estimable)."""
    priors = _sessions_priors(rows, values)
    for row, (va, vb) in zip(rows, values, strict=True):
        prior = priors.get((row["host_a"], row["host_b"], row["metric"]))
        if prior is not None and row["n"] >= 2 and row["n"] <= eb.MODERATE_UP_TO:
            row |= _cell_change(va, vb, "sessions", confidence, margin, prior)


def _session_means(values: dict[tuple[str, int], float]) -> np.ndarray:
    """Mean log value of each session."""
    logs: dict[str, list[float]] = {}
    for (session, _), v in values.items():
        logs.setdefault(session, []).append(math.log(v))
    return np.array([np.mean(x) for x in logs.values()])


def _by_rep(vals: pd.DataFrame, pos, metric: str) -> dict[tuple[str, int], float]:
    if pos is None:
        return {}
    sub = vals.iloc[pos]
    values = pd.to_numeric(sub[metric], errors="coerce").to_numpy(float)
    keys = zip(sub["session"].astype(str), sub["rep"].astype(int), strict=True)
    return dict(zip(keys, values, strict=True))


def env_differences(a: RunData, b: RunData, pairs: list[tuple[str, str]]) -> list[str]:
    """What differs between the two sides besides the measurements: kernel, CPU, tool versions,
    backend, fio options of the plan."""
    out = []
    for ha, hb in pairs:
        ea, eb = _env_row(a.env, ha), _env_row(b.env, hb)
        label = f"{ha}" if ha == hb else f"{ha} / {hb}"
        for fact in ENV_FACTS:
            x, y = ea.get(fact), eb.get(fact)
            if _text(x) != _text(y):
                out.append(f"{label}: {fact} {_text(x)} -> {_text(y)}")
        fa, fb = _fio_options(a.plan_fio, ha), _fio_options(b.plan_fio, hb)
        for key in sorted(set(fa) | set(fb)):
            if fa.get(key) != fb.get(key):
                out.append(f"{label}: fio.{key} {fa.get(key, 'n/a')} -> {fb.get(key, 'n/a')}")
    return out


def _fio_options(plan_fio: pd.DataFrame, host: str) -> dict[str, str]:
    """{option: value as text} of the host's plan's fio section ({} without the table)."""
    if plan_fio.empty or "host" not in plan_fio:
        return {}
    rows = plan_fio[plan_fio["host"] == host]
    values = zip(rows["option"], rows["option_value"], strict=True)
    return {option: None if pd.isna(value) else value for option, value in values}


def _env_row(env: pd.DataFrame, host: str) -> dict:
    if env.empty or "host" not in env:
        return {}
    rows = env[env["host"] == host]
    return rows.iloc[0].to_dict() if len(rows) else {}


def _text(x) -> str:
    return "n/a" if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)) else str(x)
