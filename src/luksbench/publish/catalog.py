"""Which figures a run gets, as data: a catalog of figure specs, drawn and indexed.

``figure_specs(run)`` lists one :class:`FigureSpec` per figure; ``make_figures`` draws them, saves
each as PNG + SVG with its provenance and writes the figure index ``figures/<run>/index.json``
that the paper and notebook 03 read. ``FIGURE_FAMILIES``: each family's heading and introduction
in paper order. A fleet (more hosts than config ``analysis.per_host_figures_max``) gets one figure
per metric across its hosts instead of one family of figures per host.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from luksbench.analysis.contrasts import Pair, label
from luksbench.analysis.loss import CPU_METRICS
from luksbench.analysis.stats import METRICS
from luksbench.analysis.tails import MIN_BEYOND
from luksbench.formats.layout import replace_file
from luksbench.publish import figures, figures_arms
from luksbench.publish.ceilings import available_ciphers, crypto_ceilings, undescribed
from luksbench.publish.run import Run, load_run, package_version, provenance_facts
from luksbench.publish.style import figure_paths, save_figure
from luksbench.publish.text import cpu_net, metric_heading, rw_words

INDEX = "index.json"
#: metrics that get a heatmap and, with several hosts, a hosts-side-by-side figure (IOPS repeats
#: bandwidth at a fixed block size; every metric is in the loss chart and the paper's tables)
SUMMARY_METRICS = ("bw_bytes", "clat_p99_ns")


@dataclass(frozen=True)
class FigureSpec:
    """One figure: ``draw(*tables, **kwargs)`` returns it; ``sources`` are the further tables the
    kwargs were read from; ``params`` go into its provenance; ``retitle`` (prefix, removed prefix)
    adjusts the title for runs with several hosts."""

    name: str
    family: str
    draw: Callable
    tables: tuple[str, ...]
    sources: tuple[str, ...]
    caption: str
    kwargs: dict
    params: dict
    retitle: tuple[str, str]
    skip: str = ""  # why the figure is not drawn (its data are all withheld); "" = drawn

    def render(self, run: Run):
        fig = self.draw(*(_table(run, t) for t in self.tables), **self.kwargs)
        prefix, strip = self.retitle
        if prefix or strip:
            fig.suptitle(prefix + fig.get_suptitle().removeprefix(strip), fontsize="medium")
        return fig


def _table(run: Run, name: str) -> pd.DataFrame:
    return {"fio": run.fio, "loss": run.loss}.get(name, run.tables.get(name))


FIGURE_FAMILIES = {
    "throughput": (
        "Throughput, SCS style",
        "Per access pattern and metric: block size on the x axis, stacks side by side, log-scale "
        "y, one panel per queue depth; bar = mean over repetitions, dots = the repetitions, error "
        "bar = t-interval of one stack's repetitions: per arm and unpaired, so it is wider than "
        "the paired interval on the loss and two overlapping bars can still differ decidedly.",
    ),
    "heatmap": (
        "Loss heatmaps",
        "Block size \u00d7 access pattern per comparison and queue depth, annotated with the effect, its "
        "interval and the decision by magnitude (as in the tables); a withheld cell says why "
        '(e.g. "too few I/Os" for a tail percentile) and is left uncoloured.',
    ),
    "latency": (
        "Latency percentiles",
        "Completion-latency percentile curves from fio's json+ histograms, one per repetition, "
        f"cut where fewer than {MIN_BEYOND} I/Os lie beyond; points = the loss table's p50/p99/p99.9 (mean "
        "over repetitions, t-interval); both axes stretch the tail.",
    ),
    "cpu": (
        "CPU cost",
        "CPU seconds per GiB moved, CPU utilisation beside it, and CPU time per I/O (whole "
        "machine, from /proc/stat around each fio run, {cpu_basis}), by "
        "block size, with t-intervals. At full speed CPU per GiB also rises with any throughput "
        "loss; CPU per I/O of a fixed-rate pattern's cells compares the stacks at equal load. "
        "With the userspace backend the encryption runs in qemu's user space, so the *busy* (all "
        "non-idle) figure is the one that counts it.",
    ),
    "ciphers": (
        "Cipher benchmark",
        "`cryptsetup benchmark`: in-memory cipher throughput on one core (no storage I/O); rows "
        "marked userspace estimate (openssl) are `openssl speed -evp` of the same cipher, where "
        "the kernel's could not be benchmarked.",
    ),
    "ceiling": (
        "Crypto ceiling",
        "Measured bandwidth of the encrypted stack against the crypto ceiling: the cipher's "
        "benchmark throughput \u00d7 logical CPUs (decryption for reads, encryption for writes). The "
        "ceiling is the kernel cipher's, or where the kernel's ciphers could not be benchmarked "
        "(no AF_ALG) a userspace estimate from `openssl speed -evp` of the same cipher, labelled "
        "so; without either there is no ceiling and no figure: the list below says why.",
    ),
    "loss": (
        "Cost per cell",
        "Effect per cell and metric with its interval against the decision regions (shaded), one "
        "chart per comparison; colour = the decision by magnitude, as in the tables.",
    ),
    "fleet": (
        "The fleet, host by host",
        "This run has {hosts} hosts, more than `analysis.per_host_figures_max` ({per_host_max}): "
        "instead of one family of figures per host (throughput, latency, heatmaps, CPU cost, "
        "crypto ceiling) and the hosts side by side, one figure per metric and comparison shows "
        "every host's effect in every cell, one dot per host coloured by that host's decision "
        "(each host paired with its own baseline; the intervals are in the tables). The cipher "
        "benchmark and the tables keep every host.",
    ),
    "hosts": (
        "Hosts side by side",
        "Each test box's effect per cell with its interval, one colour per host. Every host is "
        "compared with its own baseline from its own pairs; the hosts are set beside each other, "
        "not pooled.",
    ),
}


def caption(stem: str, headline: Pair | None = None) -> str:
    """The caption of figure ``stem`` (``loss``: the headline comparison's cost chart)."""
    kind, _, rest = stem.partition("-")
    if kind == "loss":  # "loss" is the headline comparison, "loss-<variant>-vs-<baseline>" others
        variant, sep, baseline = rest.partition("-vs-")
        pair = (baseline, variant) if sep else headline
        return FIGURE_FAMILIES["loss"][0] + (f": {label(pair)}" if pair else "")
    if kind == "throughput":
        what, metric = rest.rsplit("-", 1)
        return f"{what}: {metric_heading(metric)} per stack"
    if kind in ("heatmap", "cpu"):
        metric = rest.split("-")[-1]
        effect = "loss" if METRICS.get(metric, True) else "increase"
        return metric_heading(metric) + (
            f": {effect} heatmap" if kind == "heatmap" else ": CPU cost by block size"
        )
    if kind == "hosts":
        return metric_heading(rest) + ": hosts side by side"
    if kind == "fleet":
        metric, _, pair = rest.partition("-")
        versus = f" ({pair.replace('-vs-', ' vs ')})" if pair else ""
        return f"{metric_heading(metric)}: every host per cell{versus}"
    if kind == "latency":
        return f"{rest}: completion-latency percentiles" + (
            f" ({rw_words(rest)})" if rest in ("read", "write", "randread", "randwrite") else ""
        )
    return FIGURE_FAMILIES.get(kind, (stem,))[0]


def per_host_figures_max() -> int:
    """Config ``analysis.per_host_figures_max`` as the config schema sets it (the workflow passes
    the run's config value; this is for a notebook or script run without one)."""
    import yaml  # papermill's dependency; the workflow extra's own

    schema = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"
    if not schema.exists():  # installed: the schema is shared data (luksbench.studies.INSTALLED)
        schema = Path(sys.prefix) / "share" / "luksbench" / schema.name
    keys = yaml.safe_load(schema.read_text())["properties"]["analysis"]["properties"]
    return int(keys["per_host_figures_max"]["default"])


def is_fleet(run: Run, per_host_max: int) -> bool:
    """More hosts than ``per_host_max``: one figure across the hosts, not a family per host."""
    return len(run.hosts) > per_host_max


def figure_specs(run: Run, per_host_max: int | None = None) -> list[FigureSpec]:
    """Every figure of ``run``, in drawing order.

    Names (``<host>-`` after the kind when the run has several hosts):
    ``throughput-<rw>-<metric>`` (bw_bytes, iops; ``throughput-<rw>-<pattern>-<metric>`` for the
    cells of a config pattern), ``latency-<rw>[-<pattern>]`` (json+ histograms; none without),
    ``heatmap-<metric>`` (bandwidth and p99 latency; one panel row per comparison),
    ``cpu-<metric>`` (busy / system CPU s per GiB; none without CPU sidecars), ``ceiling`` (per
    host: the ceiling or why there is none), ``hosts-<metric>`` (several hosts only: the hosts
    side by side), ``ciphers`` (only when cipher rows exist), ``loss`` (the headline
    comparison) and ``loss-<variant>-vs-<baseline>`` (every other comparison).

    A fleet (more hosts than ``per_host_max``, default :func:`per_host_figures_max`) gets
    ``fleet-<metric>[-<variant>-vs-<baseline>]`` per metric and comparison instead: the count
    of figures does not grow with the hosts."""
    per_host_max = per_host_figures_max() if per_host_max is None else per_host_max
    if is_fleet(run, per_host_max):
        return _fleet_specs(run)
    multi = len(run.hosts) > 1
    stacks = run.stack_order()
    ceilings = crypto_ceilings(run.cryptsetup, run.stacks, run.env)
    ceilings += undescribed(ceilings, run.hosts, stacks, run.pairs[0][0])
    specs = []
    for host in run.hosts:
        scope = host if multi else None  # named in figure names and titles
        specs += _cell_specs(run, host, scope, stacks)
        specs += _host_specs(run, host, scope, stacks, ceilings)
    return specs + _run_specs(run, multi)


def _name(kind: str, scope: str | None, *rest) -> str:
    """``<kind>[-<host>]-<rest>``: the host only when the run has several."""
    return "-".join([kind, *([scope] if scope else []), *[r for r in rest if r]])


#: family -> (drawing function, tables it draws, further tables its kwargs are read from)
_DRAWN = {
    "throughput": (figures_arms.throughput_figure, ("arms", "reps"), ()),
    "latency": (figures_arms.latency_figure, ("latency", "arms"), ()),
    "heatmap": (figures.loss_heatmap, ("loss",), ()),
    "cpu": (figures_arms.cpu_figure, ("arms",), ("fio",)),
    "ceiling": (figures_arms.ceiling_figure, ("arms",), ("cryptsetup", "stacks", "env")),
    "hosts": (figures.hosts_figure, ("loss",), ()),
    "fleet": (figures.fleet_figure, ("loss",), ()),
    "ciphers": (figures_arms.cipher_figure, ("cryptsetup",), ()),
    "loss": (figures.loss_figure, ("loss",), ()),
}


def _spec(
    name: str, kwargs=None, params=None, retitle=("", ""), headline=None, skip: str = ""
) -> FigureSpec:
    """A figure of the family its name starts with, drawn as :data:`_DRAWN` says (not drawn when
    ``skip`` says why)."""
    family = name.partition("-")[0]
    caption_ = caption(name, headline)
    kwargs, params = kwargs or {}, params or {}
    return FigureSpec(name, family, *_DRAWN[family], caption_, kwargs, params, retitle, skip)


def _rows_of(loss: pd.DataFrame, metric: str | None = None, host: str | None = None):
    rows = loss if metric is None else loss[loss["metric"] == metric]
    return rows if host is None else rows[rows["host"] == host]


def _cell_specs(run: Run, host: str, scope: str | None, stacks: list[str]) -> list[FigureSpec]:
    """Throughput bars and latency curves: one figure per access pattern and config pattern, so
    cells of two patterns never share bars."""
    fio = run.fio[run.fio["host"] == host]
    lat = run.tables.get("latency", pd.DataFrame(columns=["host", "rw", "pattern"]))
    lat = lat[lat["host"] == host]
    cells = fio[["rw", "pattern"]].drop_duplicates().dropna().itertuples(index=False, name=None)
    specs = []
    retitle = (f"{host}: " if scope else "", "")
    for rw, pat in sorted(cells, key=lambda c: (c[1], c[0])):
        where = {"rw": rw, **({"pattern": pat} if pat else {})}
        for metric in ("bw_bytes", "iops"):
            kwargs = {"rw": rw, "metric": metric, "stacks": stacks, "host": host, "pattern": pat}
            params = {"host": host, **where, "metric": metric}
            name = _name("throughput", scope, rw, pat, metric)
            specs.append(_spec(name, kwargs, params, retitle))
        if ((lat["rw"] == rw) & (lat["pattern"] == pat)).any():
            kwargs = {"rw": rw, "stacks": stacks, "pattern": pat, "host": scope}
            specs.append(_spec(_name("latency", scope, rw, pat), kwargs, where))
    return specs


def _host_specs(run: Run, host: str, scope: str | None, stacks, ceilings) -> list[FigureSpec]:
    """Loss heatmaps (the host named in the title only when there are several), CPU cost for the
    CPU metrics its sidecars measured, the crypto ceiling of its LUKS stacks or why there is none."""
    retitle = ("", "" if scope else f"{host}: ")
    specs = [
        _spec(
            _name("heatmap", scope, m),
            {"metric": m, "host": host},
            {"metric": m},
            retitle,
            skip=figures.all_withheld(_rows_of(run.loss, m, host)),
        )
        for m in SUMMARY_METRICS
        if m in set(run.loss["metric"])
    ]
    arms = run.tables["arms"][run.tables["arms"]["host"] == host]
    net = cpu_net(run.fio[run.fio["host"] == host])
    for metric in CPU_METRICS:
        if pd.to_numeric(arms.loc[arms["metric"] == metric, "mean"], errors="coerce").notna().any():
            rows = _rows_of(run.loss, metric, host)
            kwargs = {"metric": metric, "stacks": stacks, "host": scope, "net": net}
            kwargs["withheld_cells"] = figures.withheld_by_cell(rows, metric)
            skip = figures.all_withheld(rows) if len(rows) else ""
            params = {"metric": metric, "net": net}
            specs.append(_spec(_name("cpu", scope, metric), kwargs, params, skip=skip))
    mine = [c for c in ceilings if c["host"] == host]
    if mine and run.fio[run.fio["host"] == host]["stack"].isin([c["stack"] for c in mine]).any():
        keys = ("stack", "read_ceiling_mib_s", "write_ceiling_mib_s")
        recorded = [{k: c.get(k) for k in keys} | {"unavailable": c.get("reason")} for c in mine]
        kwargs = {"ceilings": mine, "host": scope}
        skip = "" if any(c["reason"] is None for c in mine) else _no_ceiling(mine)
        specs.append(_spec(_name("ceiling", scope), kwargs, {"ceilings": recorded}, skip=skip))
    return specs


def _no_ceiling(ceilings: list[dict]) -> str:
    """Why no ceiling figure is drawn: no stack has a ceiling, each for its reason."""
    reasons = "; ".join(f"`{c['stack']}`: {c['reason']}" for c in ceilings)
    return f"no crypto ceiling to draw ({reasons})"


def _run_specs(run: Run, multi: bool) -> list[FigureSpec]:
    """Figures of the whole run: hosts side by side, cipher benchmark, one cost chart per
    comparison (the headline's is ``loss``)."""
    specs = [
        _spec(f"hosts-{m}", {"metric": m}, {"metric": m, "hosts": run.hosts})
        for m in (SUMMARY_METRICS if multi else ())
        if m in set(run.loss["metric"])
    ]
    cs = run.cryptsetup
    if len(cs) and len(available_ciphers(cs)):
        specs.append(_spec("ciphers"))
    for k, (baseline, variant) in enumerate(run.pairs):
        name = "loss" if k == 0 else f"loss-{variant}-vs-{baseline}"
        params = {"baseline": baseline, "variant": variant}
        rows = run.loss[(run.loss["baseline"] == baseline) & (run.loss["variant"] == variant)]
        skip = figures.all_withheld(rows)
        kwargs = {"comparison": (baseline, variant)}
        specs.append(_spec(name, kwargs, params, headline=run.pairs[0], skip=skip))
    return specs


def _fleet_specs(run: Run) -> list[FigureSpec]:
    """A fleet's figures: per comparison (headline first) and metric, every host's effect per
    cell; the cipher benchmark (one panel per host) is left to the tables, said so."""
    specs = []
    for k, (baseline, variant) in enumerate(run.pairs):
        rows = run.loss[(run.loss["baseline"] == baseline) & (run.loss["variant"] == variant)]
        for metric in dict.fromkeys(rows["metric"]):
            pair = "" if k == 0 else f"{variant}-vs-{baseline}"
            kwargs = {"metric": metric, "comparison": (baseline, variant)}
            params = {"metric": metric, "baseline": baseline, "variant": variant}
            skip = figures.all_withheld(rows[rows["metric"] == metric])
            specs.append(_spec(_name("fleet", None, metric, pair), kwargs, params, skip=skip))
    if len(run.cryptsetup) and len(available_ciphers(run.cryptsetup)):
        why = f"a fleet of {len(run.hosts)} hosts: every host's cipher benchmark is in the tables"
        specs.append(_spec("ciphers", skip=why))
    return specs


def make_figures(
    processed_dir: Path,
    figures_dir: Path,
    run: str,
    notebook: str | None = None,
    workers: int | None = None,
    per_host_max: int | None = None,
) -> dict[str, list[Path]]:
    """Draw every figure of :func:`figure_specs` for the processed run in ``processed_dir`` into
    ``figures_dir`` and write its index; returns {name: [png, svg]}. ``notebook`` (the notebook
    that made them) goes into the provenance; ``workers``: see :func:`_draw_all`;
    ``per_host_max``: config ``analysis.per_host_figures_max`` (None: the schema's default)."""
    data, figures_dir = load_run(processed_dir), Path(figures_dir)
    per_host_max = per_host_figures_max() if per_host_max is None else per_host_max
    specs = figure_specs(data, per_host_max)
    facts = {
        **provenance_facts(data.env, notebook),
        "luksbench_version": package_version(),
        "sources_sha256": data.digests(),
    }

    def draw(spec: FigureSpec) -> list[Path]:
        fig = spec.render(data)
        try:
            return save_figure(fig, figures_dir / spec.name, _provenance(run, spec, facts))
        finally:
            plt.close(fig)

    drawn = dict(_draw_all([s for s in specs if not s.skip], draw, workers))
    write_index(figures_dir, run, specs, {"hosts": len(data.hosts), "per_host_max": per_host_max})
    return drawn


def _provenance(run: str, spec: FigureSpec, facts: dict) -> dict:
    return {
        "title": f"luksbench {run}: {spec.name}",
        "run": run,
        "figure": spec.name,
        "made_by": f"{spec.draw.__module__}.{spec.draw.__name__}",
        **facts,
        **({"params": spec.params} if spec.params else {}),
    }


def _draw_all(specs: list[FigureSpec], draw, workers: int | None) -> list[tuple[str, list[Path]]]:
    """Draw and save every figure, split over ``workers`` forked processes (default: the CPUs
    available; 1 = here): saving is most of the time and each figure is independent. A failure
    names the figure and the error."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    workers = max(1, min(int(workers), len(specs)))
    if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [(spec.name, draw(spec)) for spec in specs]
    # fork: the workers inherit the tables instead of unpickling them, and never re-run the
    # caller's main module
    global _DRAWING
    _DRAWING = (specs, draw)
    context = multiprocessing.get_context("fork")
    try:
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            drawn = list(pool.map(_draw_nth, range(len(specs))))
    except Exception as exc:  # a worker killed: BrokenProcessPool
        raise RuntimeError(f"drawing figures failed: {exc}") from exc
    finally:
        _DRAWING = None
    return [(spec.name, paths) for spec, paths in zip(specs, drawn, strict=True)]


_DRAWING = None  # (specs, draw) of the figures being drawn, for the forked workers


def _draw_nth(k: int) -> list[Path]:
    """Worker: draw figure ``k``; an error names the figure."""
    specs, draw = _DRAWING
    try:
        return draw(specs[k])
    except Exception as exc:
        raise RuntimeError(f"{specs[k].name}: {type(exc).__name__}: {exc}") from exc


def write_index(
    figures_dir: Path, run: str, specs: list[FigureSpec], hosts: dict | None = None
) -> Path:
    """``<figures_dir>/index.json``: the run's figures in catalog order (name, family, files
    relative to the folder, caption, inputs = the processed tables drawn from); ``hosts``: the
    run's host count and the per-host limit it was drawn with (``hosts``, ``per_host_max``)."""
    entries = [
        {
            "name": spec.name,
            "family": spec.family,
            "files": [p.name for p in figure_paths(Path(figures_dir) / spec.name)],
            "caption": spec.caption,
            "inputs": [f"{t}.parquet" for t in (*spec.tables, *spec.sources)],
        }
        for spec in specs
        if not spec.skip
    ]
    skipped = [
        {"name": s.name, "family": s.family, "caption": s.caption, "reason": s.skip}
        for s in specs
        if s.skip
    ]
    path = Path(figures_dir) / INDEX
    index = {"run": run, "figures": entries, "skipped": skipped, **(hosts or {})}
    return replace_file(path, (json.dumps(index, indent=1) + "\n").encode())


def read_index(figures_dir: Path) -> list[dict]:
    """The figure entries of ``<figures_dir>/index.json`` (FileNotFoundError naming the step that
    writes it)."""
    return _index(figures_dir)["figures"]


def read_hosts(figures_dir: Path) -> dict:
    """index.json's host count and per-host limit (``hosts``, ``per_host_max``; {} if absent)."""
    index = _index(figures_dir)
    return {k: index[k] for k in ("hosts", "per_host_max") if k in index}


def read_skipped(figures_dir: Path) -> list[dict]:
    """The figures the catalog did not draw, each with its reason (index.json's ``skipped``)."""
    return _index(figures_dir).get("skipped", [])


def _index(figures_dir: Path) -> dict:
    path = Path(figures_dir) / INDEX
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: draw the figures first (notebook 03)")
    return json.loads(path.read_text())
