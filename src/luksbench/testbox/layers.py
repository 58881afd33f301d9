"""A stack's layers as the plan holds them: each kind's keys, resolving a config layer into the
plan's, and the preconditioning options. Standard library only."""

from __future__ import annotations

from luksbench.formats.plan import LAYER_LINKS, LAYER_SETTINGS, PRECONDITION_KEYS, PlanError
from luksbench.testbox.sysutil import TestboxError

KINDS = ("plain", "loop", "raw", "luks", "md", "fs", "linear", "external", "rbd")
KINDS += ("osd",)
PERF_FLAGS = ("submit_from_crypt_cpus", "same_cpu_crypt", "no_read_workqueue", "no_write_workqueue")
PERF_FLAGS += ("high_priority",)
NULL_CIPHERS = ("cipher_null-ecb", "capi:ecb(cipher_null)", "cipher_null")
# The checked types of the precondition options (the plan carries every one of PRECONDITION_KEYS).
_BOOL_OPTS = ("enabled", "discard", "steady_state")
_INT_OPTS = {"fill_passes": 1, "ss_max_rounds": 1, "ss_window": 2, "ss_iodepth": 1}
_NUMBER_OPTS = {"ss_round_s": 1, "ss_range_pct": 0, "ss_slope_pct": 0}
_STR_OPTS = ("block_size", "ss_rw", "ss_bs")
SS_RW = ("randwrite", "write", "randrw", "rw", "randread", "read")


def precondition_options(value) -> dict:
    """A plan's ``precondition`` object (every one of PRECONDITION_KEYS) -> the checked options;
    TestboxError names a bad, missing or unknown key."""
    if not isinstance(value, dict):
        raise TestboxError(f"precondition must be an object of {PRECONDITION_KEYS}, not {value!r}")
    unknown = sorted(set(value) - set(PRECONDITION_KEYS))
    missing = [k for k in PRECONDITION_KEYS if k not in value]
    if unknown or missing:
        raise TestboxError(
            f"precondition: unknown option(s) {unknown}, missing {missing}; "
            f"known: {list(PRECONDITION_KEYS)}"
        )
    merged = dict(value)
    for key in _BOOL_OPTS:
        if not isinstance(merged[key], bool):
            raise TestboxError(f"precondition.{key} must be true or false, not {merged[key]!r}")
    for key, low in (*_INT_OPTS.items(), *_NUMBER_OPTS.items()):
        v = merged[key]
        what, types = ("an integer", int) if key in _INT_OPTS else ("a number", int | float)
        if isinstance(v, bool) or not isinstance(v, types) or v < low:
            raise TestboxError(f"precondition.{key} must be {what} >= {low}, not {v!r}")
    for key in _STR_OPTS:
        if not isinstance(merged[key], str) or not merged[key]:
            raise TestboxError(f"precondition.{key} must be a non-empty string")
    if merged["ss_rw"] not in SS_RW:
        raise TestboxError(f"precondition.ss_rw must be one of {SS_RW}, not {merged['ss_rw']!r}")
    if merged["ss_max_rounds"] < merged["ss_window"]:
        raise TestboxError(
            f"precondition.ss_max_rounds ({merged['ss_max_rounds']}) is smaller than "
            f"precondition.ss_window ({merged['ss_window']}): the gate could never pass"
        )
    return merged


# The keys each kind of layer reads: its settings and its links (formats/plan.py).
KIND_KEYS = {k: {*LAYER_SETTINGS[k], *LAYER_LINKS.get(k, ())} for k in KINDS}


def resolve_layer(spec, where: str, top: bool = True):
    """A validated config's layer as the plan holds it, recursively: its kind's keys (the schema
    filled every setting) and, on a stack's top layer, ``optional``. A key of another kind is
    dropped here: the workflow refuses one that is not the schema's default on the config,
    after validation (studies.check_layer_kinds)."""
    if isinstance(spec, str):
        return spec
    if not isinstance(spec, dict) or "kind" not in spec:
        raise PlanError(f"{where}: a layer must be a device name or an object with a 'kind'")
    kind = spec["kind"]
    if kind not in KINDS:
        raise PlanError(f"{where}.kind: {kind!r} is not one of {', '.join(KINDS)}")
    layer = {"kind": kind, **{k: v for k, v in spec.items() if k in KIND_KEYS[kind]}}
    if top:
        layer["optional"] = spec.get("optional") is True
    elif spec.get("optional"):
        raise PlanError(f"{where}.optional: only a stack (its top layer) can be optional")
    if "over" in layer:
        layer["over"] = resolve_layer(layer["over"], f"{where}.over", top=False)
    if "members" in layer:
        layer["members"] = [
            resolve_layer(m, f"{where}.members[{i}]", top=False)
            for i, m in enumerate(layer["members"])
        ]
    return layer


def resolve_devices(devices: dict) -> dict:
    """The allowlist with a real disk's defaults made explicit."""
    disk = {"wipe_serial": "", "allow_unstable_path": False}
    return {n: {**disk, **d} if "path" in d else dict(d) for n, d in (devices or {}).items()}
