"""Efficiency benchmark: which design decides the most cells for the least device time.

    python benchmarks/sequential_design.py [RAW_RUN_DIR] [--workdir DIR]

Measured, not projected. Without RAW_RUN_DIR, one long run is measured here first by the workflow
(userspace backend on this machine): the default target's stacks and fio settings (6 s runs,
1 GiB devices), eight of its 16 cells (every rw and block size at queue depth 32), LONG_PAIRS
counterbalanced pairs each (about 45 minutes; ``--workdir`` keeps its raw data for a replay).
Then every design is replayed on the prefix of the same measured pairs of each cell (bandwidth,
plain -> luks):

* fixed 3 pairs (the default run), 95 % t-interval;
* Stein two-stage: pilot 4 pairs, target +-2 points, cap 12, Stein's interval;
* sequential: ``luksbench next``'s own code round by round (min 3, max 12 pairs, no budget),
  its interval valid at any look;
* PTS's dynamic rule: 3 runs, more while the CV of either arm is >= 3.5 %, at most 3x (9); its
  95 % t-interval (not valid under that stopping: shown for comparison);
* SCS: one 60 s run per arm (here the first ten 6 s runs of each arm), no interval.

Per design: device-seconds per cell (fio's runtimes of both arms), cells decided (by magnitude,
throughput regions 5 / 20 %), median half-width (loss points), and coverage: the share of cells
whose interval holds the long-sequence estimate (mean of all LONG_PAIRS pairs).

Then the sequential design's boundaries (bonferroni, pocock, obrien-fleming), each replayed
through ``next_round`` on the measured run (at most as many pairs as it has) and on SIM_CELLS
simulated cells per noise level sd(d) in SIM_SDS (what real NVMe shows; true losses uniform in
SIM_LOSS %, seeded): pairs per decided cell, share decided, and wrong decisions against the
simulated truth.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from luksbench.analysis import ingest, sequential, stats  # noqa: E402

LONG_PAIRS = 20
SIM_SDS = (0.01, 0.02, 0.03, 0.05)
SIM_CELLS = 200
SIM_LOSS = (-5.0, 30.0)
SIM_SEED = 20261128
BOUNDARY_NAMES = ("bonferroni", "pocock", "obrien-fleming")
MATRIX = {"rw": ["read", "write", "randread", "randwrite"], "bs": ["4k", "1m"], "iodepth": [32]}


def measure(work: Path) -> Path:
    """The default target's stacks and fio settings, eight of its 16 cells, LONG_PAIRS pairs each,
    measured by the workflow in a copy of it."""
    names = ("Snakefile", "workflow", "config", "envs", "notebooks", "src", "data/reference")
    for name in (*names, "profiles/default"):
        src = REPO / name
        if (work / name).exists():
            continue
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / name)
    config = {"run": "sequential-bench", "matrix": MATRIX, "repetitions": LONG_PAIRS}
    (work / "sequential.yaml").write_text(json.dumps(config))
    target = "data/processed/sequential-bench/fio.parquet"
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", target]
    subprocess.run([*cmd, "--configfile", "sequential.yaml"], cwd=work, check=True)
    return work / "data" / "raw" / "sequential-bench"


def cell_sequences(fio: pd.DataFrame) -> tuple[dict, dict]:
    """Per cell: d = ln(luks / plain) of bandwidth per pair, and each pair's device seconds."""
    paired = stats.pair_values(fio, "plain", "luks", ["bw_bytes"])
    d = {
        w: np.log(g.sort_values("rep").eval("variant_value / baseline_value").to_numpy(float))
        for w, g in paired.groupby("workload")
    }
    pairs = sequential.device_seconds(fio)
    seconds = {
        w: g.sort_values("rep")["seconds"].to_numpy(float) for w, g in pairs.groupby("workload")
    }
    return d, seconds


def interval(d: np.ndarray, level: float = 0.95, pilot=None) -> tuple[float, float]:
    """(low, high) loss % of the paired interval on d."""
    ci = stats.paired_log_ratio_ci(d, level, pilot)
    _, low, high = stats.effect_from_log_ratio(ci.mean, ci.low, ci.high, True)
    return low, high


def fixed(d, n=3):
    return n, interval(d[:n])


def stein(d, n0=4, half=2.0, cap=12):
    n = int(np.atleast_1d(stats.stein_pairs(d[:n0].std(ddof=1), n0, half, cap)[0])[0])
    return n, interval(d[:n], 0.95, (d[:n0].std(ddof=1), n0))


def pts(d, logs, start=3, cv=0.035):
    n = start
    while n < 3 * start and max(np.std(x[:n], ddof=1) / np.mean(x[:n]) for x in logs) >= cv:
        n += 1
    return n, interval(d[:n])


def sequential_replay(fio: pd.DataFrame, min_pairs=3, max_pairs=12, boundary="pocock") -> dict:
    """(pairs, (low, high)) per cell from next_round's own decisions, round by round (``fio``
    holds at least max_pairs pairs of every cell)."""
    wanted = dict.fromkeys(fio["workload"].unique(), min_pairs)
    with tempfile.TemporaryDirectory() as tmp:
        while True:
            part = fio[fio["rep"] <= fio["workload"].map(wanted)]
            doc = sequential.next_round(
                part,
                fio["host"].iloc[0],
                Path(tmp) / "targets.json",
                comparisons=[("plain", "luks")],
                min_pairs=min_pairs,
                max_pairs=max_pairs,
                boundary=boundary,
            )
            if doc["done"]:
                break
            wanted = doc["pairs"]
    return {w: (c["n"], (c["ci_low"], c["ci_high"])) for w, c in doc["cells"].items()}


def decided(low, high) -> bool:
    return not stats.decision(low, high, 5.0, 20.0).startswith(("undecided", "insufficient"))


def simulated_run(sd: float, rng: np.random.Generator, pairs: int = 12):
    """SIM_CELLS cells of ``pairs`` pairs (6-s runs): d = ln(1 - loss/100) + N(0, sd), the
    loss uniform in SIM_LOSS; the level both arms share walks. Returns (fio table, true loss
    per workload)."""
    loss = rng.uniform(*SIM_LOSS, SIM_CELLS)
    d = np.log1p(-loss / 100)[:, None] + rng.normal(0, sd, (SIM_CELLS, pairs))
    level = 18 + np.cumsum(rng.normal(0, 0.3, (SIM_CELLS, pairs)), axis=1)
    cell, rep = np.indices((SIM_CELLS, pairs)).reshape(2, -1)
    workloads = np.array([f"randread-4k-qd{c + 1}" for c in range(SIM_CELLS)])
    frames = [
        pd.DataFrame(
            {
                **{"host": "sim", "stack": stack, "workload": workloads[cell], "rep": rep + 1},
                **{"job_slot": 0, "job": "sim", "direction": "read", "rw": "randread"},
                **{"bs_bytes": 4096, "iodepth": cell + 1, "runtime_ms": 6000.0, "io_bytes": 1e9},
                "bw_bytes": np.exp(logs[cell, rep]),
            }
        )
        for stack, logs in (("plain", level), ("luks", level + d))
    ]
    return pd.concat(frames, ignore_index=True), dict(zip(workloads, loss, strict=True))


def wrong(low, high, truth) -> bool:
    """A decided region that does not hold the true loss."""
    verdict = stats.decision(low, high, 5.0, 20.0)
    return decided(low, high) and stats.decision(truth, truth, 5.0, 20.0) != verdict


def boundary_rows(fio: pd.DataFrame, truth: dict | None, max_pairs: int) -> list[str]:
    """One line per boundary: pairs per decided cell, share decided (wrong, given a truth)."""
    lines = []
    for name in BOUNDARY_NAMES:
        cells = sequential_replay(fio, max_pairs=max_pairs, boundary=name)
        ok = [decided(*ci) for _, ci in cells.values()]
        pairs = sum(n for n, _ in cells.values())
        per = f"{pairs / sum(ok):.1f}" if any(ok) else "none"
        line = f"  {name:<16}{per:>12}{100 * np.mean(ok):>9.0f} %{pairs / len(cells):>12.1f}"
        if truth is not None:
            errs = [wrong(*ci, truth[w]) for w, (_, ci) in cells.items()]
            line += f"{100 * np.mean(errs):>9.1f} %"
        lines.append(line)
    return lines


def print_boundaries(fio: pd.DataFrame, long_n: int) -> None:
    """The boundaries replayed on the measured run and on simulated cells."""
    head = f"  {'boundary':<16}{'pairs/decided':>12}{'decided':>11}{'pairs/cell':>12}"
    cap = min(12, long_n)
    print(f"\nsequential boundaries, 3..{cap} pairs, on the measured run (truth unknown)")
    print(head)
    print("\n".join(boundary_rows(fio, None, cap)))
    rng = np.random.default_rng(SIM_SEED)
    for sd in SIM_SDS:
        sim, truth = simulated_run(sd, rng)
        print(f"\nsimulated: {SIM_CELLS} cells, sd(d) {sd}, loss uniform {SIM_LOSS} %, 3..12 pairs")
        print(f"{head}{'wrong':>11}")
        print("\n".join(boundary_rows(sim, truth, 12)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw_dir", nargs="?", type=Path)
    ap.add_argument("--workdir", type=Path, help="measure here (kept) instead of a temp folder")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="luksbench-seq-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        raw = args.raw_dir or measure(work)
        fio = ingest.fio_table(raw)
    d, seconds = cell_sequences(fio)
    arms = {
        w: [
            np.exp(g[g["stack"] == s].sort_values("rep")["bw_bytes"].to_numpy(float))
            for s in ("plain", "luks")
        ]
        for w, g in fio.assign(bw_bytes=np.log(fio["bw_bytes"])).groupby("workload")
    }
    long_n = min(len(x) for x in d.values())
    truth = {w: 100 * (1 - math.exp(x.mean())) for w, x in d.items()}
    seq = sequential_replay(fio, max_pairs=min(12, long_n))
    designs = {
        "fixed 3 pairs": {w: fixed(x) for w, x in d.items()},
        "Stein two-stage (+-2, cap 12)": {w: stein(x) for w, x in d.items()},
        "sequential (3..12, any look)": seq,
        "PTS (CV >= 3.5 %, cap 9)": {w: pts(x, arms[w]) for w, x in d.items()},
        "SCS (60 s per arm)": {w: (10, (math.nan, math.nan)) for w in d},
    }
    print(f"run {raw}: {len(d)} cells, {long_n} measured pairs each (bandwidth, plain -> luks)")
    print(f"{'design':<32}{'device s/cell':>14}{'decided':>9}{'median half':>12}{'coverage':>9}")
    for name, cells in designs.items():
        cost = np.mean([seconds[w][:n].sum() for w, (n, _) in cells.items()])
        ok = [decided(*ci) for _, ci in cells.values()]
        half = [(hi - lo) / 2 for _, (lo, hi) in cells.values() if math.isfinite(lo)]
        cov = [lo <= truth[w] <= hi for w, (_, (lo, hi)) in cells.items() if math.isfinite(lo)]
        half_txt = f"{np.median(half):.1f} pts" if half else "none"
        cov_txt = f"{100 * np.mean(cov):.0f} %" if cov else "n/a"
        print(f"{name:<32}{cost:>14.0f}{sum(ok):>5}/{len(ok):<3}{half_txt:>12}{cov_txt:>9}")
    print(f"\n{'cell':<20}{'long loss':>10}{'sd(d)':>7}{'seq pairs':>10}  sequential decision")
    for w, (n, (lo, hi)) in seq.items():
        verdict = stats.decision(lo, hi, 5.0, 20.0)
        print(f"{w:<20}{truth[w]:>9.1f}%{d[w].std(ddof=1):>7.3f}{n:>10}  {verdict}")
    seq_cost = np.mean([seconds[w][:n].sum() for w, (n, _) in seq.items()])
    share = np.mean([decided(*ci) for _, ci in seq.values()])
    met = share >= 0.9 and seq_cost <= 120
    print(
        f"goal (>= 90 % decided, <= 120 device-s per cell): {'met' if met else 'not met'} "
        f"({100 * share:.0f} %, {seq_cost:.0f} s)"
    )
    print_boundaries(fio, long_n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
