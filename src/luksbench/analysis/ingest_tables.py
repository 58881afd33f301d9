"""The per-host tables of a run folder read from its JSON documents: cryptsetup (and OpenSSL)
ciphers, env, stacks and schedule, and the plan each host recorded in ``env.json`` (its fio
options, patterns, stacks and devices). Every document is flattened here, once: the tables hold
columns, and lists are long tables of one row per item (:data:`PLAN_TABLES`)."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pandas as pd

from luksbench.analysis import cpucost
from luksbench.analysis.ingest_columns import (
    _checked,
    _relative,
    _stat_key,
    _typed,
    host_dirs,
    run_name,
)
from luksbench.analysis.stats import with_dtypes
from luksbench.formats import cryptsetup, opensslspeed
from luksbench.formats.envdoc import env_facts, migrated_env
from luksbench.formats.layout import (
    read_json_object,
)
from luksbench.formats.manifest import (
    SESSIONS_DIR,
    fleet_servers,
    migrated_manifest,
    session_records,
    stack_descriptions,
)
from luksbench.formats.plan import PlanError, migrated_plan_document

ENV_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "run host hostname kernel cpu_model cpu_count aes vaes backend backend_reason fio_version "
    "cryptsetup_version qemu_version captured coordinator scratch_dir baseline config_hash"
).split()

#: an optional stack that could not be built has a row too: available false, with the reason
STACKS_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "run host stack kind backend cipher key_bits luks_type sector_size hash pbkdf "
    "device_size_bytes loop_direct_io device backing_file dm_table available reason"
).split()
STACKS_DTYPES = {"Int64": ("key_bits", "sector_size", "device_size_bytes")}
STACKS_DTYPES |= {"boolean": ("available", "loop_direct_io")}  # the others: string
#: the description keys the stacks table keeps as columns (the layer tree stays in the raw run)
_STACK_FACTS = ("luks_type", "sector_size", "hash", "pbkdf", "device_size_bytes")
_STACK_FACTS += ("loop_direct_io", "device", "backing_file")


def _fleet_servers(host_dir: Path) -> list[dict]:
    """The fio servers of a host's fleet run (``fleet.hosts`` of its manifest), or []."""
    try:
        return fleet_servers(_json_document(Path(host_dir) / "fio" / "manifest.json"))
    except ValueError:
        return []


def fleet_names(host_dir: Path) -> dict[str, str]:
    """fio server (as the parser names it: ``address`` or ``address:port``) -> the host name the
    plan gave it, from ``<host>/fio/manifest.json``'s ``fleet`` record (fio client/server mode);
    empty for a local run or an unreadable manifest (then the parser's name is used)."""
    servers = _fleet_servers(host_dir)
    out: dict[str, str] = {}
    addresses = [str(h.get("address")) for h in servers]
    for h in servers:
        address = str(h.get("address"))
        out[f"{address}:{h.get('port', 8765)}"] = str(h["name"])
        if addresses.count(address) == 1:
            out[address] = str(h["name"])
    return out


# -------------------------------------------------------------------------------------- cryptsetup


CIPHER_SOURCE_KERNEL = "cryptsetup benchmark"
CRYPTSETUP_TABLE_COLUMNS = ["run", "host", *cryptsetup.CRYPTSETUP_COLUMNS, "source", "block_bytes"]


def _openssl_cipher_rows(path: Path) -> list[dict]:
    """``openssl-speed.txt`` as cipher rows of the cryptsetup table: per cipher and key size, the
    largest block size measured in both directions (``source`` says it is a userspace estimate)."""
    by_cipher: dict[tuple, dict] = {}
    for r in opensslspeed.parse_openssl_speed_file(path):
        key = (r["algorithm"], r["key_bits"])
        row = by_cipher.setdefault(key, {
            **dict.fromkeys(cryptsetup.CRYPTSETUP_COLUMNS),
            "kind": "cipher", "algorithm": r["algorithm"], "key_bits": r["key_bits"],
            "available": True, "note": "", "source": opensslspeed.SOURCE, "block_bytes": None,
            "_blocks": {},
        })  # fmt: skip
        if not r["available"]:
            row.update(available=False, note=r["note"])
        else:
            row["_blocks"].setdefault(r["block_bytes"], {})[r["direction"]] = r["mib_s"]
    rows = []
    for row in by_cipher.values():
        both = {
            b: d for b, d in row.pop("_blocks").items() if len(d) == len(opensslspeed.DIRECTIONS)
        }
        if row["available"] and both:
            block = max(both)
            row.update(block_bytes=block, encryption_mib_s=both[block]["encryption"])
            row["decryption_mib_s"] = both[block]["decryption"]
        elif row["available"]:
            row.update(available=False, note="openssl speed measured one direction only")
        rows.append(row)
    return rows


def _host_cipher_rows(host: Path) -> list[tuple[Path, list[dict] | Exception]]:
    """(file, rows or the error) for the host's kernel cipher benchmark and userspace estimate."""
    out = []
    for name, parse in (
        ("cryptsetup-benchmark.txt", cryptsetup.parse_cryptsetup_file),
        (opensslspeed.OPENSSL_SPEED_FILE, _openssl_cipher_rows),
    ):
        path = host / name
        if not path.exists():
            continue
        try:
            out.append((path, parse(path)))
        except (cryptsetup.CryptsetupParseError, OSError, ValueError) as exc:
            out.append((path, exc))
    return out


def cryptsetup_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """``<host>/cryptsetup-benchmark.txt`` of every host (none: no rows), parsed, with the cipher
    rows of ``<host>/openssl-speed.txt`` (the userspace estimate where the kernel's ciphers could
    not be benchmarked); ``run`` and ``host`` in front, ``source`` says which tool measured."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host in host_dirs(raw_dir):
        for path, rows in _host_cipher_rows(host):
            if isinstance(rows, Exception):
                problems.append((path, str(rows)))
                continue
            rel = _relative(path, raw_dir)
            base = {"run": run, "host": host.name, "source": CIPHER_SOURCE_KERNEL}
            records += [{**base, **r, "file": rel} for r in rows]
    df = pd.DataFrame.from_records(records, columns=CRYPTSETUP_TABLE_COLUMNS)
    typed = _typed(df, text_cols=("source",), bool_cols=("available",))
    return _checked(typed, raw_dir, problems, strict)


# -------------------------------------------------------------------------------------------- env


def _utc_times(values: list) -> pd.DatetimeIndex:
    """ISO times of manifests as UTC timestamps, naive ones taken as UTC (NaT when missing or
    malformed); one vectorised parse, as a run's manifests record tens of thousands of runs."""
    text = [v if isinstance(v, str) and v else None for v in values]
    times = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    return times.astype("datetime64[ns, UTC]")


def _json_document(path: Path) -> dict:
    """:func:`read_json_object`, decoded once per version of the file (path, size, mtime, inode):
    several tables read each manifest, and a large run's are megabytes. Do not change it."""
    return _decoded_json(str(path), _stat_key(str(path)))


@functools.lru_cache(maxsize=4)  # emptied after each ingest_run
def _decoded_json(path: str, version: tuple[int, int, int]) -> dict:
    """The document, its format version checked (RecordVersionError, a ValueError, names the
    file and the version) for the versioned records ingest reads this way."""
    doc, where = read_json_object(Path(path)), Path(path)
    if where.name == "env.json":
        return migrated_env(doc, path)
    if where.name == "manifest.json" or where.parent.name == SESSIONS_DIR:
        return migrated_manifest(doc, path)
    return doc


def _read_json(path: Path, problems: list) -> dict | None:
    try:
        return _json_document(path)
    except ValueError as exc:
        problems.append((path, str(exc)))
        return None


def _host_documents(raw_dir: Path, name: str, problems: list, missing: dict | None = None):
    """(host folder, document) of every host's JSON document ``name``; an unreadable one is left
    out (its problem added), a missing one is ``missing`` (None: left out)."""
    for host in host_dirs(raw_dir):
        path = host / name
        doc = _read_json(path, problems) if path.exists() else missing
        if doc is not None:
            yield host, doc


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _plan(env: dict) -> dict:
    """The plan an environment document was captured with, as the current plan version reads it
    (an older plan migrated, so that its options compare with a newer run's; {} when it records
    none; one the plan record cannot read as it is)."""
    plan = _dict(env.get("plan"))
    try:
        return migrated_plan_document(plan, "env.json plan") if plan else plan
    except (PlanError, ValueError):  # a version the record refuses: as it is
        return plan


def config_hash(plan: dict) -> str | None:
    """First 16 hex digits of SHA-256 over the plan as canonical JSON (None without a plan)."""
    text = json.dumps(plan, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16] if plan else None


def _env_record(run: str, host: str, env: dict) -> dict:
    plan = _plan(env)
    scratch = plan.get("scratch_dir")
    return {"run": run, "host": host, **env_facts(env)} | {
        "captured": env.get("captured"),
        "scratch_dir": scratch if isinstance(scratch, str) else None,
        "baseline": plan.get("baseline"),
        "config_hash": config_hash(plan),
    }


ENV_DTYPES = {_utc_times: ("captured",), "boolean": ("aes", "vaes"), "Int64": ("cpu_count",)}


def env_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host: the facts of ``env.json`` (columns :data:`ENV_COLUMNS`; no env.json:
    NaNs); its plan's fio options, patterns, stacks and the devices are :data:`PLAN_TABLES`.
    Each fio server of a fleet run gets a row too, with only the backend known and its
    ``coordinator`` (the host that captured the environment and built the stacks)."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host, env in _host_documents(raw_dir, "env.json", problems, missing={}):
        record = _env_record(run, host.name, env)
        records.append(record)
        for server in _fleet_servers(host):
            records.append(
                {"run": run, "host": server["name"], "coordinator": host.name}
                | {"hostname": f"{server.get('address')}:{server.get('port', 8765)}"}
                | {k: record[k] for k in ("backend", "backend_reason")}
            )
    df = pd.DataFrame.from_records(records, columns=ENV_COLUMNS)
    df = with_dtypes(df, ENV_DTYPES, "string", errors="coerce")
    return _checked(df, raw_dir, problems, strict)


# ----------------------------------------------------------------------- the plans of env.json

JOB_DEVICES_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "run host device block_device numa_node queues scheduler io_poll nvme_poll_queues job_cpus "
    "holds_scratch"
).split()
_JOB_DEVICES_DTYPES = {"Int64": ("numa_node", "queues", "nvme_poll_queues")}
_JOB_DEVICES_DTYPES |= {"boolean": ("io_poll", "holds_scratch")}
PATTERNS_COLUMNS = "run host pattern description io_bs fsync_per_block sync rate_pct".split()  # noqa: SIM905
_PATTERNS_DTYPES = {"boolean": ("fsync_per_block", "sync"), "float64": ("rate_pct",)}
PLAN_FIO_COLUMNS = ["run", "host", "option", "option_value"]
PLAN_STACKS_COLUMNS = "run host stack kind cipher key_bits sector_size".split()  # noqa: SIM905
_PLAN_STACKS_DTYPES = {"Int64": ("key_bits", "sector_size")}
PERF_FLAGS_COLUMNS = "run host stack flag planned applied in_dm_table skipped_reason".split()  # noqa: SIM905
_PERF_FLAGS_DTYPES = {"boolean": ("planned", "applied", "in_dm_table")}
STACK_NOTES_COLUMNS = ["run", "host", "stack", "note"]


def _holds(path, scratch) -> bool | None:
    """Whether the device at ``path`` holds the scratch directory ``scratch``."""
    path, scratch = str(path or ""), str(scratch or "")
    if not path:
        return None
    return scratch == path or scratch.startswith(path.rstrip("/") + "/")


def job_device_rows(run: str, host: str, env: dict) -> list[dict]:
    """One row per disk of the document's ``job_devices`` (:data:`JOB_DEVICES_COLUMNS`)."""
    scratch = _plan(env).get("scratch_dir")
    devices = env.get("job_devices")
    return [
        {"run": run, "host": host, **{k: d.get(k) for k in JOB_DEVICES_COLUMNS[2:-1]}}
        | {"holds_scratch": _holds(d.get("device"), scratch)}
        for d in (devices if isinstance(devices, list) else [])
        if isinstance(d, dict)
    ]


def job_devices_frame(records: list[dict]) -> pd.DataFrame:
    """Rows of :func:`job_device_rows` as the ``job_devices`` table."""
    df = pd.DataFrame.from_records(records, columns=JOB_DEVICES_COLUMNS)
    return with_dtypes(df, _JOB_DEVICES_DTYPES, "string", errors="coerce")


def _pattern_rows(run: str, host: str, env: dict) -> list[dict]:
    return [
        {"run": run, "host": host, "pattern": name, "description": p.get("description")}
        | {k: p.get(k) for k in ("io_bs", "fsync_per_block", "rate_pct")}
        | {"sync": _dict(p.get("fio")).get("sync")}
        for name, p in sorted(_dict(_plan(env).get("patterns")).items())
        if isinstance(p, dict)
    ]


def _plan_fio_rows(run: str, host: str, env: dict) -> list[dict]:
    fio = _dict(_plan(env).get("fio"))
    return [
        {"run": run, "host": host, "option": k, "option_value": None if v is None else str(v)}
        for k, v in sorted(fio.items())
    ]


def _plan_stack_rows(run: str, host: str, env: dict) -> list[dict]:
    return [
        {"run": run, "host": host, "stack": name} | {k: cfg.get(k) for k in PLAN_STACKS_COLUMNS[3:]}
        for name, cfg in sorted(_dict(_plan(env).get("stacks")).items())
        if isinstance(cfg, dict)
    ]


def _plan_records(raw_dir: Path, rows, strict: bool) -> tuple[list[dict], list]:
    """``rows(run, host, env)`` of every host's env.json; no problems (an unreadable env.json is
    the env table's problem, reported once)."""
    run, records = run_name(raw_dir), []
    for host, env in _host_documents(raw_dir, "env.json", []):
        records += rows(run, host.name, env)
    return records, []


def _plan_table(raw_dir, strict, rows, columns, dtypes) -> pd.DataFrame:
    records, problems = _plan_records(Path(raw_dir), rows, strict)
    df = pd.DataFrame.from_records(records, columns=columns)
    df = with_dtypes(df, dtypes, "string", errors="coerce")
    return _checked(df, Path(raw_dir), problems, strict)


def job_devices_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """Per host and disk of env.json's ``job_devices``: its block device, NUMA node, queues,
    scheduler, poll queues, the CPUs the fio jobs ran on ("" = any) and whether it holds the
    scratch directory."""
    records, problems = _plan_records(Path(raw_dir), job_device_rows, strict)
    return _checked(job_devices_frame(records), Path(raw_dir), problems, strict)


def patterns_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """Per host and pattern of its plan: description, io_bs, fsync per block, O_SYNC, rate_pct."""
    return _plan_table(raw_dir, strict, _pattern_rows, PATTERNS_COLUMNS, _PATTERNS_DTYPES)


def plan_fio_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """Per host and option of its plan's ``fio`` section: the value as text (long: the plans of
    other versions may name other options)."""
    return _plan_table(raw_dir, strict, _plan_fio_rows, PLAN_FIO_COLUMNS, {})


def plan_stacks_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """Per host and stack of its plan: the top layer's kind, cipher, key size and sector size as
    asked (empty: a top layer that is not luks); its perf flags are in ``perf_flags``."""
    return _plan_table(raw_dir, strict, _plan_stack_rows, PLAN_STACKS_COLUMNS, _PLAN_STACKS_DTYPES)


# ------------------------------------------------------------------------------------- stacks


def _luks_layer(desc: dict) -> dict:
    """The first luks layer of a stack description's layer tree ({} without one)."""
    luks = desc.get("layers") or {}
    while isinstance(luks, dict) and luks.get("kind") not in (None, "luks"):
        luks = luks.get("over")
    return _dict(luks)


def _flag_rows(head: tuple, desc: dict, planned: list) -> list[tuple]:
    """One row per perf flag the plan asked for or the stack records (applied or skipped)."""
    luks = _luks_layer(desc)
    table = (luks.get("dm_table") or "").split()
    skipped = _dict(luks.get("perf_flags_skipped"))
    applied = [f for f in desc.get("perf_flags") or [] if isinstance(f, str)]
    flags = dict.fromkeys([*planned, *applied, *skipped])
    return [
        (*head, f, f in planned, f in applied, (f in table) if table else None, skipped.get(f))
        for f in flags
    ]


def _planned_flags(raw_dir: Path) -> dict[str, dict[str, list[str]]]:
    """{host: {stack: the perf flags its plan (env.json) asked for on the top layer}}."""
    out: dict[str, dict[str, list[str]]] = {}
    for host, env in _host_documents(raw_dir, "env.json", []):
        for name, cfg in _dict(_plan(env).get("stacks")).items():
            flags = _dict(cfg).get("perf_flags") or []
            out.setdefault(host.name, {})[name] = [f for f in flags if isinstance(f, str)]
    return out


def _stack_record(head: tuple, desc: dict, reason) -> tuple:
    key_bits = desc.get("key_bits", desc.get("key_size"))
    key_bits = key_bits if isinstance(key_bits, int) else None
    described = (*map(desc.get, ("kind", "backend", "cipher")), key_bits)
    facts = tuple(map(desc.get, _STACK_FACTS))
    return (*head, *described, *facts, _luks_layer(desc).get("dm_table"), not reason, reason)


def _host_stack_rows(run, host, stacks: dict, unavailable: dict, planned: dict) -> tuple:
    """Rows of the stacks, perf_flags and stack_notes tables of one host's stack descriptions
    (``planned``: stack -> the perf flags its plan asked for)."""
    stacks_rows, flag_rows, note_rows = [], [], []
    for name, desc in sorted(stacks.items()):
        desc = desc if isinstance(desc, dict) else {"value": desc}
        reason = unavailable.get(name) or desc.get("unavailable")
        head = (run, host, name)
        stacks_rows.append(_stack_record(head, desc, str(reason) if reason else None))
        flag_rows += _flag_rows(head, desc, planned.get(name, []))
        note_rows += [(*head, str(n)) for n in dict.fromkeys(desc.get("notes") or [])]
    return stacks_rows, flag_rows, note_rows


def _stack_rows(raw_dir: Path, problems: list) -> tuple[list, list, list]:
    """Rows of the stacks, perf_flags and stack_notes tables."""
    run, out = run_name(raw_dir), ([], [], [])
    planned = _planned_flags(raw_dir)
    for host, manifest in _host_documents(raw_dir, "fio/manifest.json", problems):
        descriptions = stack_descriptions(manifest)
        flags = planned.pop(host.name, {})
        rows = _host_stack_rows(run, host.name, *descriptions, flags)
        for table, part in zip(out, rows, strict=True):
            table += part
        for stack in set(flags) - set(descriptions[0]):  # planned, never described: not applied
            planned.setdefault(host.name, {})[stack] = flags[stack]
    out[1].extend(
        (run, host, stack, flag, True, False, None, None)
        for host, stacks in sorted(planned.items())
        for stack, flags in sorted(stacks.items())
        for flag in flags
    )
    return out


def stack_frames(run: str, host: str, descriptions: dict, planned: dict) -> dict:
    """The stacks, perf_flags and stack_notes tables of one host's stack descriptions
    ({stack: description}; ``planned``: {stack: perf flags its plan asked for})."""
    rows = _host_stack_rows(run, host, descriptions, {}, planned)
    frames = zip(
        (STACKS_COLUMNS, PERF_FLAGS_COLUMNS, STACK_NOTES_COLUMNS),
        (STACKS_DTYPES, _PERF_FLAGS_DTYPES, {}),
        rows,
        strict=True,
    )
    typed = [
        with_dtypes(pd.DataFrame.from_records(r, columns=c), d, "string") for c, d, r in frames
    ]
    return dict(zip(("stacks", "perf_flags", "stack_notes"), typed, strict=True))


def plan_frames(run: str, host: str, env: dict) -> dict:
    """The env row and :data:`PLAN_TABLES`' plan tables of one host's environment document."""
    specs = {
        "env": ([_env_record(run, host, env)], ENV_COLUMNS, ENV_DTYPES),
        "job_devices": (job_device_rows(run, host, env), JOB_DEVICES_COLUMNS, _JOB_DEVICES_DTYPES),
        "patterns": (_pattern_rows(run, host, env), PATTERNS_COLUMNS, _PATTERNS_DTYPES),
        "plan_fio": (_plan_fio_rows(run, host, env), PLAN_FIO_COLUMNS, {}),
        "plan_stacks": (_plan_stack_rows(run, host, env), PLAN_STACKS_COLUMNS, _PLAN_STACKS_DTYPES),
    }
    return {
        name: with_dtypes(pd.DataFrame.from_records(r, columns=c), d, "string", errors="coerce")
        for name, (r, c, d) in specs.items()
    }


def stacks_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host x stack (columns :data:`STACKS_COLUMNS`) from the stack descriptions the
    runner recorded in ``<host>/fio/manifest.json`` (no key material): the facts of the stack and
    of its luks layer (``dm_table``) and loop layer (``loop_direct_io``)."""
    raw_dir, problems = Path(raw_dir), []
    records = _stack_rows(raw_dir, problems)[0]
    df = pd.DataFrame.from_records(records, columns=STACKS_COLUMNS)
    return _checked(with_dtypes(df, STACKS_DTYPES, "string"), raw_dir, problems, strict)


def perf_flags_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host, stack and dm-crypt perf flag its plan asked for or its description
    records: ``planned``, ``applied`` (by cryptsetup), ``in_dm_table`` (empty: no dm table
    recorded) and why the box skipped it (a planned stack without a description: not applied)."""
    raw_dir, problems = Path(raw_dir), []  # an unreadable manifest: the stacks table's problem
    records = _stack_rows(raw_dir, [])[1]
    df = pd.DataFrame.from_records(records, columns=PERF_FLAGS_COLUMNS)
    return _checked(with_dtypes(df, _PERF_FLAGS_DTYPES, "string"), raw_dir, problems, strict)


def stack_notes_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per note of a stack's description (e.g. a LUKS version the backend forced)."""
    raw_dir, problems = Path(raw_dir), []  # an unreadable manifest: the stacks table's problem
    records = _stack_rows(raw_dir, [])[2]
    df = pd.DataFrame.from_records(records, columns=STACK_NOTES_COLUMNS)
    return _checked(with_dtypes(df, {}, "string"), raw_dir, problems, strict)


#: the tables ingest flattens from env.json's plan and the manifests' stack descriptions, beside
#: env and stacks: {name: builder(raw_dir, strict)}
PLAN_TABLES = {
    "job_devices": job_devices_table,
    "patterns": patterns_table,
    "plan_fio": plan_fio_table,
    "plan_stacks": plan_stacks_table,
    "perf_flags": perf_flags_table,
    "stack_notes": stack_notes_table,
}


# --------------------------------------------------------------------------------------- schedule

#: the manifest's values of the session, then of each run, then the run's idle CPU sample
#: (:func:`cpucost.run_idle_rates`: per second of wall time, and which sample)
_SESSION_KEYS = ("started", "ended", "seed")
_RUN_KEYS = (  # noqa: SIM905 - a list of names, one word each
    "index round rep stack workload position_in_cell started ended status"
).split()
SCHEDULE_COLUMNS = ["run", "host", "session", "session_started", "session_ended", "seed"]
SCHEDULE_COLUMNS += [*_RUN_KEYS, *cpucost.IDLE_COLUMNS]


_SCHEDULE_DTYPES = {
    _utc_times: ("session_started", "session_ended", "started", "ended"),
    "Int64": ("seed", "index", "round", "rep", "position_in_cell"),
    "float64": cpucost.IDLE_COLUMNS,
}


def schedule_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """When each fio result was measured: one row per run of every session's manifest (columns
    :data:`SCHEDULE_COLUMNS`; results a session found already there are not repeated): its session
    (record in ``fio/sessions/``), round of the counterbalanced schedule, and UTC times bracketing
    the fio process (``luksbench compare`` pairs results measured side by side)."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for hdir in host_dirs(raw_dir):
        for path, session in session_records(hdir):
            manifest = _read_json(path, problems)
            if manifest is None:
                continue
            runs = manifest.get("runs") or []
            if not isinstance(runs, list):
                problems.append((path, "manifest: 'runs' must be a list"))
                continue
            head = (run, hdir.name, session, *map(manifest.get, _SESSION_KEYS))
            records += [
                (
                    *head,
                    *map(entry.get, _RUN_KEYS),
                    *cpucost.run_idle_rates(manifest, entry).values(),
                )
                for entry in runs
                if isinstance(entry, dict) and not entry.get("skipped_existing")
            ]
    df = pd.DataFrame.from_records(records, columns=SCHEDULE_COLUMNS)
    df = with_dtypes(df, _SCHEDULE_DTYPES, "string", errors="coerce")
    return _checked(df, raw_dir, problems, strict)


def machine_paths(env: pd.DataFrame, raw_dir: Path, devices: pd.DataFrame) -> dict[str, str]:
    """{absolute path of the measuring machine: what a published table shows instead}: the run's
    raw folder (paths inside it relative), each host's scratch directory (``<scratch_dir>``) and
    each planned device that is no ``/dev`` path (``<device BLOCK>``), also as JSON escapes them."""
    names = {}
    for raw in dict.fromkeys((str(Path(raw_dir)), str(Path(raw_dir).resolve()))):
        names |= {f"{raw}/": "", raw: "."}
    for scratch in env.get("scratch_dir", pd.Series(dtype="string")).dropna():
        if len(scratch.rstrip("/")) > 1:
            names[scratch.rstrip("/")] = "<scratch_dir>"
    for path, block in zip(devices["device"], devices["block_device"], strict=True):
        if isinstance(path, str) and path.startswith("/") and not path.startswith("/dev/"):
            names[path.rstrip("/") or path] = f"<device {'?' if pd.isna(block) else block}>"
    names = {path: name for path, name in names.items() if path.startswith("/") and path != "/"}
    return names | {json.dumps(p)[1:-1]: n for p, n in names.items() if json.dumps(p)[1:-1] != p}
