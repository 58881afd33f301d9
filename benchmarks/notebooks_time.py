"""Analysis time: the four notebooks on a run (default: the shipped sample), as the workflow runs
them.

    python benchmarks/notebooks_time.py [--run sample] [--repeat 1]

Runs 01-ingest, 02-loss, 03-figures and 04-paper with papermill exactly as
workflow/rules/analysis.smk does (``--cwd notebooks --kernel python3``, the same parameters),
writing into a temporary folder (processed tables, figures, paper), never into data/. Prints each
notebook's wall time and the total; goal: under 60 s for the sample. The first ingest parses every
raw file (cold cache); with ``--repeat 2`` the second round shows the incremental ingest.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 60.0


def papermill(notebook: str, out: Path, params: dict[str, str]) -> float:
    args = [
        str(Path(sys.executable).parent / "papermill"),
        "--cwd",
        str(REPO / "notebooks"),
        "--kernel",
        "python3",
        "--no-progress-bar",
        str(REPO / "notebooks" / notebook),
        str(out / notebook),
    ]
    for key, value in params.items():
        args += ["-p", key, value]
    t0 = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if result.returncode != 0:
        sys.exit(f"{notebook} failed:\n{result.stderr[-3000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="sample")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    raw = REPO / "data" / "raw" / args.run
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} CPUs, load average {' '.join(load)}; run {args.run}"
    )
    with tempfile.TemporaryDirectory(prefix="luksbench-nb-") as tmp:
        base = Path(tmp)
        processed, figures, paper = (base / n for n in ("processed", "figures", "paper"))
        (base / "nb").mkdir()
        common = {"run": args.run}
        plan = [
            (
                "01-ingest.ipynb",
                {**common, "raw_dir": str(raw), "processed_dir": str(processed), "workers": "2"},
            ),
            ("02-loss.ipynb", {**common, "processed_dir": str(processed)}),
            (
                "03-figures.ipynb",
                {
                    **common,
                    "processed_dir": str(processed),
                    "figures_dir": str(figures),
                    "workers": "2",
                },
            ),
            (
                "04-paper.ipynb",
                {
                    **common,
                    "processed_dir": str(processed),
                    "figures_dir": str(figures),
                    "paper_dir": str(paper),
                    "reference_dir": str(REPO / "data" / "reference"),
                },
            ),
        ]
        for round_ in range(1, args.repeat + 1):
            total = 0.0
            for notebook, params in plan:
                elapsed = papermill(notebook, base / "nb", params)
                total += elapsed
                print(f"  round {round_}  {notebook:18s} {elapsed:6.1f} s")
            verdict = "met" if total < GOAL_S else "NOT met"
            print(
                f"  round {round_}  TOTAL              {total:6.1f} s  (goal < {GOAL_S:.0f} s: {verdict})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
