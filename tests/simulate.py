"""Simulated paired benchmark tables with a known ratio (shared by the validation tests and the
design benchmark). Not a test module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from luksbench.analysis import stats


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


def drifting_logs(rng, n_cells, n_pairs, sd_d, log_ratio, rho):
    """(log baseline, log variant) whose log ratios d drift: d_k = log_ratio + sd_d u_k, u a
    stationary AR(1) series with coefficient ``rho`` and unit variance across a cell's pairs (the
    order measured), so the pairing does not cancel it; the level both arms share walks too."""
    u = np.empty((n_cells, n_pairs))
    u[:, 0] = rng.standard_normal(n_cells)
    for k in range(1, n_pairs):
        u[:, k] = rho * u[:, k - 1] + np.sqrt(1 - rho**2) * rng.standard_normal(n_cells)
    lb = 18 + np.cumsum(rng.normal(0, 0.3, (n_cells, n_pairs)), axis=1)
    lv = lb + np.reshape(log_ratio, (-1, 1)) + np.asarray(sd_d, float)[:, None] * u
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
    """The adaptive design simulated: pilot n0 pairs, Stein targets from the pilot alone, top-up;
    the table carries n0 as ingest reads it from targets.json (``pilot_pairs``).

    Returns (fio table, pairs per cell, capped per cell)."""
    lb, lv = simulate_logs(rng, n_cells, cap, sigma, log_ratio)
    d_pilot = lv[:, :n0] - lb[:, :n0]
    pairs, _, capped = stats.stein_pairs(d_pilot.std(axis=1, ddof=1), n0, half_width_pct, cap)
    fio = fio_frame(lb, lv, pairs, capped=capped).assign(pilot_pairs=float(n0))
    return fio, pairs, capped


def loss_row(d, metric="bw_bytes", level=0.95, kind="t", pilot=None, n=None, **columns) -> dict:
    """A loss-table row of the log ratios ``d`` as :mod:`luksbench.analysis.stats` computes it
    (``d`` None or empty: a withheld row without pairs); ``columns``: the cell's own (workload,
    baseline, variant, ...). ``pilot``: (sd, pairs) of a two-stage design's pilot."""
    import math

    better = stats.higher_is_better(metric)
    d = np.array([] if d is None else d, float)
    ci = stats.paired_log_ratio_ci(d, level, pilot)
    effect, low, high = (math.nan,) * 3
    if d.size:
        effect, low, high = stats.effect_from_log_ratio(ci.mean, ci.low, ci.high, better)
    lower, upper = stats.DEFAULT_DECISION_REGIONS[stats.METRIC_FAMILIES[metric]]
    return {
        **columns,
        "metric": metric,
        "higher_is_better": better,
        "n": n or d.size,
        "sessions": d.size if kind == "sessions" else 1,
        "mean_log_ratio": ci.mean,
        "sd_log_ratio": ci.sd,
        "interval": kind,
        "pilot_pairs": pilot[1] if pilot else np.nan,
        "pilot_sd_log_ratio": pilot[0] if pilot else np.nan,
        "confidence": 0.95,
        "look_confidence": level if kind == "sequential" else np.nan,
        "effect_pct": effect,
        "ci_low": low,
        "ci_high": high,
        "decision": stats.decision(low, high, lower, upper),
        "decision_lower_pct": lower,
        "decision_upper_pct": upper,
    }


# ----------------------------------------------------------------------- raw runs with known ratios


def _scale_fio_json(path, factor: float, options: dict | None = None) -> None:
    """Multiply a fio result's throughput (bw, bw_bytes, iops of every direction) and the bytes
    it moved in its runtime (io_bytes, io_kbytes: ingest refuses bandwidth that io_bytes / runtime
    contradicts) by ``factor``; ``options`` replace job options (e.g. the ioengine a pattern ran
    with)."""
    import json

    doc = json.loads(path.read_text())
    for job in doc["jobs"]:
        for direction in ("read", "write", "trim"):
            side = job.get(direction) or {}
            for key in ("bw_bytes", "bw", "iops"):
                if key in side:
                    side[key] *= factor
            for key in ("io_bytes", "io_kbytes"):
                if key in side:
                    side[key] = round(side[key] * factor)
        if options:
            job.setdefault("job options", {}).update(options)
    path.write_text(json.dumps(doc))


def record_results(host_dir, manifest: dict) -> dict:
    """``manifest`` with ``runs`` listing exactly the fio results now under ``host_dir/fio`` (kept
    entries as they were), and no session records: a test that adds or removes results also
    records them, as the runner would have."""
    import shutil
    from pathlib import Path

    host_dir = Path(host_dir)
    known = {r["path"]: r for r in manifest.get("runs", [])}
    runs = []
    for rep in sorted((host_dir / "fio").glob("*/*/rep*.json")):
        if rep.name.endswith(".cpu.json"):
            continue
        path = rep.relative_to(host_dir).as_posix()
        _, stack, workload, name = path.split("/")
        k = int(name.removeprefix("rep").removesuffix(".json"))
        runs.append(
            known.get(path) or {"rep": k, "stack": stack, "workload": workload, "path": path}
        )
    shutil.rmtree(host_dir / "fio" / "sessions", ignore_errors=True)
    return {**manifest, "runs": runs}


def rerecord(host_dir) -> None:
    """Rewrite ``host_dir/fio/manifest.json`` with :func:`record_results`."""
    import json
    from pathlib import Path

    path = Path(host_dir) / "fio" / "manifest.json"
    manifest = record_results(host_dir, json.loads(path.read_text()))
    path.unlink()
    path.write_text(json.dumps(manifest))


def derived_run(
    sample_raw,
    raw,
    cells=("randread-4k-qd1", "randwrite-1m-qd1", "read-1m-qd32"),
    stack_factors: dict | None = None,
    patterns: dict | None = None,
    unavailable: dict | None = None,
):
    """A raw run built from the shipped sample (real fio json+ output of ``plain`` and ``luks``)
    with known differences, for tests of the analysis:

    * only ``cells`` are kept;
    * ``stack_factors``: new stack -> (source stack, [factor of rep 1, rep 2, ...]): a copy of the
      source stack's results with throughput times the rep's factor (the true ratio to the
      source is the geometric mean of the factors);
    * ``patterns``: pattern name -> {"from": cell, "factors": {stack: [per rep]}, "options":
      job options, "plan": the pattern's config}: the cell copied as ``<cell>-<pattern>`` on
      every stack, its throughput scaled, job options replaced, the config in env.json's plan;
    * ``unavailable``: stack -> reason: optional stacks that could not be built, recorded in the
      manifest (``unavailable_stacks``, stack description) and planned in env.json.

    Returns ``raw`` (the run folder; host ``vm``)."""
    import json
    import shutil
    from pathlib import Path

    raw = Path(raw)
    shutil.copytree(sample_raw, raw)
    for p in [raw, *raw.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the sample's results are read-only
    fio = raw / "vm" / "fio"
    for cell in fio.glob("*/*"):
        if cell.is_dir() and cell.name not in cells:
            shutil.rmtree(cell)
    manifest = json.loads((fio / "manifest.json").read_text())
    env = json.loads((raw / "vm" / "env.json").read_text())
    descriptions = manifest["stack_descriptions"].get("stacks", manifest["stack_descriptions"])
    for stack, (source, factors) in (stack_factors or {}).items():
        shutil.copytree(fio / source, fio / stack)
        for k, factor in enumerate(factors, start=1):
            for rep in (fio / stack).glob(f"*/rep{k}.json"):
                _scale_fio_json(rep, factor)
        descriptions[stack] = dict(descriptions[source])
        env["plan"]["stacks"][stack] = dict(env["plan"]["stacks"][source])
    for name, spec in (patterns or {}).items():
        for stack_dir in [d for d in fio.iterdir() if (d / spec["from"]).is_dir()]:
            target = stack_dir / f"{spec['from']}-{name}"
            shutil.copytree(stack_dir / spec["from"], target)
            factors = (spec.get("factors") or {}).get(stack_dir.name, [])
            for rep in sorted(target.glob("rep*.json")):
                if rep.name.endswith(".cpu.json"):
                    continue
                k = int(rep.stem.removeprefix("rep"))
                factor = factors[k - 1] if k <= len(factors) else 1.0
                _scale_fio_json(rep, factor, spec.get("options"))
        env["plan"].setdefault("patterns", {})[name] = spec.get("plan") or {}
    for stack, reason in (unavailable or {}).items():
        descriptions[stack] = {"kind": "luks", "unavailable": reason, "notes": [reason]}
        manifest.setdefault("unavailable_stacks", {})[stack] = reason
        env["plan"]["stacks"][stack] = {"kind": "luks", "optional": True}
    manifest = record_results(raw / "vm", manifest)
    for path, doc in ((fio / "manifest.json", manifest), (raw / "vm" / "env.json", env)):
        path.unlink()
        path.write_text(json.dumps(doc))
    return raw


# ---------------------------------------------------------------- simulated raw runs (the raw layout)

SIM_HOST = "sim"
#: latency of the simulated runs: the mean completion latency moves inversely to throughput
SIM_BS = 4096


#: the simulated json+ histogram: share of a run's completions at 1, 1.5 and 2 x its mean latency
#: (the tail buckets times the run's tail factor): p50 at 1 x, p99 at 1.5 x, p99.9 at 2 x
SIM_TAIL_SHARES = (0.98, 0.015, 0.005)


def _histogram(clat: float, tail: float, ios: int) -> dict:
    """json+ ``bins`` (ns -> completions) of ``ios`` completions: :data:`SIM_TAIL_SHARES` at
    clat, 1.5 clat e^tail and 2 clat e^tail."""
    at = (clat, 1.5 * clat * np.exp(tail), 2 * clat * np.exp(tail))
    counts = np.round(np.asarray(SIM_TAIL_SHARES) * ios).astype(int)
    bins: dict[str, int] = {}
    for ns, count in zip(at, counts, strict=True):
        key = str(round(ns))
        bins[key] = bins.get(key, 0) + int(count)
    return bins


def _fio_job(name: str, bw: float, iodepth: int, tail=None, ios=None, unsettled=False) -> dict:
    """One job entry of a fio JSON result: ``bw`` bytes/s at 4 KiB, latency 1/IOPS (queue 1).
    With ``tail`` (log factor of the tail latency), a json+ histogram of ``ios`` completions
    (default: the run's I/Os) with the tail buckets of :func:`_histogram`. ``unsettled``: the job
    had a steady-state criterion that fio reports not attained."""
    iops = bw / SIM_BS
    clat = 1e9 / iops
    stats = {  # fio 3's keys: io_bytes in bytes beside io_kbytes, bw_bytes beside bw in KiB/s
        "io_bytes": int(bw * 6),
        "io_kbytes": int(bw * 6) // 1024,
        "bw_bytes": bw,
        "bw": bw / 1024,
        "iops": iops,
        "runtime": 6000,
        "clat_ns": {"mean": clat, "percentile": {"50.000000": clat, "99.000000": 2 * clat}},
        "lat_ns": {"mean": clat},
    }
    if tail is not None:
        stats["clat_ns"]["bins"] = _histogram(clat, tail, ios or int(bw * 6 / SIM_BS))
    options = {"rw": "randread", "bs": "4k", "iodepth": str(iodepth)}
    job = {"jobname": name, "groupid": 0, "error": 0, "job options": options, "read": stats}
    if unsettled:
        job["steadystate"] = {"ss": "iops_slope", "criterion": 0.1, "attained": 0}
    return job


def write_raw_reps(
    raw, logs: dict, reps, jobs: int = 1, tails=None, ios=None, unsettled=None
) -> None:
    """Write fio results in the raw layout ``<raw>/sim/fio/<stack>/<workload>/rep<k>.json``.

    ``logs``: stack -> log bandwidth, shape (cells, pairs); cell c is job slot ``c % jobs`` of
    workload ``randread-4k-qd<w + 1>``, w = c // jobs (``jobs`` = cells per workload: one fio file holds the
    jobs of one workload). ``reps[w]``: the repetitions (1-based) of workload w to write.
    ``tails``: stack -> log tail factor, same shape: json+ histograms whose p99 and p99.9 move
    by it (:func:`_histogram`), of ``ios`` completions per run (default: the run's I/Os).
    ``unsettled``: stack -> bool, same shape: runs whose steady state fio reports not attained.
    Existing files are kept (the raw record is never overwritten)."""
    import json
    from pathlib import Path

    for stack, lg in logs.items():
        tail = None if tails is None else tails[stack]
        unsettled_runs = np.zeros(lg.shape, dtype=bool) if unsettled is None else unsettled[stack]
        for w, cell_reps in enumerate(reps):
            folder = Path(raw) / SIM_HOST / "fio" / stack / sim_workload(w)
            folder.mkdir(parents=True, exist_ok=True)
            for k in cell_reps:
                path = folder / f"rep{k}.json"
                if path.exists():
                    continue
                cells = range(w * jobs, (w + 1) * jobs)
                entries = [
                    _fio_job(
                        f"j{j}",
                        float(np.exp(lg[c, k - 1])),
                        w + 1,
                        None if tail is None else float(tail[c, k - 1]),
                        ios,
                        bool(unsettled_runs[c, k - 1]),
                    )
                    for j, c in enumerate(cells)
                ]
                path.write_text(json.dumps({"fio version": "fio-3.36", "jobs": entries}))


def sim_workload(w: int) -> str:
    """Workload id of simulated workload ``w`` (0-based)."""
    return f"randread-4k-qd{w + 1}"


def write_session_run(raw, rng, workloads, jobs, sd_session, sessions, pairs, planned=None):
    """A raw run (layout and manifest) of ``workloads * jobs`` cells, each measured in
    ``sessions`` sessions of ``pairs`` pairs: true loss U(-10, 60) %, pair noise per arm
    U(0.002, 0.01) on the log scale, and each session shifting the cell's log ratio by its own
    N(0, sd_session). ``planned``: the manifest's sessions (default ``sessions``).

    Returns (true loss per cell, log ratio d per cell and pair)."""
    import json

    cells, n = workloads * jobs, sessions * pairs
    true_loss = rng.uniform(-10, 60, cells)
    sigma = rng.uniform(0.002, 0.01, cells)
    lb, lv = simulate_logs(rng, cells, n, sigma, np.log1p(-true_loss / 100), order_drift=0)
    lv = lv + np.repeat(rng.normal(0, sd_session, (cells, sessions)), pairs, axis=1)
    write_raw_reps(raw, {"plain": lb + 18, "luks": lv + 18}, [range(1, n + 1)] * workloads, jobs)
    runs = [
        {"rep": k, "stack": stack, "workload": sim_workload(w), "session": f"s{(k - 1) // pairs}"}
        | {"path": f"fio/{stack}/{sim_workload(w)}/rep{k}.json", "status": "ok"}
        for stack in ("plain", "luks")
        for w in range(workloads)
        for k in range(1, n + 1)
    ]
    doc = {"run": "sim", "host": SIM_HOST, "sessions": planned or sessions, "runs": runs}
    (raw / SIM_HOST / "fio" / "manifest.json").write_text(json.dumps(doc))
    return true_loss, lv - lb


def write_sessions_only_run(
    raw, rng, workloads, sd_session, sessions, reps, shift=0.0, sd_rep=0.005, jobs=1
):
    """A raw run of ``workloads * jobs`` cells of stacks plain and luks, each session its
    own level N(0, sd_session) per stack and cell, each repetition its own noise N(0, sd_rep),
    every value times exp(``shift``): two such runs differ by ``shift`` (a change of the system),
    their sessions by chance. Returns the log values per stack."""
    import json

    cells, n = workloads * jobs, sessions * reps
    logs = {}
    for stack in ("plain", "luks"):
        level = np.repeat(rng.normal(0, sd_session, (cells, sessions)), reps, axis=1)
        logs[stack] = 18 + shift + level + rng.normal(0, sd_rep, (cells, n))
    write_raw_reps(raw, logs, [range(1, n + 1)] * workloads, jobs)
    runs = [
        {"rep": k, "stack": s, "workload": sim_workload(w), "session": f"s{(k - 1) // reps}"}
        | {"path": f"fio/{s}/{sim_workload(w)}/rep{k}.json", "status": "ok"}
        for s in logs
        for w in range(workloads)
        for k in range(1, n + 1)
    ]
    doc = {"run": raw.name, "host": SIM_HOST, "sessions": sessions, "runs": runs}
    (raw / SIM_HOST / "fio" / "manifest.json").write_text(json.dumps(doc))
    return logs


def write_cpu_run(
    raw, rng, hosts, cells, pairs, per_round, sd_idle=0.005, background=0.04, looks=1
):
    """A raw run of ``hosts`` hosts, one session each, with CPU sidecars and idle samples, for the
    CPU cost's intervals (an idle sample serves every cell of its host: hosts are the independent
    replicates of the baseline's error).

    Cell c: plain moves ``exp(18)`` B/s, luks 80 % of it; the true net CPU per GiB is
    U(0.3, 0.6) s on plain and 2-5 times that on luks (dm-crypt's AES work beside a plain
    device's: a small baseline), each run's own net CPU off by exp(N(0, 0.03)). Every sidecar
    counts the box's own load too (``background`` CPU-s/s over the run's 6.2 s, jitter sd
    0.005 s); an idle sample of 2 s measures that rate off by N(0, ``sd_idle``). ``per_round``:
    one idle sample per round (pair), each run naming its own, as the runner records them now;
    else one per session (``cpu_idle_baseline`` only, as before), or with ``looks`` > 1 one per
    look of a sequential design (a session record per look, pairs split evenly, one stack-up).

    Returns (true increase % of CPU per GiB, true added CPU s per GiB), shape (hosts, cells)."""
    out = [
        _write_cpu_host(raw, f"h{h:03d}", rng, cells, pairs, per_round, sd_idle, background, looks)
        for h in range(hosts)
    ]
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def _idle_samples(rate, cpus: int) -> list[dict]:
    """Idle samples of 2 s measuring ``rate`` (one per round)."""
    return [
        {
            "interval_s": 2.0,
            "busy_s": 2.0 * r,
            "busy_pct": 100 * r / cpus,
            "delta_s": {"system": 1.2 * r},
            "started": f"2026-01-01T00:{k // 60:02d}:{k % 60:02d}Z",
            "round": k + 1,
        }
        for k, r in enumerate(rate)
    ]


def _write_cpu_host(raw, host, rng, cells, pairs, per_round, sd_idle, background, looks=1):
    import json
    from pathlib import Path

    interval, cpus = 6.2, 2
    per_gib, factor = rng.uniform(0.3, 0.6, cells), rng.uniform(2.0, 5.0, cells)
    count = pairs if per_round else looks
    samples = _idle_samples(background + rng.normal(0, sd_idle, count), cpus)
    runs = []
    arms = (("plain", np.exp(18), per_gib), ("luks", 0.8 * np.exp(18), per_gib * factor))
    for stack, bw, truth in arms:
        jobs = [_fio_job("j0", float(bw), c + 1) for c in range(cells)]
        for job in jobs:
            job["read"]["io_kbytes"] = job["read"]["io_bytes"] // 1024  # fio 3: bytes
        net = truth[:, None] * jobs[0]["read"]["io_bytes"] / 2**30
        net = net * np.exp(rng.normal(0, 0.03, (cells, pairs)))
        busy = net + background * interval + rng.normal(0, 0.005, (cells, pairs))
        for c in range(cells):
            folder = Path(raw) / host / "fio" / stack / sim_workload(c)
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(1, pairs + 1):
                doc = {"fio version": "fio-3.36", "jobs": [jobs[c]]}
                (folder / f"rep{k}.json").write_text(json.dumps(doc))
                b = float(busy[c, k - 1])
                car = {"interval_s": interval, "busy_s": b, "busy_pct": 50 * b / interval}
                car["delta_s"] = {"system": 0.6 * b}
                car |= {"idle": samples[k - 1]} if per_round else {}
                (folder / f"rep{k}.cpu.json").write_text(json.dumps(car))
                entry = {"rep": k, "round": k, "stack": stack, "workload": sim_workload(c)}
                entry |= {"path": f"fio/{stack}/{sim_workload(c)}/rep{k}.json", "status": "ok"}
                runs.append(entry | ({"cpu_idle_sample": k - 1} if per_round else {}))
    doc = {"run": "sim", "host": host, "sessions": 1, "started": "2026-01-01T00:00:00Z"}
    doc |= {"cpu_idle_baseline": samples[0], "runs": runs, "session": "s0"}
    doc |= {"cpu_idle_samples": samples} if per_round else {}
    (Path(raw) / host / "fio" / "manifest.json").write_text(json.dumps(doc))
    if looks > 1 and not per_round:
        (Path(raw) / host / "fio" / "sessions").mkdir()
        look_of = {k: (k - 1) * looks // pairs for k in range(1, pairs + 1)}
        for j in range(looks):
            record = doc | {"cpu_idle_baseline": samples[j], "started": samples[j]["started"]}
            record["runs"] = [r for r in runs if look_of[r["rep"]] == j]
            path = Path(raw) / host / "fio" / "sessions" / f"look{j}.json"
            path.write_text(json.dumps(record))
    return 100 * (factor - 1), per_gib * (factor - 1)


def fleet_tables(processed, out, n_hosts: int, seed: int = 0):
    """A fleet of ``n_hosts`` hosts (``h0000``, ``h0001``, ...) from the processed tables of a
    one-host run in ``processed``: every table with a ``host`` column repeated once per host with
    the host renamed, each host's loss rows shifted by a host's own offset (effect and interval
    together, up to +-4 points; the decisions stay the source's). Synthetic processed tables for
    the publishing steps (figures, paper) at fleet scale: no statistic is recomputed. Returns
    ``out``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from luksbench.analysis.paper_numbers import write_paper_numbers

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hosts = [f"h{k:04d}" for k in range(n_hosts)]
    shift = np.random.default_rng(seed).uniform(-4, 4, n_hosts)
    for path in sorted(Path(processed).glob("*.parquet")):
        table = pd.read_parquet(path)
        if "host" in table.columns and len(table):
            table = _per_host(table, hosts, shift if path.stem in ("loss", "cpu_loss") else None)
        pq.write_table(pa.Table.from_pandas(table, preserve_index=False), out / path.name)
    write_paper_numbers(out)
    return out


def _per_host(table: pd.DataFrame, hosts: list[str], shift) -> pd.DataFrame:
    """``table`` once per host, the host renamed (and ``shift[k]`` added to host k's effects)."""
    n = len(table)
    whole = table.iloc[np.tile(np.arange(n), len(hosts))].reset_index(drop=True)
    names = np.repeat(np.array(hosts, dtype=object), n)
    for column in ("host", "hostname", "host_dir", "fio_hostname"):
        if column in whole.columns:
            whole[column] = names
    if shift is not None:
        offset = np.repeat(shift, n)
        for column in ("effect_pct", "ci_low", "ci_high", "selection_ci_low", "selection_ci_high"):
            whole[column] = whole[column].astype(float) + offset
    return whole


# ------------------------------------------------------------ counting against the truth put in

# The throughput regions' boundaries (loss %): the truths the certainty tests put cells at.
BOUNDARIES = np.array([-20.0, -5.0, 5.0, 20.0])


def luksbench(*args):
    """``luksbench ARGS`` through the CLI's entry point in this process (no interpreter start);
    fails with its stderr unless it returns 0."""
    import contextlib
    import io
    import subprocess

    from luksbench.cli import main

    argv, out, err = [str(a) for a in args], io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    return subprocess.CompletedProcess(["luksbench", *argv], code, out.getvalue(), err.getvalue())


def cli(*args) -> str:
    """The stdout of ``luksbench ARGS`` (:func:`luksbench`)."""
    return luksbench(*args).stdout


def loss_csv(raw, *args) -> pd.DataFrame:
    """``luksbench loss RAW ...`` as a table, rows in cell order (workload, then job slot)."""
    import io

    table = pd.read_csv(io.StringIO(luksbench("loss", raw, *args).stdout))
    return table.sort_values(["iodepth", "job_slot", "metric"]).reset_index(drop=True)


def covers(rows: pd.DataFrame, true_loss: np.ndarray) -> np.ndarray:
    """Whether each row's [ci_low, ci_high] holds its true loss (rows and truths aligned)."""
    return ((rows["ci_low"] <= true_loss) & (true_loss <= rows["ci_high"])).to_numpy()


def wrong_decision(decisions: pd.Series, true_loss: np.ndarray) -> np.ndarray:
    """A decided region (not undecided) that does not hold the true loss."""
    import math

    lower, upper = stats.DEFAULT_DECISION_REGIONS["throughput"]
    regions = {
        "negligible": (-lower, lower),
        "moderate": (lower, upper),
        "material": (upper, math.inf),
        "moderate gain": (-upper, -lower),
        "material gain": (-math.inf, -upper),
    }
    out = []
    for dec, truth in zip(decisions, true_loss, strict=True):
        a, b = regions.get(dec, (-math.inf, math.inf))
        out.append(not a <= truth <= b)
    return np.array(out)


def sequential_run(
    tmp_path, rng, sd_d, true_loss, *extra, min_pairs=3, cap=12, rho=None, flagged=0.0
):
    """Rounds until ``luksbench next`` says done; returns (loss rows, targets doc, rounds).
    ``rho``: d drifts as an AR(1) series with this coefficient across each cell's pairs.
    ``flagged``: this share of runs (each stack's, drawn after the noise) is 30 % slow and fio
    reports its steady state not attained; then room for 2 ``cap`` pairs (with replacements)."""
    import io
    import json
    import math

    cells, room = sd_d.size, 2 * cap if flagged else cap
    if rho is None:
        lb, lv = simulate_logs(rng, cells, room, sd_d / math.sqrt(2), np.log1p(-true_loss / 100), 0)
    else:
        lb, lv = drifting_logs(rng, cells, room, sd_d, np.log1p(-true_loss / 100), rho)
    draw = (lambda: rng.random(lb.shape) < flagged) if flagged else lambda: lb < -np.inf
    unsettled = {s: draw() for s in ("plain", "luks")}
    lb, lv = lb + 18 + np.log(0.7) * unsettled["plain"], lv + 18 + np.log(0.7) * unsettled["luks"]
    raw, logs = tmp_path / "seq", {"plain": lb, "luks": lv}
    write_raw_reps(raw, logs, [range(1, min_pairs + 1)] * cells, unsettled=unsettled)
    targets = raw / "sim" / "fio" / "targets.json"
    rounds = 0
    while rounds <= room:
        rounds += 1
        out = cli(
            *("next", raw, "--host", "sim", "--baseline", "plain", "--variant", "luks"),
            *("--min-pairs", min_pairs, "--max-pairs", cap, "--out", targets, *extra),
        )
        doc = json.loads(targets.read_text())
        if doc["done"]:
            assert out.rstrip().endswith(f"done; wrote {targets}")
            break
        pairs = [doc["pairs"][f"randread-4k-qd{w + 1}"] for w in range(cells)]
        write_raw_reps(raw, logs, [range(1, n + 1) for n in pairs], unsettled=unsettled)
    loss = pd.read_csv(io.StringIO(cli("loss", raw, "--metric", "bw_bytes")))
    return loss.sort_values("iodepth").reset_index(drop=True), doc, rounds


def sequential_sessions_run(
    tmp_path, rng, sd_d, true_loss, rho, sessions=3, sd_session=0.5, min_pairs=3, cap=12
):
    """The sequential design over ``sessions`` sessions, round by round through ``luksbench
    next`` until done, then ``luksbench loss``; returns (loss rows, targets doc, rounds).

    Each round measures one pair of every continuing cell in the next session (round r in
    session (r - 1) mod k, so a cell's pair r is its round r): d drifts as AR(1) with
    coefficient ``rho`` across the rounds (:func:`drifting_logs`), and each session shifts a
    cell's d by its own N(0, ``sd_session`` sd(d)). The manifest records every result's session
    and the planned ``sessions``, as the runner writes them."""
    import io
    import json

    cells = sd_d.size
    lb, lv = drifting_logs(rng, cells, cap, sd_d, np.log1p(-true_loss / 100), rho)
    slot = np.arange(cap) % sessions
    shift = rng.normal(0, 1, (cells, sessions)) * (sd_session * sd_d)[:, None]
    logs = {"plain": lb + 18, "luks": lv + 18 + shift[:, slot]}
    raw = tmp_path / "seqsessions"
    targets = raw / SIM_HOST / "fio" / "targets.json"
    pairs, rounds, doc = [1] * cells, 0, {}
    while rounds <= 3 * cap:  # a stopped cell may resume when the pooled drift changes
        rounds += 1
        write_raw_reps(raw, logs, [range(1, n + 1) for n in pairs])
        _sessions_manifest(raw, pairs, sessions)
        cli(
            *("next", raw, "--host", SIM_HOST, "--baseline", "plain", "--variant", "luks"),
            *("--min-pairs", min_pairs, "--max-pairs", cap, "--out", targets),
        )
        doc = json.loads(targets.read_text())
        if doc["done"]:
            break
        pairs = [doc["pairs"][sim_workload(w)] for w in range(cells)]
    loss = pd.read_csv(io.StringIO(cli("loss", raw, "--metric", "bw_bytes")))
    return loss.sort_values("iodepth").reset_index(drop=True), doc, rounds


def _sessions_manifest(raw, pairs, sessions: int) -> None:
    """The manifest of a run whose pair k was measured in session (k - 1) mod ``sessions``."""
    import json

    runs = [
        {"rep": k, "stack": stack, "workload": sim_workload(w), "session": f"s{(k - 1) % sessions}"}
        | {"path": f"fio/{stack}/{sim_workload(w)}/rep{k}.json", "status": "ok"}
        for stack in ("plain", "luks")
        for w, n in enumerate(pairs)
        for k in range(1, n + 1)
    ]
    doc = {"run": "sim", "host": SIM_HOST, "sessions": sessions, "runs": runs}
    path = raw / SIM_HOST / "fio" / "manifest.json"
    path.unlink(missing_ok=True)
    path.write_text(json.dumps(doc))
