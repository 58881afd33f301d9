"""Preconditioning after the SNIA Solid State Storage Performance Test Specification: discard,
fill sequentially (twice the capacity), then steady-state rounds until :func:`snia_steady_state`
finds the last ``window`` rounds steady. Standard library only.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from luksbench.formats.fio import FioParseError, fio_output_document
from luksbench.testbox.planbuild import precondition_options
from luksbench.testbox.sysutil import Progress, TestboxError, heartbeat, run_tool, whole_disk
from luksbench.testbox.sysutil import log as default_log

# A fill of a large disk takes hours and fio says nothing until it ends: how often to say it runs.
FILL_HEARTBEAT_S = 300


def blkdiscard_argv(device: str | Path) -> list[str]:
    """Discard every sector. No ``--force``: blkdiscard then opens the device exclusively, so it
    refuses a device that is mounted or held by another kernel subsystem."""
    return ["blkdiscard", str(device)]


def _fio_argv(name, device, rw, bs, iodepth, ioengine, size_bytes, *options: str) -> list[str]:
    """One fio job of direct I/O over ``size_bytes`` of ``device``, JSON output."""
    argv = ["fio", "--output-format=json", f"--name={name}", f"--filename={device}", f"--rw={rw}"]
    argv += [f"--bs={bs}", f"--iodepth={iodepth}", f"--ioengine={ioengine}", "--direct=1"]
    return [*argv, f"--size={size_bytes}", *options, "--numjobs=1", "--group_reporting"]


def fill_argv(device, size_bytes: int, passes=2, bs="128k", ioengine="libaio") -> list[str]:
    """Sequential direct writes over ``size_bytes``, ``passes`` times (SNIA: 2x capacity)."""
    name, iodepth = "precondition-fill", 32
    return _fio_argv(name, device, "write", bs, iodepth, ioengine, size_bytes, f"--loops={passes}")


def steady_state_round_argv(
    device: str | Path,
    size_bytes: int,
    round_s: float,
    *,
    rw: str = "randwrite",
    bs: str = "4k",
    iodepth: int = 32,
    ioengine: str = "libaio",
    deviation_pct: float = 10.0,
) -> list[str]:
    """One steady-state round: ``round_s`` seconds of ``rw`` over the whole device.

    fio's steady-state tracking over the whole round only makes it record per-second IOPS (its
    window fills at the round's end: it never cuts a round short). Random offsets differ per round
    (``randrepeat=0``) and cover the device uniformly (``norandommap``), as SNIA's do."""
    seconds = max(1, round(round_s))
    timing = ["--time_based", f"--runtime={seconds}s", "--randrepeat=0", "--norandommap"]
    ss = [f"--steadystate=iops:{deviation_pct:g}%", f"--steadystate_duration={seconds}s"]
    return _fio_argv("precondition-ss", device, rw, bs, iodepth, ioengine, size_bytes, *timing, *ss)


def snia_steady_state(
    values: list[float], window: int = 5, range_pct: float = 20.0, slope_pct: float = 10.0
) -> dict:
    """SNIA PTS steady-state check over the last ``window`` rounds of ``values`` (e.g. IOPS):
    max - min <= ``range_pct`` % of the window mean, and the least-squares line moves at most
    ``slope_pct`` % of the mean across the window. Returns every number used and ``steady``."""
    if window < 2:
        raise ValueError(f"window must be at least 2, not {window}")
    values = [float(v) for v in values]
    result: dict = {"rounds": len(values), "window": window}
    result.update(range_pct_limit=range_pct, slope_pct_limit=slope_pct, first_round=None)
    result.update(dict.fromkeys(("window_values", "mean", "range", "range_limit")), range_ok=False)
    result.update(dict.fromkeys(("slope", "intercept", "excursion", "excursion_limit")))
    result.update(slope_ok=False, steady=False, reason=None)
    if len(values) < window:
        result["reason"] = f"{len(values)} round(s), the window needs {window}"
        return result
    w = values[-window:]
    mean = sum(w) / window
    x_mean = (window - 1) / 2
    sxx = sum((i - x_mean) ** 2 for i in range(window))
    slope = sum((i - x_mean) * (v - mean) for i, v in enumerate(w)) / sxx
    spread = max(w) - min(w)
    excursion = abs(slope) * (window - 1)
    result.update(
        first_round=len(values) - window + 1,
        window_values=w,
        mean=mean,
        range=spread,
        range_limit=range_pct / 100 * mean,
        slope=slope,
        intercept=mean - slope * x_mean,
        excursion=excursion,
        excursion_limit=slope_pct / 100 * mean,
    )
    if mean <= 0:
        result["reason"] = "window mean is not positive"
        return result
    result["range_ok"] = spread <= result["range_limit"]
    result["slope_ok"] = excursion <= result["excursion_limit"]
    result["steady"] = result["range_ok"] and result["slope_ok"]
    failed = []
    if not result["range_ok"]:
        failed.append(f"range {100 * spread / mean:.1f}% of mean > {range_pct:g}%")
    if not result["slope_ok"]:
        failed.append(f"slope excursion {100 * excursion / mean:.1f}% of mean > {slope_pct:g}%")
    result["reason"] = "; ".join(failed) if failed else "range and slope within limits"
    return result


def discard_support(device: str | Path) -> tuple[bool, str]:
    """(supported, why not): a block device whose queue advertises discard (discard_max_bytes)."""
    try:
        st = os.stat(device)
    except OSError as exc:
        return False, f"cannot stat {device}: {exc.strerror}"
    if not stat.S_ISBLK(st.st_mode):
        return False, f"{device} is not a block device"
    sys_dir = Path(f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
    queue = whole_disk(sys_dir.resolve()) / "queue"  # a partition's queue is its disk's
    try:
        max_bytes = int((queue / "discard_max_bytes").read_text())
    except (OSError, ValueError) as exc:
        return False, f"cannot read {queue / 'discard_max_bytes'}: {exc}"
    if max_bytes == 0:
        return False, f"{device} advertises no discard (queue/discard_max_bytes is 0)"
    with_holders = sorted(os.listdir(sys_dir / "holders")) if (sys_dir / "holders").is_dir() else []
    if with_holders:
        # Another stack's layer sits on it: a discard would erase that layer too.
        return False, f"{device} is held by {', '.join(with_holders)} (a layer of another stack)"
    return True, ""


def _fio_job(proc: subprocess.CompletedProcess, what: str) -> dict:
    """The single job of fio's JSON output; TestboxError when unreadable or the job failed."""
    try:
        job = fio_output_document(proc.stdout.encode(), what, warn=lambda _m: None)["jobs"][0]
    except (FioParseError, KeyError, IndexError) as exc:
        stderr = proc.stderr.strip()
        raise TestboxError(f"{what}: fio output unreadable ({exc}); stderr: {stderr}") from exc
    if job.get("error"):
        raise TestboxError(f"{what}: fio job error {job['error']}; stderr: {proc.stderr.strip()}")
    return job


def _io(job: dict) -> dict:
    dirs = [job.get(d, {}) for d in ("read", "write")]
    total = {k: sum(d.get(k, 0) for d in dirs) for k in ("iops", "bw_bytes", "io_bytes")}
    return {**total, "iops": round(float(total["iops"]), 3)}


def precondition(
    device: str | Path,
    size_bytes: int,
    opts: dict,
    ioengine: str = "libaio",
    log: Callable[[str], None] = default_log,
) -> dict:
    """Discard, fill and steady-state ``device`` (a block device or file; its contents are
    destroyed); returns the record. Not reaching steady state is recorded, not raised; a failing
    tool raises TestboxError with its stderr."""
    o = precondition_options(opts)
    device = str(device)
    try:
        mode = os.stat(device).st_mode
    except OSError as exc:
        # fio would create a missing file: a mistyped /dev path would fill RAM-backed /dev.
        raise TestboxError(f"precondition: {device}: {exc.strerror}") from exc
    if not (stat.S_ISBLK(mode) or stat.S_ISREG(mode)):
        raise TestboxError(f"precondition: {device} is neither a block device nor a file")
    t_start = time.monotonic()
    record: dict = {"device": device, "size_bytes": int(size_bytes), "ioengine": ioengine}
    record.update(options=o, **dict.fromkeys(("discard", "fill", "steady_state", "seconds")))
    if not o["enabled"]:
        record["seconds"] = 0.0
        return record

    if o["discard"]:
        supported, why = discard_support(device)
        if supported:
            argv = blkdiscard_argv(device)
            t0 = time.monotonic()
            try:
                run_tool(argv, f"precondition {device}: discard", timeout=3600)
            except TestboxError as exc:
                if "not supported" not in str(exc):
                    raise
                supported, why = False, str(exc)
            else:
                took = round(time.monotonic() - t0, 3)
                record["discard"] = {"status": "done", "argv": argv, "seconds": took}
                log(f"  {device}: discarded in {took:.1f} s")
        if not supported:
            record["discard"] = {"status": f"discard unsupported: {why}"}
            log(f"  {device}: discard unsupported: {why}")
    else:
        record["discard"] = {"status": "not requested"}

    passes, bs = o["fill_passes"], o["block_size"]
    argv = fill_argv(device, size_bytes, passes, bs, ioengine)
    log(f"  {device}: filling {passes} x {size_bytes / 2**20:.0f} MiB (sequential {bs} writes)")
    t0 = time.monotonic()
    what = f"precondition {device}: fill"
    with heartbeat(f"{device}: filling", FILL_HEARTBEAT_S, log):
        io = _io(_fio_job(run_tool(argv, what, timeout=7 * 24 * 3600), what))
    took = round(time.monotonic() - t0, 3)
    fill = {"argv": argv, "passes": passes, "block_size": bs, "io_bytes": io["io_bytes"]}
    record["fill"] = {**fill, "bw_bytes": io["bw_bytes"], "seconds": took}
    log(f"  {device}: filled in {took:.1f} s")

    if o["steady_state"]:
        record["steady_state"] = _steady_state_rounds(device, size_bytes, o, ioengine, log)
    record["seconds"] = round(time.monotonic() - t_start, 3)
    return record


def _steady_state_rounds(
    device: str, size_bytes: int, o: dict, ioengine: str, log: Callable[[str], None]
) -> dict:
    rounds: list[dict] = []
    limits = (o["ss_window"], o["ss_range_pct"], o["ss_slope_pct"])
    check = snia_steady_state([], *limits)
    t0 = time.monotonic()
    opts = {"rw": o["ss_rw"], "bs": o["ss_bs"], "iodepth": o["ss_iodepth"], "ioengine": ioengine}
    opts["deviation_pct"] = o["ss_range_pct"] / 2
    argv = steady_state_round_argv(device, size_bytes, o["ss_round_s"], **opts)
    progress = Progress(o["ss_max_rounds"], o["ss_round_s"])
    for n in range(1, o["ss_max_rounds"] + 1):
        what = f"precondition {device}: steady-state round {n}"
        t_round = time.monotonic()
        job = _fio_job(run_tool(argv, what, timeout=o["ss_round_s"] + 600), what)
        fio_ss = job.get("steadystate") or {}
        rounds.append({"round": n, **_io(job), "seconds": round(time.monotonic() - t_round, 3)})
        rounds[-1]["per_second_iops"] = (fio_ss.get("data") or {}).get("iops")
        keys = ("ss", "attained", "criterion", "max_deviation")
        rounds[-1]["fio_steadystate"] = {k: fio_ss.get(k) for k in keys}
        check = snia_steady_state([r["iops"] for r in rounds], *limits)
        iops = rounds[-1]["iops"]
        status = f"{progress.step(rounds[-1]['seconds'])} if it never turns steady"
        log(f"  {device}: steady-state round {n}: {iops:.0f} IOPS ({check['reason']}); {status}")
        if check["steady"]:
            break
    verdict = f"not steady after {len(rounds)} rounds (max_rounds): {check['reason']}"
    if check["steady"]:
        verdict = f"steady after {len(rounds)} rounds (rounds {check['first_round']}-{len(rounds)})"
    log(f"  {device}: {verdict}")
    result = {"argv": argv, "rounds": rounds, "check": check, "steady": check["steady"]}
    return {**result, "verdict": verdict, "seconds": round(time.monotonic() - t0, 3)}
