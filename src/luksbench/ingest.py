"""Raw run folder -> tidy tables (pandas), and the processed parquet files.

``fio_table``         one row per fio job x direction, the parser's columns plus where the file sits
                      in the raw layout (run, host, stack, workload, rep) and its CPU sidecar.
``cryptsetup_table``  ``cryptsetup benchmark`` rows per host.
``env_table``         one row per host with the key facts of ``env.json`` flattened.
``stacks_table``      one row per host x stack from ``fio/manifest.json``'s stack descriptions.
``write_processed``   all of the above as ``<processed_dir>/{fio,cryptsetup,env,stacks}.parquet``.

Strict by design: every raw file that cannot be read, does not follow the layout, or holds a failed
fio job is collected and reported in one :class:`IngestError` that names each file and why. Raw is
read-only: nothing here writes into ``raw_dir``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from luksbench.adaptive import read_targets
from luksbench.layout import LayoutError, cpu_rep_path, iter_rep_files, parse_rep_path

GIB = 2**30

#: columns added by :func:`fio_table` in front of the parser's columns
FIO_LAYOUT_COLUMNS = ["run", "host", "stack", "workload", "rep", "job_slot"]
#: columns derived from the CPU sidecar and io_bytes, appended after the parser's columns
FIO_DERIVED_COLUMNS = [
    "io_gib",
    "busy_cpu_s",
    "busy_cpu_pct",
    "sys_cpu_s",
    "cpu_interval_s",
    "busy_cpu_s_per_gib",
    "sys_cpu_s_per_gib",
    # adaptive design (<host>/fio/targets.json); NaN / missing for a fixed design
    "target_pairs",
    "hit_cap",
]

ENV_COLUMNS = [
    "run",
    "host",
    "hostname",
    "kernel",
    "cpu_model",
    "cpu_count",
    "aes",
    "vaes",
    "backend",
    "backend_reason",
    "fio_version",
    "cryptsetup_version",
    "qemu_version",
    "env_json",
]

STACKS_COLUMNS = [
    "run",
    "host",
    "stack",
    "kind",
    "backend",
    "cipher",
    "key_bits",
    "description_json",
]

PROCESSED_FILES = (
    "fio.parquet",
    "cryptsetup.parquet",
    "env.parquet",
    "stacks.parquet",
    "problems.parquet",
)


class IngestError(ValueError):
    """One or more raw files could not be ingested; ``problems`` lists (path, reason)."""

    def __init__(self, raw_dir: Path, problems: list[tuple[Path, str]]):
        self.raw_dir = Path(raw_dir)
        self.problems = problems
        lines = [f"{len(problems)} bad raw file(s) under {raw_dir}:"]
        lines += [f"  {path}: {reason}" for path, reason in problems]
        super().__init__("\n".join(lines))


def run_name(raw_dir: Path) -> str:
    return Path(raw_dir).resolve().name


def host_dirs(raw_dir: Path) -> list[Path]:
    """Host folders of a run: every sub-folder holding env.json or a fio/ folder."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise FileNotFoundError(f"raw run folder not found: {raw_dir}")
    return sorted(
        p
        for p in raw_dir.iterdir()
        if p.is_dir() and ((p / "env.json").exists() or (p / "fio").is_dir())
    )


# --------------------------------------------------------------------------------------------- fio


def _fio_columns() -> list[str]:
    from luksbench.fio import FIO_COLUMNS

    return list(FIO_COLUMNS)


def fio_columns() -> list[str]:
    """Column order of :func:`fio_table` (``host`` of the parser becomes ``fio_hostname``)."""
    parser_cols = ["fio_hostname" if c == "host" else c for c in _fio_columns()]
    return FIO_LAYOUT_COLUMNS + parser_cols + FIO_DERIVED_COLUMNS


def read_cpu_sidecar(path: Path) -> dict:
    """``rep<k>.cpu.json`` -> busy_cpu_s, busy_cpu_pct, sys_cpu_s, cpu_interval_s (ValueError if malformed)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"CPU sidecar is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("CPU sidecar must be a JSON object")
    delta = data.get("delta_s") or {}
    if not isinstance(delta, dict):
        raise ValueError("CPU sidecar: delta_s must be an object")

    def num(value, name):
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"CPU sidecar: {name} is not a number: {value!r}")
        return float(value)

    busy_s = num(data.get("busy_s"), "busy_s")
    if math.isnan(busy_s) and delta:
        busy_s = sum(
            num(v, f"delta_s.{k}") for k, v in delta.items() if k not in ("idle", "iowait")
        )
    return {
        "busy_cpu_s": busy_s,
        "busy_cpu_pct": num(data.get("busy_pct"), "busy_pct"),
        "sys_cpu_s": num(delta.get("system"), "delta_s.system"),
        "cpu_interval_s": num(data.get("interval_s"), "interval_s"),
    }


_NO_CPU = {
    "busy_cpu_s": math.nan,
    "busy_cpu_pct": math.nan,
    "sys_cpu_s": math.nan,
    "cpu_interval_s": math.nan,
}


def _check_rows(rows: list[dict], rep) -> str | None:
    """Reason why parsed rows are unusable for this layout cell, or None."""
    if not rows:
        return "fio output holds no jobs"
    failed = sorted({r.get("job") for r in rows if r.get("error") not in (0, None)}, key=str)
    if failed:
        errs = sorted({r.get("error") for r in rows if r.get("error") not in (0, None)}, key=str)
        return f"fio job(s) {failed} failed with error {errs}"
    idle = sorted({r.get("job") for r in rows if not r.get("io_bytes")}, key=str)
    if idle:
        return f"fio job(s) {idle} moved no data"
    wl = rep.workload
    known = [
        r for r in rows if r.get("rw") and _isnum(r.get("bs_bytes")) and _isnum(r.get("iodepth"))
    ]
    if known and not any(
        r["rw"] == wl.rw and int(r["bs_bytes"]) == wl.bs_bytes and int(r["iodepth"]) == wl.iodepth
        for r in known
    ):
        seen = sorted({f"{r['rw']}-{int(r['bs_bytes'])}B-qd{int(r['iodepth'])}" for r in known})
        return f"no fio job matches the folder's workload {wl.id} (jobs ran {', '.join(seen)})"
    return None


def _relative(path: Path, raw_dir: Path) -> str:
    """Path inside the run folder (processed tables must not depend on where raw sits)."""
    try:
        return Path(path).resolve().relative_to(Path(raw_dir).resolve()).as_posix()
    except ValueError:
        return str(path)


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _isnum(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _job_slots(rows: list[dict]) -> dict[str, int]:
    """Ordinal of each distinct job name in file order: pairs stacks whose job names differ."""
    slots: dict[str, int] = {}
    for r in rows:
        slots.setdefault(r.get("job"), len(slots))
    return slots


def fio_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """All fio results of one run folder as one tidy table (one row per job x direction).

    Columns: :func:`fio_columns`. ``rep`` is the pair index (rep k of every stack forms pair k),
    ``job_slot`` the ordinal of the job name within its file (0 for single-job files), CPU columns
    come from ``rep<k>.cpu.json`` (NaN when the sidecar is absent; the sidecar covers the whole fio
    process, so with several jobs per file every row carries the file's totals and the per-GiB
    columns divide by the file's total I/O).

    With ``strict`` (default) any bad file raises :class:`IngestError` listing every bad file; with
    ``strict=False`` bad files are left out and listed in ``df.attrs["problems"]``.
    """
    from luksbench.fio import FioParseError, parse_fio_file

    raw_dir = Path(raw_dir)
    host_dirs(raw_dir)  # existence check
    run = run_name(raw_dir)
    columns = fio_columns()
    problems: list[tuple[Path, str]] = []
    notes: list[tuple[Path, str]] = []  # used, but worth a look (e.g. several JSON documents)
    records: list[dict] = []
    targets: dict[str, dict] = {}
    for hdir in host_dirs(raw_dir):
        tpath = hdir / "fio" / "targets.json"
        if tpath.exists():
            try:
                targets[hdir.name] = read_targets(tpath)
            except ValueError as exc:
                problems.append((tpath, str(exc)))

    for path in _stray_fio_files(raw_dir):
        problems.append(
            (path, "does not follow <host>/fio/<stack>/<rw>-<bs>-qd<iodepth>/rep<k>.json")
        )

    for path in iter_rep_files(raw_dir):
        try:
            rep = parse_rep_path(path, raw_dir)
        except LayoutError as exc:
            problems.append((path, str(exc)))
            continue
        try:
            rows = parse_fio_file(
                path, warn=lambda message, path=path: notes.append((path, message))
            )
        except FioParseError as exc:
            problems.append((path, str(exc)))
            continue
        except (OSError, ValueError) as exc:  # parser bug or unreadable file: still name the file
            problems.append((path, f"{type(exc).__name__}: {exc}"))
            continue
        reason = _check_rows(rows, rep)
        if reason:
            problems.append((path, reason))
            continue
        cpu_path = cpu_rep_path(path)
        cpu = dict(_NO_CPU)
        if cpu_path.exists():
            try:
                cpu = read_cpu_sidecar(cpu_path)
            except ValueError as exc:
                problems.append((cpu_path, str(exc)))
                continue
        file_gib = sum(float(r.get("io_bytes") or 0) for r in rows) / GIB
        slots = _job_slots(rows)
        target, hit_cap = targets.get(rep.host, {}).get(rep.workload.id, (None, None))
        for r in rows:
            rec = {"fio_hostname" if k == "host" else k: v for k, v in r.items()}
            rec.update(
                file=_relative(path, raw_dir),
                run=run,
                host=rep.host,
                stack=rep.stack,
                workload=rep.workload.id,
                rep=rep.rep,
                job_slot=slots[r.get("job")],
                io_gib=float(r.get("io_bytes") or 0) / GIB,
                **cpu,
            )
            rec["busy_cpu_s_per_gib"] = cpu["busy_cpu_s"] / file_gib if file_gib > 0 else math.nan
            rec["sys_cpu_s_per_gib"] = cpu["sys_cpu_s"] / file_gib if file_gib > 0 else math.nan
            rec["target_pairs"], rec["hit_cap"] = target, hit_cap
            records.append(rec)

    if problems and strict:
        raise IngestError(raw_dir, problems)
    extra = sorted({k for rec in records for k in rec} - set(columns))
    df = pd.DataFrame.from_records(records, columns=columns + extra)
    df = _fio_dtypes(df)
    df.attrs["problems"] = [(str(p), why) for p, why in problems]
    df.attrs["notes"] = [(str(p), why) for p, why in notes]
    return df


def _stray_fio_files(raw_dir: Path) -> Iterable[Path]:
    """JSON files in a workload folder that are neither rep<k>.json nor rep<k>.cpu.json."""
    import re

    ok = re.compile(r"^rep\d+(\.cpu)?\.json$")
    for path in sorted(Path(raw_dir).glob("*/fio/*/*/*")):
        if path.is_file() and not ok.match(path.name) and path.suffix == ".json":
            yield path


def _fio_dtypes(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("rep", "job_slot"):
        df[col] = df[col].astype("int64")
    text = (
        "run",
        "host",
        "stack",
        "workload",
        "fio_hostname",
        "job",
        "direction",
        "rw",
        "file",
        "bs",
    )
    return _typed(df, text_cols=text, bool_cols=("hit_cap",))


def _typed(df: pd.DataFrame, text_cols=(), bool_cols=()) -> pd.DataFrame:
    """Stable parquet types: text -> string, bools -> boolean, numbers (None = missing) -> float64,
    whatever the values of this particular run happen to be (an all-missing column stays typed)."""
    for col in df.columns:
        if df[col].dtype.kind in "iuf" or col in ("rep", "job_slot"):
            continue
        values = df[col].dropna()
        if col in bool_cols or (len(values) and values.map(lambda v: isinstance(v, bool)).all()):
            df[col] = df[col].astype("boolean")
        elif col in text_cols or (len(values) and values.map(lambda v: isinstance(v, str)).any()):
            df[col] = df[col].map(
                lambda v: None if _missing(v) else v if isinstance(v, str) else str(v)
            )
            df[col] = df[col].astype("string")
        else:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    return df


# -------------------------------------------------------------------------------------- cryptsetup


def cryptsetup_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """``<host>/cryptsetup-benchmark.txt`` of every host, parsed; ``run`` and ``host`` in front.

    A host without the file contributes no rows; a file the parser rejects is an :class:`IngestError`.
    """
    from luksbench.cryptsetup import CRYPTSETUP_COLUMNS, CryptsetupParseError, parse_cryptsetup_file

    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host in host_dirs(raw_dir):
        path = host / "cryptsetup-benchmark.txt"
        if not path.exists():
            continue
        try:
            rows = parse_cryptsetup_file(path)
        except (CryptsetupParseError, OSError, ValueError) as exc:
            problems.append((path, str(exc)))
            continue
        rel = _relative(path, raw_dir)
        records += [{"run": run, "host": host.name, **r, "file": rel} for r in rows]
    if problems and strict:
        raise IngestError(raw_dir, problems)
    columns = ["run", "host", *CRYPTSETUP_COLUMNS]
    extra = sorted({k for rec in records for k in rec} - set(columns))
    df = pd.DataFrame.from_records(records, columns=columns + extra)
    df = _typed(df, bool_cols=("available",))
    df.attrs["problems"] = [(str(p), why) for p, why in problems]
    return df


# -------------------------------------------------------------------------------------------- env


def _get(data, *paths, default=None):
    """First value found under any of the dotted paths (``"cpu.model"``)."""
    for path in paths:
        node = data
        for key in path.split("."):
            if isinstance(node, dict) and key in node:
                node = node[key]
            else:
                node = None
                break
        if node is not None and node != "":
            return node
    return default


def _flag(env: dict, name: str):
    """CPU flag as True/False/None from a flags list, a flags string or a {flag: bool} dict."""
    for path in ("cpu.flags", "cpu_flags", "cpuinfo.flags", "cpu.features"):
        flags = _get(env, path)
        if isinstance(flags, dict):
            if name in flags:
                return bool(flags[name])
            continue
        if isinstance(flags, str):
            flags = flags.split()
        if isinstance(flags, list):
            return name in flags
    value = _get(env, f"cpu.{name}", f"cpu.has_{name}", name)
    return None if value is None else bool(value)


def _version(env: dict, tool: str):
    value = _get(
        env,
        f"tools.{tool}.version",
        f"tools.{tool}",
        f"versions.{tool}",
        f"{tool}_version",
        f"{tool}.version",
    )
    if isinstance(value, dict):
        value = value.get("version") or value.get("output") or json.dumps(value, sort_keys=True)
    return None if value is None else str(value).strip().splitlines()[0]


def env_facts(env: dict) -> dict:
    """The key facts of one ``env.json`` (tolerant of how the capture nests them)."""
    backend = _get(env, "backend")
    backend_reason = _get(env, "backend_reason", "backend.reason", "plan.backend_reason")
    if isinstance(
        backend, dict
    ):  # testbox.env.resolve_backend: {"requested", "selected", "reason"}
        backend = backend.get("selected") or backend.get("name") or backend.get("kind")
    kernel = _get(env, "kernel.release", "kernel", "uname.release", "os.kernel")
    if isinstance(kernel, dict):
        kernel = json.dumps(kernel, sort_keys=True)
    cpu_model = _get(
        env, "cpu.model", "cpu.model_name", "cpu_model", "cpuinfo.model_name", "cpu.name"
    )
    cpu_count = _get(env, "cpu.count", "cpu.cpu_count", "cpu_count", "cpu.logical")
    return {
        "hostname": _get(env, "hostname", "host.hostname", "uname.nodename"),
        "kernel": None if kernel is None else str(kernel),
        "cpu_model": None if cpu_model is None else str(cpu_model),
        "cpu_count": cpu_count if isinstance(cpu_count, int) else None,
        "aes": _flag(env, "aes"),
        "vaes": _flag(env, "vaes"),
        "backend": None if backend is None else str(backend),
        "backend_reason": None if backend_reason is None else str(backend_reason),
        "fio_version": _version(env, "fio"),
        "cryptsetup_version": _version(env, "cryptsetup"),
        "qemu_version": _version(env, "qemu-storage-daemon") or _version(env, "qemu"),
    }


def _read_json(path: Path, problems: list) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append((path, f"not readable JSON: {exc}"))
        return None
    if not isinstance(data, dict):
        problems.append((path, "must be a JSON object"))
        return None
    return data


def env_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host: key facts of ``env.json`` flattened (columns :data:`ENV_COLUMNS`).

    ``env_json`` keeps the whole document as text. A host without env.json gets a row of NaNs.
    """
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host in host_dirs(raw_dir):
        path = host / "env.json"
        env = _read_json(path, problems) if path.exists() else {}
        if env is None:
            continue
        records.append(
            {
                "run": run,
                "host": host.name,
                **env_facts(env),
                "env_json": json.dumps(env, sort_keys=True),
            }
        )
    if problems and strict:
        raise IngestError(raw_dir, problems)
    df = pd.DataFrame.from_records(records, columns=ENV_COLUMNS)
    for col in ENV_COLUMNS:
        if col in ("aes", "vaes"):
            df[col] = df[col].astype("boolean")
        elif col == "cpu_count":
            df[col] = df[col].astype("Int64")
        else:
            df[col] = df[col].astype("string")
    df.attrs["problems"] = [(str(p), why) for p, why in problems]
    return df


def stacks_table(raw_dir: Path, strict: bool = True) -> pd.DataFrame:
    """One row per host x stack (columns :data:`STACKS_COLUMNS`).

    The descriptions come from ``<host>/fio/manifest.json`` (``stack_descriptions``, recorded by
    the runner from stack-up; no key material).
    """
    raw_dir = Path(raw_dir)
    run = run_name(raw_dir)
    records, problems = [], []
    for host in host_dirs(raw_dir):
        path = host / "fio" / "manifest.json"
        if not path.exists():
            continue
        manifest = _read_json(path, problems)
        if manifest is None:
            continue
        data = manifest.get("stack_descriptions") or {}
        stacks = data.get("stacks", data) if isinstance(data.get("stacks"), dict) else data
        for name, desc in sorted(stacks.items()):
            desc = desc if isinstance(desc, dict) else {"value": desc}
            key_bits = desc.get("key_bits", desc.get("key_size"))
            records.append(
                {
                    "run": run,
                    "host": host.name,
                    "stack": name,
                    "kind": desc.get("kind"),
                    "backend": desc.get("backend"),
                    "cipher": desc.get("cipher"),
                    "key_bits": key_bits if isinstance(key_bits, int) else None,
                    "description_json": json.dumps(desc, sort_keys=True),
                }
            )
    if problems and strict:
        raise IngestError(raw_dir, problems)
    df = pd.DataFrame.from_records(records, columns=STACKS_COLUMNS)
    for col in STACKS_COLUMNS:
        df[col] = df[col].astype("Int64" if col == "key_bits" else "string")
    df.attrs["problems"] = [(str(p), why) for p, why in problems]
    return df


# ------------------------------------------------------------------------------------- processed


PROBLEMS_COLUMNS = ["file", "severity", "reason"]


def ingest_run(raw_dir: Path, strict: bool = False) -> dict[str, pd.DataFrame]:
    """All tables of one run folder: {"fio", "cryptsetup", "env", "stacks", "problems"}.

    A bad raw file (truncated, empty, text only, not fio output, NaN or negative values, a failed
    fio job, in the wrong place) is left out and listed in the "problems" table with the reason
    (severity "excluded"); files used with a caveat (several JSON documents: the last counts) are
    listed as "note". With ``strict`` any excluded file raises one :class:`IngestError` naming
    every bad file instead. Nothing bad becomes a value in a table.
    """
    raw_dir = Path(raw_dir)
    tables, problems, notes = {}, [], []
    for name, func in (
        ("fio", fio_table),
        ("cryptsetup", cryptsetup_table),
        ("env", env_table),
        ("stacks", stacks_table),
    ):
        table = func(raw_dir, strict=False)
        problems += table.attrs.get("problems", [])
        notes += table.attrs.get("notes", [])
        tables[name] = table
    if problems and strict:
        raise IngestError(raw_dir, [(Path(p), why) for p, why in problems])
    records = [(p, "excluded", why) for p, why in problems] + [(p, "note", why) for p, why in notes]
    tables["problems"] = pd.DataFrame.from_records(
        [(_relative(Path(p), raw_dir), sev, why) for p, sev, why in records],
        columns=PROBLEMS_COLUMNS,
    ).astype("string")
    return tables


def write_processed(raw_dir: Path, processed_dir: Path, strict: bool = False) -> dict[str, Path]:
    """Ingest ``raw_dir`` and write ``<processed_dir>/{fio,cryptsetup,env,stacks,problems}.parquet``.

    Returns {table name: path}. Every excluded file and every note is also printed on stderr,
    naming the file and why. Refuses a ``processed_dir`` inside ``raw_dir`` (raw is read-only).
    """
    raw_dir, processed_dir = Path(raw_dir).resolve(), Path(processed_dir).resolve()
    if processed_dir == raw_dir or raw_dir in processed_dir.parents:
        raise ValueError(
            f"processed_dir {processed_dir} is inside raw_dir {raw_dir}: raw is read-only"
        )
    tables = ingest_run(raw_dir, strict=strict)
    for row in tables["problems"].itertuples():
        print(f"ingest: {row.severity}: {raw_dir / row.file}: {row.reason}", file=sys.stderr)
    processed_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, df in tables.items():
        path = processed_dir / f"{name}.parquet"
        df = df.copy()
        df.attrs = {}
        df.to_parquet(path, index=False)
        out[name] = path
    return out


def read_processed(processed_dir: Path) -> dict[str, pd.DataFrame]:
    """The parquet files written by :func:`write_processed` (plus loss.parquet when present)."""
    processed_dir = Path(processed_dir)
    out = {}
    for name in ("fio", "cryptsetup", "env", "stacks", "problems", "loss"):
        path = processed_dir / f"{name}.parquet"
        if path.exists():
            out[name] = pd.read_parquet(path)
    return out
