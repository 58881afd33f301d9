"""The sequential design's rounds: look (:func:`luksbench.analysis.sequential.next_round`), measure
(``luksbench testbox run-fio --targets`` as a subprocess), look again, until every cell stopped.

Kept out of :mod:`luksbench.analysis` so that the analysis only looks and decides; this module is
the one that drives the test box.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from luksbench.analysis import boundary as boundaries
from luksbench.analysis.sequential import next_round
from luksbench.formats.plan import read_plan


def progress(doc: dict, started: float) -> str:
    """One line: elapsed, spent and remaining device time, cells decided, ETA (at the cap)."""
    cells = doc["cells"].values()
    decided = sum(c["why"].startswith("stop: decided") for c in cells)
    spent, budget = doc["spent_s"], doc["budget_s"]
    left = sum(c["n"] for c in cells) and spent / sum(c["n"] for c in cells)  # s per pair
    todo = left * sum(doc["max_pairs"] - c["n"] for c in cells if not c["why"].startswith("stop"))
    todo = min(todo, budget - spent) if budget > 0 else todo
    remaining = f"{budget - spent:.0f} s of {budget:.0f} s left" if budget > 0 else "no budget"
    return (
        f"sequential: elapsed {time.monotonic() - started:.0f} s, device time spent {spent:.0f} s "
        f"({remaining}), {decided}/{len(doc['cells'])} cells decided, ETA <= {todo:.0f} s"
    )


def plan_sessions(plan_path) -> int:
    """The plan's sessions k (1 without a plan file)."""
    if plan_path is None or not Path(plan_path).exists():
        return 1
    return read_plan(Path(plan_path)).sessions


def round_options(plan_path) -> list[str]:
    """run-fio's options for a round beyond the targets: with sessions k >= 2 in the plan,
    ``--one-session`` (each round measured in one fresh stack-up as its session in the cycle,
    the stacks rebuilt between rounds as between the fixed design's sessions)."""
    return ["--one-session"] if plan_sessions(plan_path) >= 2 else []


def run_rounds(
    raw_dir, host: str, manifest, log, stacks: tuple, *, adaptive: dict, **design
) -> dict:
    """The workflow's rounds: :func:`next_round` into ``<raw_dir>/<host>/fio/targets.json``, then
    ``luksbench testbox run-fio <stacks> --targets`` it (``stacks``: its plan, state and describe
    options; :func:`round_options`), until every cell stopped; progress to stderr and ``log``.
    Every round starts from the raw results alone, so an interrupted run resumes."""
    from luksbench.analysis.ingest import fio_table

    raw_dir, manifest = Path(raw_dir), Path(manifest)
    fio_dir = raw_dir / host / "fio"
    targets = fio_dir / "targets.json"
    run_fio = ["testbox", "run-fio", *map(str, stacks), "--raw-host-dir", str(raw_dir / host)]
    run_fio += ["--manifest", str(manifest)]
    plan = dict(zip(stacks[::2], stacks[1::2], strict=False)).get("--plan")
    run_fio += round_options(plan)
    started = time.monotonic()
    settings = {k: adaptive[k] for k in ("min_pairs", "max_pairs", "metric")}
    settings["boundary"] = adaptive.get("boundary", boundaries.DEFAULT_BOUNDARY)
    settings["sessions"] = plan_sessions(plan)  # the first round's, before any manifest
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    last = None
    with open(log, "a") as out:
        while True:
            fio = fio_table(raw_dir) if any(fio_dir.glob("*/*/rep*.json")) else pd.DataFrame()
            doc = next_round(
                fio, host, targets, budget_s=adaptive["budget_h"] * 3600, **settings, **design
            )
            print(progress(doc, started), file=out, flush=True)
            print(progress(doc, started), file=sys.stderr, flush=True)
            if doc["done"] and manifest.exists():
                return doc
            if doc["looks"][-1]["cells"] == (last or {}).get("cells"):
                raise RuntimeError(f"a round measured nothing new; see {log}")
            last = doc["looks"][-1]
            argv = [sys.executable, "-m", "luksbench.cli", *run_fio, "--targets", str(targets)]
            subprocess.run(argv, check=True, stdout=out, stderr=subprocess.STDOUT)
