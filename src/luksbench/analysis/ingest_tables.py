"""The per-host tables of a run folder read from its JSON documents: cryptsetup (and OpenSSL)
ciphers, env, stacks and schedule."""

from __future__ import annotations

import functools
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

ENV_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "run host hostname kernel cpu_model cpu_count aes vaes backend backend_reason fio_version "
    "cryptsetup_version qemu_version env_json"
).split()
ENV_DTYPES = {"boolean": ("aes", "vaes"), "Int64": ("cpu_count",)}  # the others: string

#: an optional stack that could not be built has a row too: available false, with the reason
STACKS_COLUMNS = (  # noqa: SIM905 - a list of names, one word each
    "run host stack kind backend cipher key_bits description_json available reason"
).split()
STACKS_DTYPES = {"Int64": ("key_bits",), "boolean": ("available",)}  # the others: string


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


def env_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host: key facts of ``env.json`` flattened (columns :data:`ENV_COLUMNS`), the
    whole document in ``env_json`` (no env.json: NaNs). Each fio server of a fleet run gets a row
    too, with only the backend known (the coordinator captured the environment and built the
    stacks); its ``env_json`` names the server and its coordinator."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host, env in _host_documents(raw_dir, "env.json", problems, missing={}):
        facts = env_facts(env)
        records.append(
            {"run": run, "host": host.name, **facts, "env_json": json.dumps(env, sort_keys=True)}
        )
        for server in _fleet_servers(host):
            fleet = {"fleet_server": server, "coordinator": host.name}
            records.append(
                {"run": run, "host": server["name"], "env_json": json.dumps(fleet, sort_keys=True)}
                | {"hostname": f"{server.get('address')}:{server.get('port', 8765)}"}
                | {k: facts[k] for k in ("backend", "backend_reason")}
            )
    df = pd.DataFrame.from_records(records, columns=ENV_COLUMNS)
    return _checked(with_dtypes(df, ENV_DTYPES, "string"), raw_dir, problems, strict)


def stacks_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host x stack (columns :data:`STACKS_COLUMNS`) from the stack descriptions the
    runner recorded in ``<host>/fio/manifest.json`` (no key material)."""
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host, manifest in _host_documents(raw_dir, "fio/manifest.json", problems):
        stacks, unavailable = stack_descriptions(manifest)
        for name, desc in sorted(stacks.items()):
            desc = desc if isinstance(desc, dict) else {"value": desc}
            key_bits = desc.get("key_bits", desc.get("key_size"))
            key_bits = key_bits if isinstance(key_bits, int) else None
            reason = unavailable.get(name) or desc.get("unavailable")
            reason = str(reason) if reason else None
            described = (*map(desc.get, ("kind", "backend", "cipher")), key_bits)
            text = json.dumps(desc, sort_keys=True)
            records.append((run, host.name, name, *described, text, not reason, reason))
    df = pd.DataFrame.from_records(records, columns=STACKS_COLUMNS)
    return _checked(with_dtypes(df, STACKS_DTYPES, "string"), raw_dir, problems, strict)


# --------------------------------------------------------------------------------------- schedule

#: the manifest's values of the session, then of each run, then the run's idle CPU sample
#: (:func:`cpucost.run_idle_rates`: per second of wall time, and which sample)
_SESSION_KEYS = ("started", "ended", "seed")
_RUN_KEYS = (  # noqa: SIM905 - a list of names, one word each
    "index round rep stack workload position_in_cell started ended status"
).split()
SCHEDULE_COLUMNS = ["run", "host", "session", "session_started", "session_ended", "seed"]
SCHEDULE_COLUMNS += [*_RUN_KEYS, *cpucost.IDLE_COLUMNS]


def _utc_times(values: list) -> pd.DatetimeIndex:
    """ISO times of manifests as UTC timestamps, naive ones taken as UTC (NaT when missing or
    malformed); one vectorised parse, as a run's manifests record tens of thousands of runs."""
    text = [v if isinstance(v, str) and v else None for v in values]
    times = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    return times.astype("datetime64[ns, UTC]")


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
