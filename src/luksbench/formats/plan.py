"""``plan.json``: the one input of the test box, written by the workflow from the validated
config. This module checks the document as a whole (required keys, top-level values, which keys
make two plans' measurements incomparable); :mod:`luksbench.testbox.planbuild` checks what stacks,
patterns and block sizes mean. Standard library only: the test box imports this.

The document (version 4) holds every key; the workflow fills them from the validated config
(defaults: workflow/schemas/config.schema.yaml, the only place they are written)::

    {"version": 4, "run", "host", "backend",          # backend: auto | kernel | userspace
     "scratch_dir", "device_size_mib", "baseline", "devices",
     "stacks": {name: {"kind", "optional", every one of LAYER_SETTINGS[kind],
                       the links its kind has: LAYER_LINKS}},  # layers below: without optional
     "precondition": {every one of PRECONDITION_KEYS},
     "matrix": {"rw": [...], "bs": [...], "iodepth": [...]},
     "fio": {every one of FIO_KEYS and JOB_KEYS},
     "ceph": {"daemon_modes"},                         # the messenger modes of the run's cluster
     "repetitions", "seed", "sessions",                # sessions k: every cell in k stack-ups
     "patterns": {name: {"description", "matrix", "io_bs", "fsync_per_block", "fio",
                         "rate_pct"}},                 # families of cells beside the matrix
     "adaptive": {...} | null,                         # the design, a record, not a setting
     "fleet": {"mode": "clients", "hosts": [...]} | null}

A version 1 file (no ``version``) left out what a run did not use (sessions, patterns, devices,
adaptive, fleet, a pattern's rate_pct); version 2 let ``precondition`` be true/false or a partial
object, left out the job options that had their usual values and had no ``ceph`` section (its
clusters' daemons accepted "crc secure"); version 3 left out a layer's settings that had their
usual values (a stack's ``optional`` when false). :func:`migrated_plan_document` fills in what
those files meant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from luksbench.formats.record import record_version, versioned

REQUIRED_KEYS = ("run", "host", "backend", "scratch_dir", "device_size_mib", "precondition")
REQUIRED_KEYS += ("baseline", "stacks", "matrix", "fio", "repetitions", "seed", "ceph")
BACKENDS = ("auto", "kernel", "userspace")
# The fio settings the test box reads from every plan: the workflow copies them from the validated
# config, whose schema holds their defaults (the test box keeps none of its own).
FIO_KEYS = ("ioengine", "direct", "runtime_s", "ramp_time_s", "output_format")
# fio's job options (a pattern may override each; absent there: the fio section's value).
JOB_KEYS = ("numjobs", "cpus_allowed", "cpus_allowed_policy", "numa_pin", "fixedbufs")
JOB_KEYS += ("registerfiles", "hipri")
PRECONDITION_KEYS = ("enabled", "discard", "fill_passes", "block_size", "steady_state", "ss_rw")
PRECONDITION_KEYS += ("ss_bs", "ss_iodepth", "ss_round_s", "ss_max_rounds", "ss_window")
PRECONDITION_KEYS += ("ss_range_pct", "ss_slope_pct")
# The settings of the Ceph cluster a run builds for its rbd arms over osd layers.
CEPH_KEYS = ("daemon_modes",)
# The settings every layer of a kind carries (the test box reads them and keeps no default)...
LAYER_SETTINGS = {
    "plain": ("size_mib",),  # 0: the plan's device_size_mib
    "loop": ("size_mib",),
    "raw": (),
    "external": (),
    "luks": ("cipher", "key_bits", "hash", "luks_type", "sector_size", "pbkdf_iterations"),
    "linear": (),
    "md": ("level", "chunk_kib"),
    "fs": ("fstype", "file_size_mib"),
    "rbd": ("mode", "image_mib", "conf", "keyring", "client", "secure_mode"),
    "osd": (),
}
LAYER_SETTINGS["luks"] += ("perf_flags", "allow_discards")
# ... and the keys naming what it sits on or uses, where its kind has them (checked by planbuild).
LAYER_LINKS = {
    "raw": ("device",),
    "external": ("device",),
    "luks": ("over",),
    "linear": ("like",),
    "md": ("members",),
    "fs": ("over",),
    "rbd": ("over", "members", "pool", "image"),
    "osd": ("over",),
}
PLAN_VERSION = 4
PLAN_VERSIONS = (1, 2, 3, 4)


class PlanError(ValueError):
    """A plan file that is missing a key or holds a wrong value; the message names the key."""


@dataclass(eq=True)
class Plan(Mapping):
    """A checked plan file's document, typed. Also a read-only mapping of the document's keys, for
    the test-box modules that still index it."""

    run: str
    host: str
    backend: str
    scratch_dir: str
    device_size_mib: int
    precondition: dict
    baseline: str
    stacks: dict
    matrix: dict
    fio: dict
    repetitions: int
    seed: int
    ceph: dict
    devices: dict = field(default_factory=dict)
    sessions: int = 1
    patterns: dict = field(default_factory=dict)
    adaptive: dict | None = None
    fleet: dict | None = None
    version: int = PLAN_VERSION

    @classmethod
    def from_document(cls, doc: dict, source: str = "plan") -> Plan:
        """The record of a plan document of any known version (PlanError names the key)."""
        doc = migrated_plan_document(doc, source)
        unknown = sorted(set(doc) - set(PLAN_KEYS))
        if unknown:
            raise PlanError(f"{source}: unknown key(s) {', '.join(unknown)} (known: {PLAN_KEYS})")
        check_document(doc, source)
        _require_keys(doc["fio"], (*FIO_KEYS, *JOB_KEYS), "fio", source)
        _require_keys(doc["precondition"], PRECONDITION_KEYS, "precondition", source)
        _require_keys(doc["ceph"], CEPH_KEYS, "ceph", source)
        _require_layer_settings(doc["stacks"], source)
        return cls(**{**doc, "version": PLAN_VERSION})

    def to_document(self) -> dict:
        return versioned({k: getattr(self, k) for k in PLAN_KEYS}, self.version)

    def __getitem__(self, key: str):
        if key not in PLAN_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(PLAN_KEYS)

    def __len__(self) -> int:
        return len(PLAN_KEYS)


PLAN_KEYS = tuple(f.name for f in fields(Plan))


def _require_keys(section, keys: tuple, name: str, source: str) -> None:
    if not isinstance(section, dict):
        raise PlanError(f"{source}: {name} must be an object with {', '.join(keys)}")
    missing = [k for k in keys if k not in section]
    if missing:
        raise PlanError(f"{source}: missing key(s) {', '.join(f'{name}.{k}' for k in missing)}")


def _require_layer_settings(stacks, source: str) -> None:
    """Every stack says whether it is optional, every layer holds its kind's settings."""
    if not isinstance(stacks, dict):
        raise PlanError(f"{source}: stacks must be an object of stacks by name")
    for name, stack in stacks.items():
        if isinstance(stack, dict) and not isinstance(stack.get("optional"), bool):
            raise PlanError(f"{source}: stacks.{name}.optional must be true or false")
        for where, layer in walk_layers(stack, f"stacks.{name}"):
            if not isinstance(layer, dict):
                continue
            missing = [k for k in LAYER_SETTINGS.get(layer.get("kind"), ()) if k not in layer]
            if missing:
                raise PlanError(
                    f"{source}: missing key(s) {', '.join(f'{where}.{k}' for k in missing)} "
                    f"(a {layer['kind']} layer carries {', '.join(LAYER_SETTINGS[layer['kind']])})"
                )


def walk_layers(layer, where: str):
    """Yield (where, layer) for a layer tree, top first; device references as strings."""
    yield where, layer
    if isinstance(layer, dict):
        if "over" in layer:
            yield from walk_layers(layer["over"], f"{where}.over")
        for i, member in enumerate(layer.get("members") or []):
            yield from walk_layers(member, f"{where}.members[{i}]")


def migrated_plan_document(doc: dict, source: str = "plan") -> dict:
    """A plan document of any known version as the current version's (RecordVersionError for an
    unknown one, naming ``source``)."""
    version = record_version(doc, source, "plan", PLAN_VERSIONS)
    if version == 1:
        doc = _migrate_v1(doc)
    if version <= 2:
        doc = _migrate_v2(doc)
    if version <= 3:
        doc = _migrate_v3(doc)
    return versioned(doc, PLAN_VERSION)


def _migrate_v1(doc: dict) -> dict:
    """Version 1 left out what a run did not use; a pattern without rate_pct ran unthrottled."""
    patterns = doc.get("patterns") or {}
    patterns = {
        n: {"rate_pct": None, **p} if isinstance(p, dict) else p for n, p in patterns.items()
    }
    absent = {"devices": {}, "sessions": 1, "adaptive": None, "fleet": None}
    return {**absent, **doc, "patterns": patterns}


def _migrate_v2(doc: dict) -> dict:
    """Version 2 (and 1) wrote ``precondition`` as true/false or the options that differed, the
    fio section without the job options that had these values, and no ``ceph`` section: the
    clusters those runs built started their daemons accepting both messenger modes."""
    meant = {
        "enabled": True,
        "discard": True,
        "fill_passes": 2,
        "block_size": "128k",
        "steady_state": False,
        "ss_rw": "randwrite",
        "ss_bs": "4k",
        "ss_iodepth": 32,
        "ss_round_s": 10,
        "ss_max_rounds": 25,
        "ss_window": 5,
        "ss_range_pct": 20.0,
        "ss_slope_pct": 10.0,
    }
    pre = doc.get("precondition")
    stated = {"enabled": pre} if isinstance(pre, bool) else {} if pre is None else pre
    if "precondition" in doc and isinstance(stated, dict):
        doc = {**doc, "precondition": {**meant, **stated}}
    jobs = {"numjobs": 1, "cpus_allowed": "", "cpus_allowed_policy": "shared", "numa_pin": False}
    jobs |= {"fixedbufs": False, "registerfiles": False, "hipri": False}
    if isinstance(doc.get("fio"), dict):
        doc = {**doc, "fio": {**jobs, **doc["fio"]}}
    return {"ceph": {"daemon_modes": "crc secure"}, **doc}


def _migrate_v3(doc: dict) -> dict:
    """Version 3 (and older) left out a layer's settings that had these values (or wrote null
    for the flags, the perf flags and a file size), and a stack's ``optional`` when it was
    false; ``optional`` on a layer below a stack did nothing."""
    meant = {
        "plain": {"size_mib": 0},
        "loop": {"size_mib": 0},
        "luks": {"cipher": "aes-xts-plain64", "key_bits": 512, "hash": "sha256"},
        "md": {"level": 0, "chunk_kib": 512},
        "fs": {"fstype": "ext4", "file_size_mib": 0},
        "rbd": {"mode": "crc", "image_mib": 0, "conf": None, "keyring": None, "client": "admin"},
    }
    meant["luks"] |= {"luks_type": "luks2", "sector_size": 512, "pbkdf_iterations": 1000}
    meant["luks"] |= {"perf_flags": [], "allow_discards": False}
    meant["rbd"] |= {"secure_mode": ""}

    nullable = ("perf_flags", "allow_discards", "file_size_mib", "size_mib", "optional")

    def filled(layer, top: bool):
        if not isinstance(layer, dict):
            return layer
        stated = {k: v for k, v in layer.items() if not (v is None and k in nullable)}
        layer = {**meant.get(layer.get("kind"), {}), **stated}
        if not top:
            layer.pop("optional", None)
        if "over" in layer:
            layer["over"] = filled(layer["over"], False)
        if isinstance(layer.get("members"), list):
            layer["members"] = [filled(m, False) for m in layer["members"]]
        return layer

    stacks = doc.get("stacks")
    if not isinstance(stacks, dict):
        return doc
    stacks = {
        n: {"optional": False, **filled(s, True)} if isinstance(s, dict) else s
        for n, s in stacks.items()
    }
    return {**doc, "stacks": stacks}


def read_plan(path: Path) -> Plan:
    """The one reader of a plan file: its record, any known version (PlanError, or
    RecordVersionError for an unknown version, names the file)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: cannot read plan: {exc}") from exc
    if not isinstance(doc, dict):
        raise PlanError(f"{path}: a plan must be a JSON object")
    return Plan.from_document(doc, str(path))


def write_plan_file(path: Path, plan: Plan | dict) -> None:
    """The one writer of a plan file: the current version's document."""
    record = plan if isinstance(plan, Plan) else Plan.from_document(plan)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record.to_document(), indent=2, sort_keys=True) + "\n")


def check_document(plan: dict, source: str = "plan") -> None:
    """Every required key is there; backend, baseline, repetitions and matrix are usable."""
    missing = [k for k in REQUIRED_KEYS if k not in plan]
    if missing:
        raise PlanError(f"{source}: missing key(s) {', '.join(missing)}")
    if plan["backend"] not in BACKENDS:
        raise PlanError(
            f"{source}: backend must be one of {', '.join(BACKENDS)}, not {plan['backend']!r}"
        )
    if plan["baseline"] not in plan["stacks"]:
        raise PlanError(
            f"{source}: baseline {plan['baseline']!r} is not one of the stacks {sorted(plan['stacks'])}"
        )
    for key in ("repetitions", "sessions"):
        value = plan[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{source}: {key} must be an integer >= 1, not {value!r}")
    if not isinstance(plan["matrix"], dict):
        raise PlanError(f"{source}: matrix must be an object with rw, bs and iodepth lists")
    for key in ("rw", "bs", "iodepth"):
        if not plan["matrix"].get(key):
            raise PlanError(f"{source}: matrix.{key} must be a non-empty list")


def check_run_options(plan: dict, source: str = "plan") -> None:
    """The ``fleet`` (fio servers) and ``adaptive`` (two-stage design) sections of a current
    version's document."""
    fleet = plan.get("fleet")
    if fleet is not None:
        hosts = fleet.get("hosts") or []
        if fleet.get("mode") == "clients" and not hosts:
            raise PlanError(f"{source}: fleet.hosts must list the fio servers for mode clients")
        names = [h.get("name") for h in hosts]
        if len(set(names)) != len(names):
            raise PlanError(f"{source}: fleet.hosts names must be unique, not {names}")
    adaptive = plan.get("adaptive")
    if adaptive is not None:
        if not isinstance(adaptive, dict):
            raise PlanError(f"{source}: adaptive must be an object")
        sequential = adaptive.get("mode") == "sequential"
        first = "min_pairs" if sequential else "pilot_pairs"
        missing = [k for k in (first, "max_pairs") if k not in adaptive]
        if missing:  # the plan carries the config's values, defaults filled
            raise PlanError(f"{source}: adaptive lacks {', '.join(missing)}")
        n0, cap = int(adaptive[first]), int(adaptive["max_pairs"])
        if n0 < 2:
            raise PlanError(f"{source}: adaptive.{first} must be >= 2, not {n0}")
        if cap < n0:
            raise PlanError(
                f"{source}: adaptive.max_pairs ({cap}) must be >= adaptive.{first} ({n0})"
            )
        if sequential:
            check_sequential_sessions(int(plan["sessions"]), n0, source)


def check_sequential_sessions(sessions: int, min_pairs: int, source: str = "plan") -> None:
    """The sequential design with sessions: k >= 3 sessions (two give one degree of freedom for
    the between-session variance: intervals too wide to decide, the plan's k = 2 warning) and
    ``adaptive.min_pairs`` >= k (the first look needs a pair in every session)."""
    if sessions == 2:
        raise PlanError(
            f"{source}: sessions 2 with adaptive.mode sequential: too few sessions to estimate "
            "the between-session variance (one degree of freedom); use sessions 1 or >= 3"
        )
    if sessions >= 3 and min_pairs < sessions:
        raise PlanError(
            f"{source}: adaptive.min_pairs ({min_pairs}) must be >= sessions ({sessions}) with "
            "adaptive.mode sequential: the first look needs a pair in every session"
        )


# Keys whose change makes measurements incomparable
_MEASUREMENT_KEYS = ("backend", "device_size_mib", "precondition")
_MEASUREMENT_KEYS += ("stacks", "fio", "devices", "fleet", "ceph")
# Per pattern: how its cells are measured (its matrix may grow, and a new pattern adds cells).
_PATTERN_MEASUREMENT_KEYS = ("io_bs", "fsync_per_block", "fio")


def plan_changes(measured: dict, new: dict) -> list[str]:
    """Differences that would mix incomparable measurements into one run, as 'key: old -> new'
    (more repetitions or cells, or another seed, resume or extend a run: not listed)."""
    measured = migrated_plan_document(measured, "measured plan")
    new = migrated_plan_document(new, "plan")
    changes: list[str] = []
    for key in _MEASUREMENT_KEYS:
        _diff(key, measured.get(key), new.get(key), changes)
    old_patterns, new_patterns = measured.get("patterns") or {}, new.get("patterns") or {}
    for name in sorted(set(old_patterns) & set(new_patterns)):
        old, new_ = old_patterns[name], new_patterns[name]
        for key in _PATTERN_MEASUREMENT_KEYS:
            _diff(f"patterns.{name}.{key}", old.get(key), new_.get(key), changes)
    return changes


def _diff(key: str, old, new, changes: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for sub in sorted(set(old) | set(new)):
            _diff(f"{key}.{sub}", old.get(sub), new.get(sub), changes)
    elif old != new:
        changes.append(f"{key}: {old!r} -> {new!r}")
