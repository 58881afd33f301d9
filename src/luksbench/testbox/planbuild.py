"""The plan's meaning: building it from the config, checking it, its cells and the devices its
layers use. The record itself (keys, version, reading, writing) is :mod:`luksbench.formats.plan`;
each layer kind's keys, defaults and resolution are :mod:`luksbench.testbox.layers`.
"""

from __future__ import annotations

import json
from pathlib import Path

from luksbench.formats.envdoc import env_plan, read_env
from luksbench.formats.layout import PATTERN_NAME_RE, LayoutError, Workload, bs_to_bytes
from luksbench.formats.plan import (
    JOB_KEYS,
    PLAN_VERSION,
    Plan,
    PlanError,
    check_document,
    check_run_options,
    migrated_plan_document,
    plan_changes,
    read_plan,
    walk_layers,
    write_plan_file,
)
from luksbench.testbox import ceph
from luksbench.testbox.layers import NULL_CIPHERS as NULL_CIPHERS  # the test box imports these here
from luksbench.testbox.layers import PERF_FLAGS
from luksbench.testbox.layers import precondition_options as precondition_options
from luksbench.testbox.layers import resolve_devices as resolve_devices
from luksbench.testbox.layers import resolve_layer as resolve_layer
from luksbench.testbox.sysutil import TestboxError


def load_plan(path: Path) -> Plan:
    """A plan file's record, checked (PlanError names the file and the problem)."""
    plan = read_plan(path)
    check_plan(plan, source=str(path))
    return plan


def check_plan(plan: dict, source: str = "plan") -> None:
    """The whole plan, document keys first; PlanError names the first problem."""
    plan = migrated_plan_document(dict(plan), source)
    check_document(plan, source)
    check_stacks(plan, source)
    check_ceph_settings(plan, source)
    check_patterns(plan, source)
    check_block_sizes(plan, source)
    check_blocks_fit(plan, source)
    check_run_options(plan, source)
    check_job_options(plan["fio"], f"{source}: fio", plan["fio"])


def check_ceph_settings(plan: dict, source: str = "plan") -> None:
    """``ceph.daemon_modes`` is a mode list Ceph accepts and lets every arm of the run's cluster
    connect (PlanError names the key: a refused mode would make fio retry forever)."""
    problems = ceph.daemon_mode_problems(plan)
    if problems:
        raise PlanError(f"{source}: " + "; ".join(problems))


def first_layer(tree, kind: str) -> dict | None:
    """The first layer of ``kind`` in a layer tree (top first), or None."""
    layers = (lay for _, lay in walk_layers(tree, "") if isinstance(lay, dict))
    return next((lay for lay in layers if lay.get("kind") == kind), None)


def plan_layers(plan: dict):
    """Every layer (a dict) of every stack of the plan."""
    for name, stack in plan["stacks"].items():
        for _, layer in walk_layers(stack, name):
            if isinstance(layer, dict):
                yield layer


def baseline_first(plan: dict) -> list[str]:
    """The plan's stacks, baseline first, then the others in plan order (a backend's plan
    holding only the stacks beside Ceph arms on an existing cluster may hold none)."""
    base = plan["baseline"]
    return [*[base][: base in plan["stacks"]], *[s for s in plan["stacks"] if s != base]]


def device_uses(plan: dict) -> dict[str, list[tuple[str, str]]]:
    """Device name -> [(where, how)] for every reference in the stacks. ``how`` is the consumer:
    ``md``, ``fs`` and ``osd`` claim a device exclusively, and so does anything below them;
    ``luks``, ``linear`` and ``fio`` (raw/external arms) do not. An ``osd`` layer several Ceph
    arms share is one OSD: its layers count once, at its first arm."""
    uses: dict[str, list[tuple[str, str]]] = {}
    seen_osds: set[str] = set()
    for name, stack in plan["stacks"].items():
        # where -> (the exclusive claimer at or above that layer, its kind); a child's ``where``
        # is its parent's plus ".over" or ".members[i]"
        claims: dict[str, tuple[str | None, str]] = {}
        shared: list[str] = []  # the ``where`` of osd layers an earlier arm already counted
        for where, layer in walk_layers(stack, f"stacks.{name}"):
            if any(where.startswith(f"{w}.") for w in shared):
                continue
            if isinstance(layer, dict) and layer.get("kind") == "osd":
                key = json.dumps(layer, sort_keys=True)
                if key in seen_osds:
                    shared.append(where)
                    continue
                seen_osds.add(key)
            exclusive, parent_kind = claims.get(where.rpartition(".")[0], (None, ""))
            if isinstance(layer, str):
                uses.setdefault(layer, []).append((where, exclusive or parent_kind))
                continue
            kind = layer["kind"]
            if kind in ("raw", "external") and "device" in layer:
                uses.setdefault(layer["device"], []).append((where, exclusive or "fio"))
            claims[where] = (exclusive or (kind if kind in ("md", "fs", "osd") else None), kind)
    return uses


def _check_devices(plan: dict, source: str) -> None:
    for name, dev in plan.get("devices", {}).items():
        where = f"{source}: devices.{name}"
        if not isinstance(dev, dict):
            raise PlanError(f"{where} must be an object with 'path' or 'size_mib'")
        if ("path" in dev) == ("size_mib" in dev):
            raise PlanError(
                f"{where} needs exactly one of 'path' (a real disk, by a stable path) or "
                f"'size_mib' (a scratch file on a loop device); it has {sorted(dev)}"
            )


def _check_layer(plan: dict, where: str, layer, source: str) -> None:
    devices = plan.get("devices", {})
    if isinstance(layer, str):
        if layer not in devices:
            raise PlanError(
                f"{source}: {where}: device {layer!r} is not in devices "
                f"(the allowlist: {sorted(devices) or 'empty'})"
            )
        return
    kind = layer["kind"]
    ceph_layer = kind == "osd" or (kind == "rbd" and ("over" in layer or "members" in layer))
    if ceph_layer and ceph.check_ceph_layer(layer, where):
        raise PlanError(f"{source}: " + "; ".join(ceph.check_ceph_layer(layer, where)))

    def need(key: str, allowed=None):
        if key not in layer:
            raise PlanError(f"{source}: {where}.{key} is required for kind {kind}")
        if allowed is not None and layer[key] not in allowed:
            raise PlanError(
                f"{source}: {where}.{key}: {layer[key]!r} is not one of "
                f"{', '.join(map(str, allowed))}"
            )

    if kind in ("raw", "external"):
        need("device", sorted(devices) or ["(no devices configured)"])
        if kind == "external" and "path" not in devices[layer["device"]]:
            raise PlanError(
                f"{source}: {where}.device: external stacks use a device prepared outside "
                f"luksbench; devices.{layer['device']} must have a path"
            )
    elif kind == "fs":
        need("over")
        need("fstype", ("ext4", "xfs"))
    elif kind == "md":
        need("level", (0, 5))
        members = layer.get("members") or []
        level = layer["level"]
        least = 3 if level == 5 else 2
        if len(members) < least:
            raise PlanError(
                f"{source}: {where}.members: RAID-{level} needs at least {least} "
                f"members, not {len(members)}"
            )
        chunk = int(layer["chunk_kib"])
        if chunk < 4 or chunk & (chunk - 1):
            raise PlanError(f"{source}: {where}.chunk_kib must be a power of 2 >= 4, not {chunk}")
    elif kind == "luks":
        flags = layer["perf_flags"]
        bad = [f for f in flags if f not in PERF_FLAGS]
        if bad:
            raise PlanError(
                f"{source}: {where}.perf_flags: {bad} not among {', '.join(PERF_FLAGS)}"
            )
        need("sector_size", (512, 4096))
        need("luks_type", ("luks1", "luks2"))
    elif kind == "linear":
        need("like", sorted(plan["stacks"]))
        if first_layer(plan["stacks"][layer["like"]], "luks") is None:
            raise PlanError(
                f"{source}: {where}.like: stack {layer['like']!r} has no luks layer whose "
                "payload region a linear arm could cover"
            )
        if first_layer(plan["stacks"][layer["like"]], "linear"):
            raise PlanError(f"{source}: {where}.like: {layer['like']!r} is itself a linear arm")
    elif kind == "rbd" and not ceph_layer:
        need("pool")
        need("image")
    if (
        kind in ("plain", "loop", "raw", "external", "rbd", "linear")
        and not ceph_layer
        and ("over" in layer or "members" in layer)
    ):
        raise PlanError(f"{source}: {where}: kind {kind} sits on nothing (no 'over'/'members')")
    if kind != "md" and not ceph_layer and "members" in layer:
        raise PlanError(f"{source}: {where}.members: only md layers have members")


def check_stacks(plan: dict, source: str = "plan") -> None:
    """Every layer well-formed, every device reference in the allowlist, and no device shared
    with a consumer that claims it exclusively (md members and mounted filesystems)."""
    _check_devices(plan, source)
    for name, stack in plan["stacks"].items():
        for where, layer in walk_layers(stack, f"stacks.{name}"):
            _check_layer(plan, where, layer, source)
        if isinstance(stack, str):
            raise PlanError(f"{source}: stacks.{name} must be a layer object, not a device name")
    for dev, uses in device_uses(plan).items():
        exclusive = [w for w, how in uses if how in ("md", "fs", "osd")]
        luks = [w for w, how in uses if how == "luks"]
        if len(luks) > 1:
            raise PlanError(
                f"{source}: devices.{dev} carries two luks layers ({', '.join(luks)}): a device "
                "holds one LUKS header; give each luks layer its own device"
            )
        if exclusive and len(uses) > 1:
            raise PlanError(
                f"{source}: devices.{dev} is used by {', '.join(w for w, _ in uses)}; "
                f"{', '.join(exclusive)} claim(s) it exclusively (md members, OSDs and mounted "
                "filesystems cannot share a device): give each its own device, or measure "
                "them in separate runs"
            )


def _cells(matrix: dict, pattern: str = "") -> list[Workload]:
    return [
        Workload(rw, bs_to_bytes(bs), int(qd), pattern)
        for rw in matrix["rw"]
        for bs in matrix["bs"]
        for qd in matrix["iodepth"]
    ]


def workloads(plan: dict) -> list[Workload]:
    """The main matrix and every pattern's cells, as one sorted list."""
    cells = _cells(plan["matrix"])
    for name, pattern in (plan.get("patterns") or {}).items():
        cells += _cells(pattern["matrix"], name)
    return sorted(set(cells))


# --- patterns: families of cells with their own fio options -------------------------------------

PATTERN_KEYS = ("description", "matrix", "io_bs", "fsync_per_block", "fio")
PATTERN_OPTIONAL_KEYS = ("rate_pct",)  # plans made before it existed lack it
PATTERN_FIO_KEYS = ("ioengine", "direct", "sync")
IOENGINES = ("libaio", "io_uring", "psync", "sync", "pvsync2")
# fio rw values that write (fsync_per_block adds fsyncs only to these) and that seek at random.
WRITING_RW = ("write", "randwrite", "rw", "randrw", "readwrite", "trimwrite", "randtrimwrite")
RANDOM_RW = ("randread", "randwrite", "randrw", "randtrim", "randtrimwrite")


def _inherit(overrides: dict, key: str, inherited):
    return inherited if overrides.get(key) is None else overrides[key]


def resolve_patterns(patterns: dict | None, fio: dict) -> dict:
    """Config ``patterns`` -> the plan's, fio overrides resolved against the ``fio`` section (null
    inherits; sync null is false)."""
    out = {}
    for name, spec in (patterns or {}).items():
        where = f"patterns.{name}"
        if not isinstance(spec, dict):
            raise PlanError(
                f"{where}: a pattern must be an object with keys {', '.join(PATTERN_KEYS)}"
            )
        known = (*PATTERN_KEYS, *PATTERN_OPTIONAL_KEYS)
        unknown = sorted(set(spec) - set(known))
        if unknown:
            raise PlanError(f"{where}.{unknown[0]}: not a pattern setting ({', '.join(known)})")
        over = spec.get("fio") or {}
        if not isinstance(over, dict):
            raise PlanError(f"{where}.fio must be an object ({', '.join(PATTERN_FIO_KEYS)})")
        unknown = sorted(set(over) - set(PATTERN_FIO_KEYS) - set(JOB_KEYS))
        if unknown:
            raise PlanError(
                f"{where}.fio.{unknown[0]}: not a pattern fio setting "
                f"({', '.join([*PATTERN_FIO_KEYS, *JOB_KEYS])}; the others are the top-level "
                "fio section's)"
            )

        matrix = spec.get("matrix") or {}
        out[name] = {
            "description": spec.get("description") or "",
            "matrix": {k: list(v) if isinstance(v, list) else v for k, v in matrix.items()},
            "io_bs": spec.get("io_bs") or "",
            "fsync_per_block": spec["fsync_per_block"],
            "fio": {
                "ioengine": _inherit(over, "ioengine", fio["ioengine"]),
                "direct": _inherit(over, "direct", fio["direct"]),
                "sync": _inherit(over, "sync", False),
                **{k: over[k] for k in JOB_KEYS if over.get(k) is not None},
            },
        }
        out[name]["rate_pct"] = spec.get("rate_pct")  # None: unthrottled
    return out


def check_patterns(plan: dict, source: str = "plan") -> None:
    """Every pattern well-formed; the error names the key (``patterns.<name>.io_bs``)."""
    patterns = plan.get("patterns") or {}
    if not isinstance(patterns, dict):
        raise PlanError(f"{source}: patterns must be an object (name -> pattern)")
    for name, pattern in patterns.items():
        where = f"{source}: patterns.{name}"
        if not isinstance(name, str) or not PATTERN_NAME_RE.match(name):
            raise PlanError(
                f"{source}: patterns: {name!r} is not a pattern name (lower-case letters and "
                "digits, starting with a letter: it ends the cell ids, e.g. randwrite-1g-qd1-largeblock)"
            )
        missing = [k for k in PATTERN_KEYS if k not in pattern]
        if missing:
            raise PlanError(f"{where}: missing key(s) {', '.join(missing)}")
        matrix = pattern["matrix"]
        for key in ("rw", "bs", "iodepth"):
            if not isinstance(matrix, dict) or not matrix.get(key):
                raise PlanError(f"{where}.matrix.{key} must be a non-empty list")
        try:
            sizes = [(bs, bs_to_bytes(bs)) for bs in matrix["bs"]]
        except LayoutError as exc:
            raise PlanError(f"{where}.matrix.bs: {exc}") from None
        io_bs = pattern["io_bs"]
        if io_bs:
            try:
                io_bytes = bs_to_bytes(io_bs)
            except LayoutError:
                raise PlanError(
                    f"{where}.io_bs: {io_bs!r} is not a size (e.g. 8k, 64k, 1m; empty: off)"
                ) from None
            if io_bytes <= 0:
                raise PlanError(f"{where}.io_bs must be larger than 0, not {io_bs!r}")
            uneven = [bs for bs, size in sizes if size % io_bytes and size > io_bytes]
            if uneven:
                raise PlanError(
                    f"{where}.matrix.bs: {', '.join(map(str, uneven))} not a multiple of io_bs "
                    f"{io_bs} (a block is a whole number of I/Os)"
                )
        if not isinstance(pattern["fsync_per_block"], bool):
            raise PlanError(f"{where}.fsync_per_block must be true or false")
        rate = pattern.get("rate_pct")
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 100
        ):
            raise PlanError(
                f"{where}.rate_pct must be a percentage in (0, 100] or null, not {rate!r}"
            )
        fio = pattern["fio"]
        if not isinstance(fio, dict) or sorted(set(fio) - set(JOB_KEYS)) != sorted(
            PATTERN_FIO_KEYS
        ):
            raise PlanError(
                f"{where}.fio must hold {', '.join(PATTERN_FIO_KEYS)} and may hold "
                f"{', '.join(JOB_KEYS)}"
            )
        check_job_options(fio, f"{where}.fio", plan.get("fio") or {})
        if fio["ioengine"] not in IOENGINES:
            raise PlanError(
                f"{where}.fio.ioengine: {fio['ioengine']!r} is not one of {', '.join(IOENGINES)}"
            )
        for key in ("direct", "sync"):
            if not isinstance(fio[key], bool):
                raise PlanError(f"{where}.fio.{key} must be true or false, not {fio[key]!r}")


MAX_NUMJOBS = 256


def check_job_options(fio: dict, where: str, run_fio: dict) -> None:
    """The job options (:data:`JOB_KEYS`) a fio section holds have their types (a pattern's holds
    only its overrides); PlanError names one."""
    for key in JOB_KEYS:
        if key not in fio:
            continue
        value = fio[key]
        if key == "numjobs":
            ok = type(value) is int and 1 <= value <= MAX_NUMJOBS
            if ok and value > 1 and run_fio.get("output_format") != "json+":
                raise PlanError(
                    f"{where}.numjobs: {value} jobs need fio.output_format json+ (their latency "
                    "percentiles come from the merged histograms), not "
                    f"{run_fio['output_format']!r}"
                )
        elif key == "cpus_allowed":  # fio's CPU list syntax: 0-3,8,10-11
            ok = isinstance(value, str) and all(c in "0123456789,-" for c in value)
        elif key == "cpus_allowed_policy":
            ok = value in ("shared", "split")
        else:
            ok = isinstance(value, bool)
        if not ok:
            limit = f", at most {MAX_NUMJOBS}" if key == "numjobs" else ""
            raise PlanError(f"{where}.{key}: {value!r} is not a valid value{limit}")


def cell_options(plan: dict, w: Workload) -> dict:
    """How one cell runs: fio options, io_bs_bytes, ios_per_block (I/Os per block of the cell's
    bs), fsync (every that many writes; 0: none), rate_pct (None: unthrottled), job options."""
    fio = plan["fio"]
    options = {
        **{k: fio[k] for k in JOB_KEYS},
        "ioengine": fio["ioengine"],
        "direct": bool(fio["direct"]),
        "sync": False,
        "io_bs_bytes": w.bs_bytes,
        "ios_per_block": 1,
        "fsync": 0,
        "rate_pct": None,
    }
    if not w.pattern:
        return options
    patterns = plan.get("patterns") or {}
    if w.pattern not in patterns:
        raise PlanError(f"cell {w.id}: pattern {w.pattern!r} is not in the plan's patterns")
    pattern = patterns[w.pattern]
    options.update(
        ioengine=pattern["fio"]["ioengine"],
        direct=bool(pattern["fio"]["direct"]),
        sync=bool(pattern["fio"]["sync"]),
        rate_pct=pattern.get("rate_pct"),
        **{k: pattern["fio"][k] for k in JOB_KEYS if k in pattern["fio"]},
    )
    if pattern["io_bs"] and w.bs_bytes > bs_to_bytes(pattern["io_bs"]):
        io_bytes = bs_to_bytes(pattern["io_bs"])
        options.update(io_bs_bytes=io_bytes, ios_per_block=w.bs_bytes // io_bytes)
    if pattern["fsync_per_block"] and w.rw in WRITING_RW:
        options["fsync"] = options["ios_per_block"]
    return options


MIB = 1024 * 1024
# Space a LUKS header takes from the device below (cryptsetup's default data offsets).
LUKS_HEADER_BYTES = {"luks1": 2 * MIB, "luks2": 16 * MIB}


def planned_size_bytes(plan: dict, layer) -> int | None:
    """The most a layer's top device can hold by the plan (md and fs metadata not counted); None
    when it depends on a real disk or a Ceph image."""
    if isinstance(layer, str):
        dev = (plan.get("devices") or {}).get(layer) or {}
        return int(dev["size_mib"]) * MIB if "size_mib" in dev else None
    kind = layer["kind"]
    own = int(layer.get("size_mib") or 0) * MIB or int(plan["device_size_mib"]) * MIB
    if kind in ("plain", "loop"):
        return own
    if kind in ("raw", "external"):
        return planned_size_bytes(plan, layer["device"])
    if kind == "luks":
        below = planned_size_bytes(plan, layer["over"]) if "over" in layer else own
        header = LUKS_HEADER_BYTES.get(layer["luks_type"], 0)
        return None if below is None else max(below - header, 0)
    if kind == "md":
        sizes = [planned_size_bytes(plan, m) for m in layer.get("members") or []]
        if not sizes or None in sizes:
            return None
        data = len(sizes) - 1 if int(layer["level"]) == 5 else len(sizes)
        chunk = int(layer["chunk_kib"]) * 1024
        return data * (min(sizes) // chunk * chunk)
    if kind == "fs":
        if int(layer["file_size_mib"]):
            return int(layer["file_size_mib"]) * MIB
        below = planned_size_bytes(plan, layer["over"])
        return None if below is None else int(below * 0.9) // MIB * MIB  # 90 % of the space
    if kind == "linear":
        like = plan["stacks"].get(layer["like"])
        return planned_size_bytes(plan, first_layer(like, "luks")) if like else None
    return None


# The smallest logical block of a disk and of dm-crypt: direct I/O is done in whole ones.
SECTOR_BYTES = 512


def check_block_sizes(plan: dict, source: str = "plan") -> None:
    """Every block size (matrix, patterns, preconditioning) is a whole number of sectors, else
    it would fail every fio run once the stacks are up."""
    sizes = [("matrix.bs", bs) for bs in plan["matrix"]["bs"]]
    for name, pattern in (plan.get("patterns") or {}).items():
        sizes += [(f"patterns.{name}.matrix.bs", bs) for bs in pattern["matrix"]["bs"]]
        sizes += [(f"patterns.{name}.io_bs", pattern["io_bs"])] if pattern["io_bs"] else []
    try:
        pre = precondition_options(plan["precondition"])
    except TestboxError as exc:
        raise PlanError(f"{source}: {exc}") from None
    sizes += [(f"precondition.{key}", pre[key]) for key in ("block_size", "ss_bs")]
    for key, size in sizes:
        try:
            size_bytes = bs_to_bytes(size)
        except LayoutError as exc:
            raise PlanError(f"{source}: {key}: {exc}") from None
        if size_bytes <= 0 or size_bytes % SECTOR_BYTES:
            raise PlanError(
                f"{source}: {key}: {size!r} is not a whole number of {SECTOR_BYTES}-byte sectors "
                "(e.g. 4k, 64k, 1m)"
            )


def check_blocks_fit(plan: dict, source: str = "plan") -> None:
    """Every cell's block fits the smallest stack whose size the plan tells (fio's span)."""
    sizes = {name: planned_size_bytes(plan, stack) for name, stack in plan["stacks"].items()}
    known = {n: s for n, s in sizes.items() if s is not None}
    if not known:
        return
    smallest = min(known, key=known.get)
    for w in workloads(plan):
        if w.bs_bytes > known[smallest]:
            key = f"patterns.{w.pattern}.matrix.bs" if w.pattern else "matrix.bs"
            what = f"pattern {w.pattern}: cell {w.id}" if w.pattern else f"cell {w.id}"
            raise PlanError(
                f"{source}: {what}: its block of {w.bs} does not fit stack {smallest} (at most "
                f"{known[smallest] / MIB:.0f} MiB by the plan's device sizes; fio uses the same "
                f"span on every stack): make the devices larger or take {w.bs} out of {key}"
            )


def plan_from_config(config: dict, host: str, scratch_dir: Path) -> dict:
    """Resolve a validated workflow config (the schema's defaults filled) into the test box's plan
    document, the current version's: every key there, copied from the config. A config not
    validated with the schema is not read: a missing fio job option or layer setting is a
    PlanError naming it, a missing section (``ceph``, ``sessions``, ``precondition``) a KeyError.
    A layer key of another kind is dropped: the caller refuses one the user set beforehand
    (studies.check_layer_kinds, as the workflow and ``luksbench plan`` do)."""
    stacks = {
        name: resolve_layer(stack, f"stacks.{name}") for name, stack in config["stacks"].items()
    }
    fio = dict(config["fio"])
    plan = {
        "version": PLAN_VERSION,
        "run": config["run"],
        "host": host,
        "backend": config["backend"],
        "scratch_dir": str(Path(scratch_dir).resolve()),
        "device_size_mib": config["device_size_mib"],
        "precondition": dict(config["precondition"]),
        "baseline": config["baseline"],
        "devices": resolve_devices(config.get("devices")),
        "stacks": stacks,
        "matrix": {k: list(v) for k, v in config["matrix"].items()},
        "fio": fio,
        "repetitions": config["repetitions"],
        "seed": config["seed"],
        "patterns": resolve_patterns(config.get("patterns"), fio),
        "sessions": config["sessions"],
        "ceph": dict(config["ceph"]),
        "adaptive": None,
        "fleet": None,
    }
    fleet = config.get("fleet") or {}
    if fleet.get("mode") == "clients":
        # fio runs on every server at once (fio --client): the stacks' paths must be valid on each.
        plan["fleet"] = {"mode": "clients", "hosts": [dict(h) for h in fleet.get("hosts") or []]}
    adaptive = config.get("adaptive") or {}
    if adaptive.get("enabled"):
        # Stage 1 measures the pilot (sequential: the first round).
        sequential = adaptive.get("mode") == "sequential"
        plan["repetitions"] = adaptive["min_pairs" if sequential else "pilot_pairs"]
        plan["adaptive"] = dict(adaptive)
    Plan.from_document(plan, "config")  # every key of the current version, no migration
    check_plan(plan, source="config")
    return plan


def write_plan(
    plan: dict, out: Path, measured_env: Path | None = None, log: Path | None = None
) -> None:
    """Write the plan; refuse, naming each changed key, when ``measured_env`` (the run's env.json)
    shows the run was measured with another plan: it would mix incomparable data."""
    lines = []
    if measured_env is not None and Path(measured_env).exists():
        measured = env_plan(read_env(measured_env))
        changes = plan_changes(measured, plan)
        if changes:
            raise PlanError(
                f"run {plan['run']!r} on {plan['host']!r} was measured with a different plan "
                f"({measured_env}):\n  "
                + "\n  ".join(changes)
                + "\nChoose a new run name (config key 'run') to measure with the new settings."
            )
        lines.append(f"resuming run {plan['run']!r}: plan compatible with {measured_env}")
    write_plan_file(out, plan)
    lines.append(f"wrote {out}")
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text("\n".join(lines) + "\n")
