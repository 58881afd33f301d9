"""What a plan will do, in words, before anything runs (``luksbench plan`` and the dry run): the
matrix, its fio runs and time, and every destructive action in the order stack-up takes them.
Standard library only.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from pathlib import Path

from luksbench.formats.layout import bs_label, bs_to_bytes
from luksbench.testbox import ceph, safety
from luksbench.testbox.jobs import IO_URING_ONLY
from luksbench.testbox.planbuild import (
    SECTOR_BYTES,
    cell_options,
    precondition_options,
    walk_layers,
    workloads,
)


def layer_layout(layer, devices: dict) -> str:
    """One line for a layer tree as configured, e.g. ``luks aes-xts-plain64 over md raid0 [d0, d1]``."""
    if isinstance(layer, str):
        dev = devices.get(layer, {})
        return f"{layer} ({dev['path']})" if "path" in dev else f"{layer} (scratch file)"
    kind = layer["kind"]
    if kind in ("plain", "loop"):
        return f"{kind} (own scratch file)"
    if kind == "luks":
        head = f"luks {layer['cipher']} {layer['key_bits']}-bit key {layer['luks_type']}"
        if int(layer["sector_size"]) != SECTOR_BYTES:
            head += f" sector {layer['sector_size']}"
        if layer["perf_flags"]:
            head += f" flags {','.join(layer['perf_flags'])}"
        if layer["allow_discards"]:
            head += " allow-discards"
    elif kind == "md":
        head = f"md raid{layer['level']} chunk {layer['chunk_kib']}K"
    elif kind == "fs":
        head = f"{layer['fstype']} file"
    elif kind in ("raw", "external"):
        return f"{kind} {layer_layout(layer['device'], devices)}"
    elif kind == "linear":
        return f"dm-linear over the luks payload region of stack {layer['like']}"
    elif ceph.is_cluster_layer(layer):
        head = ceph.layer_head(layer)
    elif kind == "rbd":
        return f"rbd {layer['pool']}/{layer['image']} (client {layer['client']})"
    if "members" in layer:
        return f"{head} [{', '.join(layer_layout(m, devices) for m in layer['members'])}]"
    if "over" in layer:
        return f"{head} over {layer_layout(layer['over'], devices)}"
    return f"{head} over its own scratch file"


def _actions(plan: dict, name: str) -> list[str]:
    """Destructive actions of one stack, bottom-up."""
    if first := ceph.shared_osd_arm(plan, name):
        return [f"nothing more: it measures the OSD(s), pool and image built for stack {first}"]
    devices = plan["devices"]
    run = plan["run"]
    out: list[str] = []

    def target(ref) -> str:
        if isinstance(ref, str):
            dev = devices[ref]
            return f"DISK devices.{ref} {dev['path']}" if "path" in dev else f"loop over {ref}"
        return f"the {ref['kind']} layer"

    for _, layer in reversed(list(walk_layers(plan["stacks"][name], name))):
        if not isinstance(layer, dict):
            continue
        kind = layer["kind"]
        if kind in ("plain", "loop") or (kind == "luks" and "over" not in layer):
            size = layer.get("size_mib") or plan["device_size_mib"]
            img = f"luksbench-{run}-{name}.img"
            out.append(f"create scratch file {img} ({size} MiB) and a loop device")
        if kind == "luks":
            below = target(layer["over"]) if "over" in layer else "its scratch file"
            out.append(f"luksFormat {below} (destroys its data), cryptsetup open")
        elif kind == "md":
            members = ", ".join(target(m) for m in layer["members"])
            level = layer["level"]
            out.append(f"mdadm --create RAID-{level} over {members} (destroys their data)")
        elif kind == "fs":
            fstype, below = layer["fstype"], target(layer["over"])
            out.append(f"mkfs.{fstype} {below} (destroys its data), mount")
        elif kind == "linear":
            out.append(f"dmsetup create dm-linear over the luks payload of stack {layer['like']}")
        elif ceph.is_cluster_layer(layer):
            out += ceph.layer_actions(layer, target)
        elif kind in ("raw", "external"):
            out.append(f"fio writes directly to {target(layer['device'])}")
    return out


def pattern_fio_text(pattern: dict) -> str:
    """A pattern's fio options in words and as fio options."""
    fio = pattern["fio"]
    parts = [fio["ioengine"], "O_DIRECT" if fio["direct"] else "buffered (page cache)"]
    if fio["sync"]:
        parts.append("O_SYNC writes (sync=1)")
    if pattern["io_bs"]:
        parts.append(
            f"each block (the cell's bs) as {bs_label(pattern['io_bs'])} I/Os at sequential "
            "offsets, one random offset per block for random rw "
            "(rw=<rw>:<bs/io_bs>, rw_sequencer=sequential, blockalign=<bs>)"
        )
    if pattern["fsync_per_block"]:
        parts.append("fsync after every block of writes (fsync=<I/Os per block>)")
    if pattern.get("rate_pct"):
        parts.append(
            f"every stack at {pattern['rate_pct']:g} % of the slower stack's IOPS in an "
            "unthrottled pilot run (rate_iops, shared by the jobs)"
        )
    return ", ".join(parts)


def jobs_text(cell: dict) -> str:
    """A cell's fio jobs, their pinning and the CPU they may need, in words."""
    n, cpus = cell["numjobs"], cell["cpus_allowed"]
    pinned = f"on CPUs {cpus} ({cell['cpus_allowed_policy']})" if cpus else "unpinned"
    pinned = "on the device's NUMA node" if cell["numa_pin"] and not cpus else pinned
    extras = "".join(f", {o}" for o in IO_URING_ONLY if cell[o])
    return (
        f"{n} job{'s' if n > 1 else ''} {pinned}{extras}; expected CPU need: up to {n} "
        f"CPU{'s' if n > 1 else ''} for fio (one per job) besides the kernel's I/O and crypto "
        f"work, of {os.cpu_count()} here"
    )


def _matrix_text(matrix: dict) -> str:
    sizes = sorted(matrix["bs"], key=bs_to_bytes)
    bs = bs_label(sizes[0]) if len(sizes) == 1 else f"{bs_label(sizes[0])}..{bs_label(sizes[-1])}"
    return (
        f"{'/'.join(matrix['rw'])} x {bs} ({len(sizes)} sizes) x "
        f"qd{'/'.join(str(q) for q in matrix['iodepth'])}"
    )


def describe_plan(
    plan: dict,
    check_devices: bool = False,
    components: tuple[float, float] | None = None,
    session_cost_s: float = 600.0,
) -> list[str]:
    """The plan in lines: header with the run count, sessions advice (:func:`sessions_advice`),
    stacks, destructive actions, cells."""
    cells = workloads(plan)
    stacks = list(plan["stacks"])
    reps, sessions = int(plan["repetitions"]), int(plan["sessions"])
    runs = len(cells) * len(stacks) * reps * sessions
    fio = plan["fio"]
    seconds = runs * (int(fio["runtime_s"]) + int(fio["ramp_time_s"]))
    rep_word = "repetitions" + (" (adaptive pilot)" if plan["adaptive"] else "")
    lines = [
        f"luksbench plan: run {plan['run']} on {plan['host']}: {len(stacks)} stacks x "
        f"{len(cells)} cells x {reps} {rep_word}"
        + (f" x {sessions} sessions (each its own stack-up)" if sessions > 1 else "")
        + f" = {runs} fio runs",
        f"  fio time: {seconds / 3600:.1f} h ({seconds} s of runtime + ramp), backend "
        f"{plan['backend']}, baseline {plan['baseline']}",
    ]
    lines += sessions_advice(plan, components, session_cost_s)
    main_cell = next((w for w in cells if not w.pattern), None)
    if main_cell:
        lines.append(f"  fio jobs: {jobs_text(cell_options(plan, main_cell))}")
    adaptive = plan["adaptive"] or {}
    if adaptive.get("mode") == "sequential":
        worst = seconds / reps * int(adaptive["max_pairs"])
        budget = float(adaptive["budget_h"])
        lines.append(
            f"  sequential: rounds until every cell is decided; budget "
            f"{f'{budget:g} h' if budget else 'none'}, worst case {worst / 3600:.2f} h "
            f"({adaptive['max_pairs']} pairs of every cell)"
        )
        if 0 < budget * 3600 < seconds:  # the first round measures min_pairs whatever the budget
            lines.append(
                f"  WARNING: the first round alone ({seconds / 3600:.2f} h, {reps} pairs of every "
                f"cell) exceeds adaptive.budget_h ({budget:g} h): no cell gets a further pair"
            )
    patterns = plan["patterns"]
    if patterns:
        main = sum(1 for w in cells if not w.pattern)
        lines.append(
            f"  main matrix: {main} cells ({_matrix_text(plan['matrix'])}), fio: "
            f"{fio['ioengine']}, "
            f"{'O_DIRECT' if fio['direct'] else 'buffered (page cache)'}"
        )
    for name, pattern in patterns.items():
        count = sum(1 for w in cells if w.pattern == name)
        lines.append(f"  pattern {name}: {count} cells ({_matrix_text(pattern['matrix'])})")
        if pattern["description"]:
            lines.append(f"    {pattern['description']}")
        lines.append(f"    fio: {pattern_fio_text(pattern)}")
        first = next(w for w in cells if w.pattern == name)
        lines.append(f"    fio jobs: {jobs_text(cell_options(plan, first))}")
    devices = plan["devices"]
    lines += [f"  stack {name}: {layer_layout(plan['stacks'][name], devices)}" for name in stacks]
    for name, dev in devices.items():
        if "path" in dev:
            lines.append(f"  device {name}: {dev['path']} (real disk: WILL BE OVERWRITTEN)")
        else:
            lines.append(f"  device {name}: scratch file of {dev['size_mib']} MiB on a loop device")
    lines += ceph.plan_lines(plan)
    lines.append("  destructive actions, in order:")
    lines += [f"    {name}: {action}" for name in stacks for action in _actions(plan, name)]
    pre = precondition_options(plan["precondition"])
    if pre["enabled"]:
        what = ["blkdiscard" if pre["discard"] else None, f"{pre['fill_passes']}x sequential fill"]
        if pre["steady_state"]:
            what.append("steady-state rounds")
        steps = ", ".join(w for w in what if w)
        lines.append(f"    every stack: precondition ({steps}) of its top device")
    lines.append("    every stack: fio writes in the write cells of the matrix")
    lines.append(
        "    stack-down: close, stop and remove all of it; wipefs our signatures off real disks"
    )
    real = {n: d for n, d in devices.items() if "path" in d} if check_devices else {}
    for name, spec in real.items():
        try:
            desc = safety.check_device(name, spec)
        except safety.SafetyError as exc:
            lines.append(f"  REFUSED {exc}")
        else:
            blank = "blank" if not desc["signatures"] else "signatures confirmed by wipe_serial"
            lines.append(
                f"  checked devices.{name}: {desc['resolved']} serial {desc.get('serial')} "
                f"{desc['size_bytes'] / 2**30:.1f} GiB, {blank}"
            )
    return lines + [f"  cell {w.id}" for w in cells]


#: the interval half-width (points) the sessions advice aims at, unless the plan sets one
ADVICE_HALF_WIDTH_PCT = 2.0


def read_components(loss_csv: Path, metric: str = "bw_bytes") -> tuple[float, float]:
    """(between-session variance, within-session variance) of d: the medians over the rows of an
    earlier run's ``loss.csv`` (``metric``'s rows, else all) that estimated both; ValueError
    naming the file when none did."""
    with open(loss_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    parts = []
    for want in (metric, None):
        for row in rows:
            try:
                between, within = (
                    float(row[k]) for k in ("sd_between_sessions", "sd_within_session")
                )
            except (KeyError, ValueError):
                continue
            if (want is None or row.get("metric") == want) and math.isfinite(between + within):
                parts.append((between**2, within**2))
        if parts:
            break
    if not parts:
        raise ValueError(
            f"{loss_csv}: no row with sd_between_sessions and sd_within_session (a run measured "
            "with sessions >= 2 and several pairs per session has them)"
        )
    return statistics.median(p[0] for p in parts), statistics.median(p[1] for p in parts)


def pairs_per_session(cost_session: float, cost_pair: float, var_session: float, var_pair: float):
    """Kalibera and Jones' cheapest pairs per session for a given precision:
    ``sqrt(cost_session / cost_pair * var_pair / var_session)``, at least 1 (inf: no session
    variance, one session of many pairs)."""
    if var_session <= 0:
        return math.inf
    return max(1.0, math.sqrt(cost_session / cost_pair * var_pair / var_session))


def _t975(df: int) -> float:
    """The 97.5 % quantile of Student's t (Cornish-Fisher from the normal's, within 1 % for
    df >= 2)."""
    z = statistics.NormalDist().inv_cdf(0.975)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def sessions_needed(var_session: float, var_pair: float, pairs: int, half_width_pct: float) -> int:
    """Fewest sessions k >= 3 whose t-interval over k session means of ``pairs`` pairs reaches
    ``half_width_pct`` (capped at 50)."""
    target = math.log1p(half_width_pct / 100)
    spread = math.sqrt(var_session + var_pair / pairs)
    return next((k for k in range(3, 51) if _t975(k - 1) * spread / math.sqrt(k) <= target), 50)


def sessions_advice(
    plan: dict, components: tuple[float, float] | None = None, session_cost_s: float = 600.0
) -> list[str]:
    """Lines on the plan's sessions: a warning at k = 2, and with ``components`` (between- and
    within-session variance of d, e.g. :func:`read_components`) the Kalibera-Jones allocation."""
    k, reps = int(plan["sessions"]), int(plan["repetitions"])
    lines = []
    if k == 2:
        lines.append(
            "  WARNING: sessions: 2 leaves each cell's sessions interval 1 degree of freedom of "
            "its own: the loss table borrows variance from the host's other cells (moderated), "
            "which holds only where cells vary alike; measure sessions >= 3"
        )
    if components is None:
        return lines
    var_session, var_pair = components
    cost_pair = len(plan["stacks"]) * len(workloads(plan)) * _run_seconds(plan)
    n = pairs_per_session(session_cost_s, cost_pair, var_session, var_pair)
    n_int = min(round(n), 50) if math.isfinite(n) else 50
    h = float((plan["adaptive"] or {}).get("target_half_width_pct") or ADVICE_HALF_WIDTH_PCT)
    need = sessions_needed(var_session, var_pair, n_int, h)
    lines.append(
        f"  sessions advice (Kalibera-Jones): session SD {math.sqrt(var_session):.4f}, pair SD "
        f"{math.sqrt(var_pair):.4f} of d; a session costs {session_cost_s:g} s (stack-up, "
        f"preconditioning), a pair of every cell {cost_pair:g} s: sqrt({session_cost_s:g}/"
        f"{cost_pair:g} x {var_pair:.3g}/{var_session:.3g}) = {n:.1f} -> {n_int} pairs per "
        f"session, {need} sessions for +-{h:g} % (the plan: {reps} pairs x {k} sessions)"
    )
    return lines


def _run_seconds(plan: dict) -> float:
    fio = plan["fio"]
    return float(fio["runtime_s"]) + float(fio["ramp_time_s"])
