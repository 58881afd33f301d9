"""Publishing a fleet: figures and paper of a 1,000-host run, as notebooks 03 and 04 make them.

    python benchmarks/fleet_publish.py [--hosts 1000] [--workers 2] [--per-host-max N]

Builds a processed run of ``--hosts`` hosts from the shipped sample (ingested and analysed once,
then every host's tables repeated with the host renamed: tests/simulate.py ``fleet_tables``, the
synthetic tables the unit test uses too), in a temporary folder, never in data/. Then times
``make_figures`` (config ``analysis.per_host_figures_max``: the schema's default unless
``--per-host-max``) and the paper (``render_paper`` + ``render_html``), and prints the figures'
count and size, the paper's size and the peak memory. Goal: under 10 minutes on the 2-core
development machine for 1,000 hosts (a run that drew one family of figures per host had drawn
12,000 files, 545 MB, after 30 minutes, still drawing).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the fleet builder the unit tests share
GOAL_S = 600.0


def _timed(what: str, step):
    t0 = time.perf_counter()
    result = step()
    elapsed = time.perf_counter() - t0
    print(f"{what}: {elapsed:.1f} s", flush=True)
    return result, elapsed


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-host-max", type=int, default=None)
    args = parser.parse_args(argv)

    from simulate import fleet_tables

    from luksbench.analysis import ingest
    from luksbench.analysis.loss import write_loss
    from luksbench.publish import render
    from luksbench.publish.catalog import make_figures, per_host_figures_max

    limit = per_host_figures_max() if args.per_host_max is None else args.per_host_max
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} CPUs, load average {load}; {args.hosts} hosts, "
        f"per_host_figures_max {limit}, {args.workers} drawing workers"
    )
    with tempfile.TemporaryDirectory(prefix="fleet-publish-") as tmp:
        tmp = Path(tmp)
        sample = tmp / "sample"
        ingest.write_processed(REPO / "data" / "raw" / "sample", sample, workers=1)
        write_loss(sample)
        fleet, _ = _timed(
            "fleet tables (not timed as publishing)",
            lambda: fleet_tables(sample, tmp / "processed", args.hosts),
        )
        figures_dir = tmp / "figures"
        drawn, t_fig = _timed(
            "figures",
            lambda: make_figures(fleet, figures_dir, "fleet", None, args.workers, limit),
        )
        md, t_md = _timed(
            "paper (Markdown)",
            lambda: render.render_paper(fleet, figures_dir, tmp / "paper" / "index.md", "fleet"),
        )
        html, t_html = _timed("paper (HTML)", lambda: render.render_html(md))
        files = [p for p in figures_dir.iterdir() if p.suffix in (".png", ".svg")]
        total = t_fig + t_md + t_html
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(
            f"figures: {len(drawn)} drawn, {len(files)} files, {_size_mb(figures_dir):.1f} MB; "
            f"paper: index.md {md.stat().st_size / 2**20:.1f} MB, "
            f"index.html {html.stat().st_size / 2**20:.1f} MB"
        )
        print(f"peak memory (this process): {peak:.2f} GiB")
        verdict = "met" if total < GOAL_S else "NOT met"
        print(f"publishing {args.hosts} hosts: {total:.1f} s; goal < {GOAL_S:.0f} s: {verdict}")
    return 0 if total < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
