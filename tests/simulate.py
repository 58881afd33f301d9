"""Simulated paired benchmark tables with a known ratio (shared by the validation tests and the
design benchmark). Not a test module."""

from __future__ import annotations

import numpy as np
import pandas as pd

from luksbench import stats


def simulate_logs(rng, n_cells, n_pairs, sigma, log_ratio, order_drift=0.01, pair_drift=0.3):
    """(log baseline, log variant), shape (n_cells, n_pairs).

    Pair k of cell c: both arms share a level that drifts from pair to pair (random walk, sd
    ``pair_drift``: the machine warms up, the cache fills); within the pair the second run is
    ``order_drift`` faster on the log scale (a trend inside the pair) and the order is
    counterbalanced AB, BA, BA, AB, ...; each run adds its own noise (sd ``sigma[c]``).
    """
    sigma = np.asarray(sigma, float)[:, None]
    level = 18 + np.cumsum(rng.normal(0, pair_drift, (n_cells, n_pairs)), axis=1)
    k = np.arange(1, n_pairs + 1)
    baseline_first = ((k - 1) % 4 == 0) | ((k - 1) % 4 == 3)
    shift_b = np.where(baseline_first, 0.0, order_drift)
    shift_v = np.where(baseline_first, order_drift, 0.0)
    lb = level + shift_b + rng.normal(0, 1, (n_cells, n_pairs)) * sigma
    lv = (
        level
        + np.asarray(log_ratio)[:, None]
        + shift_v
        + rng.normal(0, 1, (n_cells, n_pairs)) * sigma
    )
    return lb, lv


def fio_frame(lb, lv, n_pairs=None, metric="bw_bytes", capped=None) -> pd.DataFrame:
    """A tidy fio-like table from log values; ``n_pairs[c]`` pairs of cell c are kept (default all).

    With ``capped``, the adaptive design's columns (``target_pairs``, ``hit_cap``) as ingest
    writes them from targets.json."""
    n_cells, width = lb.shape
    n_pairs = np.full(n_cells, width) if n_pairs is None else np.asarray(n_pairs)
    cell, rep = np.nonzero(np.arange(width)[None, :] < n_pairs[:, None])
    parts = []
    for stack, logs in (("plain", lb), ("luks", lv)):
        parts.append(
            pd.DataFrame(
                {
                    "host": "sim",
                    "stack": stack,
                    "workload": [f"c{c:05d}" for c in cell],
                    "rep": rep + 1,
                    "job_slot": 0,
                    "job": "sim",
                    "direction": "read",
                    "rw": "randread",
                    "bs_bytes": 4096,
                    "iodepth": cell + 1,
                    "io_bytes": 1e9,
                    metric: np.exp(logs[cell, rep]),
                }
            )
        )
        if capped is not None:
            parts[-1]["target_pairs"] = n_pairs[cell].astype(float)
            parts[-1]["hit_cap"] = np.asarray(capped, bool)[cell]
    return pd.concat(parts, ignore_index=True)


def covered(loss: pd.DataFrame, true_log_ratio: np.ndarray) -> np.ndarray:
    """Whether each row's [ci_low, ci_high] holds the true loss (rows in cell order)."""
    true_loss = 100 * (1 - np.exp(np.asarray(true_log_ratio)))
    loss = loss.sort_values("workload")
    return ((loss["ci_low"] <= true_loss) & (true_loss <= loss["ci_high"])).to_numpy()


def two_stage(rng, n_cells, sigma, log_ratio, n0=4, half_width_pct=2.0, cap=12):
    """The adaptive design simulated: pilot n0 pairs, Stein targets from the pilot alone, top-up.

    Returns (fio table, pairs per cell, capped per cell)."""
    lb, lv = simulate_logs(rng, n_cells, cap, sigma, log_ratio)
    d_pilot = lv[:, :n0] - lb[:, :n0]
    pairs, _, capped = stats.stein_pairs(d_pilot.std(axis=1, ddof=1), n0, half_width_pct, cap)
    return fio_frame(lb, lv, pairs, capped=capped), pairs, capped
