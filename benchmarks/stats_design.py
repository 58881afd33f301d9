"""Design benchmark: device time per cell and the interval half-widths it buys.

    python benchmarks/stats_design.py [RAW_DIR] [--metric bw_bytes]

Compares, on the cells of a measured run (default: the shipped sample, data/raw/sample):

* MEASURED  the run as it was measured (its fixed design: n pairs of runtime + ramp per arm), with
            the 95 % half-widths its loss table reports;
* PROJECTED the default adaptive profile (pilot 4 pairs, target +-2 points, cap 12) with the same
            fio settings, taking each cell's measured SD of d = ln(variant/baseline) as the pilot
            SD: Stein's N, the device seconds, and the half-width t_{N-1} s / sqrt(N) transformed to
            loss points;
* the SCS-style fixed design, one 60 s run per arm (+ the same ramp): its device seconds; with one
  pair there is no interval at all (n = 1), whatever the noise.

Nothing here runs fio: the projected numbers are projections from measured variance and say so.
Device seconds count fio runtime + ramp_time of both arms, not stack setup or tool start-up.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from luksbench.analysis import rawloss, stats

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = {"pilot_pairs": 4, "target_half_width_pct": 2.0, "max_pairs": 12}
SCS_RUNTIME_S = 60


def half_width_pct(mean: float, sd: float, n: int, better_high: bool) -> float:
    """Half of the 95 % interval width in effect points for n pairs with SD sd around mean."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    h = stats._t_quantile(0.95, n - 1) * sd / math.sqrt(n)
    _, lo, hi = stats.effect_from_log_ratio(mean, mean - h, mean + h, better_high)
    return (hi - lo) / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw_dir", nargs="?", default=str(REPO / "data" / "raw" / "sample"))
    parser.add_argument("--metric", default="bw_bytes")
    args = parser.parse_args(argv)
    raw = Path(args.raw_dir)
    manifest = json.loads(next(raw.glob("*/fio/manifest.json")).read_text())
    fio_opts = manifest["fio"]
    run_s = float(fio_opts["runtime_s"]) + float(fio_opts.get("ramp_time_s", 0))
    loss = rawloss.loss_table_from_raw(raw, metrics=[args.metric])
    better_high = stats.higher_is_better(args.metric)
    p = DEFAULT_PROFILE
    pairs, required, capped = stats.stein_pairs(
        loss["sd_log_ratio"].to_numpy(float),
        p["pilot_pairs"],
        p["target_half_width_pct"],
        p["max_pairs"],
    )
    scs_s = 2 * (SCS_RUNTIME_S + float(fio_opts.get("ramp_time_s", 0)))

    print(
        f"run {raw.name}: {len(loss)} cells, metric {args.metric}, fio runtime "
        f"{fio_opts['runtime_s']} s + ramp {fio_opts.get('ramp_time_s', 0)} s per run, "
        f"backend {manifest.get('backend')}"
    )
    print("MEASURED = from the run's fio results; PROJECTED = from the measured SD, no fio run.\n")
    head = (
        f"{'cell':<20} {'sd(d)':>6} | {'MEASURED fixed':>17} {'dev-s':>6} | "
        f"{'PROJECTED adaptive':>19} {'dev-s':>6} {'needs':>5} | {'60 s x 1':>8} {'dev-s':>6}"
    )
    print(head)
    print("-" * len(head))
    rows = []
    for i, r in enumerate(loss.itertuples(index=False)):
        n_meas = int(r.n)
        meas_hw = (r.ci_high - r.ci_low) / 2
        meas_s = 2 * n_meas * run_s
        n_ad = int(pairs[i])
        ad_hw = half_width_pct(r.mean_log_ratio, r.sd_log_ratio, n_ad, better_high)
        ad_s = 2 * n_ad * run_s
        rows.append((meas_hw, meas_s, ad_hw, ad_s, bool(capped[i]), n_ad))
        print(
            f"{r.workload:<20} {r.sd_log_ratio:6.3f} | n={n_meas:<2} +-{meas_hw:6.1f} pts "
            f"{meas_s:6.0f} | N={n_ad:<2} +-{ad_hw:6.1f} pts {ad_s:6.0f} "
            f"{math.ceil(required[i]):>5} | {'no CI':>8} {scs_s:6.0f}"
        )
    meas_hw, meas_s, ad_hw, ad_s, noisy, n_ad = (np.array(c) for c in zip(*rows, strict=True))
    print("-" * len(head))
    print(
        f"{'total device-s':<27} | {'':>17} {meas_s.sum():6.0f} | {'':>19} {ad_s.sum():6.0f} "
        f"{'':>5} | {'':>8} {scs_s * len(loss):6.0f}"
    )
    print(
        f"{'median half-width (pts)':<27} | {np.median(meas_hw):17.1f} {'':>6} | "
        f"{np.median(ad_hw):19.1f} {'':>6} {'':>5} | {'n/a':>8}"
    )
    ok = ~noisy
    print(
        "\nneeds = pairs Stein's rule asks for before the cap (above the cap: noisy). The target is"
        " +-2 points at zero effect on the log scale;\nat large losses the same log width is"
        " narrower in points, so a capped cell can still end below 2 points."
    )
    print(
        f"adaptive: {int(ok.sum())} of {len(loss)} cells reach the +-{p['target_half_width_pct']:g}-point "
        f"target with {int(n_ad[ok].sum()) if ok.any() else 0} pairs; {int(noisy.sum())} cells stop at "
        f"the cap of {p['max_pairs']} pairs (median projected half-width there "
        f"{np.median(ad_hw[noisy]) if noisy.any() else math.nan:.1f} points)."
    )
    print(
        f"per cell: adaptive {np.mean(ad_s):.0f} device-s on average (min {ad_s.min():.0f}, max "
        f"{ad_s.max():.0f}) vs {scs_s:.0f} device-s for one 60 s run per arm, which gives no interval."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
