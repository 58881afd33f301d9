"""Words and numbers as figures and paper print them: metric names and units, access-pattern
words, cell names, number formatting. Missing values print as "n/a", never as "nan"."""

from __future__ import annotations

import math
import re

import pandas as pd

from luksbench.formats.layout import bs_label

#: metric -> (heading, unit, divisor, decimals)
METRIC_UNITS = {
    "bw_bytes": ("Bandwidth", "MiB/s", 2**20, 1),
    "iops": ("IOPS", "IO/s", 1, 0),
    "clat_p99_ns": ("p99 completion latency", "ms", 1e6, 3),
    "clat_p50_ns": ("median completion latency", "ms", 1e6, 3),
    "clat_p999_ns": ("p99.9 completion latency", "ms", 1e6, 3),
    "clat_mean_ns": ("mean completion latency", "ms", 1e6, 3),
    "lat_mean_ns": ("mean latency", "ms", 1e6, 3),
    "busy_cpu_s_per_gib": ("Busy CPU time per GiB", "CPU s/GiB", 1, 2),
    "sys_cpu_s_per_gib": ("System CPU time per GiB", "CPU s/GiB", 1, 2),
    "cpu_util_pct": ("CPU utilisation", "% of all CPUs", 1, 1),
    "busy_cpu_us_per_io": ("Busy CPU time per I/O", "CPU µs/IO", 1, 1),
}

#: rw pattern -> words, as the SCS post names its tables
RW_WORDS = {
    "read": "sequential read",
    "write": "sequential write",
    "randread": "random read",
    "randwrite": "random write",
    "rw": "sequential read/write",
    "readwrite": "sequential read/write",
    "randrw": "random read/write",
    "trim": "trim",
    "randtrim": "random trim",
}
#: the SCS post's order of access patterns
RW_ORDER = ("read", "write", "randread", "randwrite", "rw", "readwrite", "randrw")
#: fio rw patterns with two directions: their cells name the direction
MIXED_RW = ("rw", "readwrite", "randrw")
METRIC_ORDER = ("bw_bytes", "iops", "clat_p99_ns", "clat_p50_ns", "clat_p999_ns", "clat_mean_ns")
#: loss.parquet's flags of a baseline that could not go faster, as the paper names them
LIMITS = {"fio_bound": "fio-bound", "cpu_saturated": "CPU saturated"}


def decision_kind(decision) -> str:
    """``undecided`` for every ``undecided: straddles ...``; the decision itself otherwise."""
    return str(decision).split(":")[0]


def cpu_net(fio: pd.DataFrame) -> bool:
    """Whether every CPU value of ``fio`` is net of its session's idle baseline (``cpu_net``)."""
    return "cpu_net" in fio and not fio.empty and bool(fio["cpu_net"].eq(True).all())


def cpu_basis(net: bool) -> str:
    """What the CPU values are taken net of, as a caption says it."""
    return "net of the idle baseline" if net else "gross: no idle baseline recorded"


def metric_heading(metric: str) -> str:
    return METRIC_UNITS.get(metric, (metric,))[0]


def metric_label(metric: str) -> str:
    """``Bandwidth (MiB/s)``: an axis label."""
    name, unit = METRIC_UNITS.get(metric, (metric, ""))[:2]
    return f"{name} ({unit})" if unit else name


def rw_words(rw: str) -> str:
    return RW_WORDS.get(str(rw), str(rw))


def rw_rank(rw: str) -> int:
    """Position of ``rw`` in :data:`RW_ORDER` (other patterns after it)."""
    return RW_ORDER.index(rw) if rw in RW_ORDER else len(RW_ORDER)


def sorted_metrics(values) -> list[str]:
    order = {m: i for i, m in enumerate(METRIC_ORDER)}
    return sorted(values, key=lambda m: (order.get(m, len(order)), m))


def missing(x) -> bool:
    if x is None or x is pd.NA:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def fmt_num(x, decimals: int = 1) -> str:
    """Number with thousands separators; "n/a" for missing values."""
    if missing(x):
        return "n/a"
    x = float(x)
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if round(x, decimals) == 0:
        x = 0.0  # no "-0.0"
    return f"{x:,.{decimals}f}"


def fmt_pct(x, decimals: int = 1) -> str:
    return "n/a" if missing(x) else f"{fmt_num(x, decimals)} %"


def fmt_ci(low, high, decimals: int = 1) -> str:
    if missing(low) or missing(high):
        return "[n/a]"
    return f"[{fmt_num(low, decimals)}, {fmt_num(high, decimals)}]"


def fmt_bool(x) -> str:
    return "n/a" if missing(x) else ("yes" if bool(x) else "no")


def fmt_text(x) -> str:
    return "n/a" if missing(x) or str(x).strip() == "" else str(x)


def bs_human(bs_bytes) -> str:
    """4096 -> "4 KiB", 1048576 -> "1 MiB" (the SCS post's labels)."""
    n = int(bs_bytes)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def pattern_name(row) -> str:
    value = row.get("pattern") if hasattr(row, "get") else None
    return value if isinstance(value, str) else ""


def _direction_and_job(row, with_job: bool) -> str:
    """What a cell name adds for a mixed pattern's direction and a multi-job file's job."""
    direction = f" ({row['direction']})" if row["rw"] in MIXED_RW else ""
    return direction + (f", job `{row['job']}`" if with_job else "")


def cell_name(row, with_job: bool = False) -> str:
    """``randread 4k QD32``; mixed patterns add the direction, multi-job files the job name, the
    cells of a config pattern its name (``randwrite 1g QD1 [largeblock]``)."""
    name = f"{row['rw']} {bs_label(int(row['bs_bytes']))} QD{int(row['iodepth'])}"
    pattern = f" [{pattern_name(row)}]" if pattern_name(row) else ""
    return name + _direction_and_job(row, with_job) + pattern


def cell_words(row, multi_host: bool = False, with_job: bool = False) -> str:
    """``sequential write, 1 MiB, QD32`` (+ direction of mixed patterns, host, job)."""
    words = f"{rw_words(row['rw'])}, {bs_human(row['bs_bytes'])}, QD{int(row['iodepth'])}"
    pattern = f", pattern `{pattern_name(row)}`" if pattern_name(row) else ""
    host = f"{row['host']}: " if multi_host else ""
    return host + words + _direction_and_job(row, with_job) + pattern


def effect_ci(row) -> str:
    """``12.3 % [10.1, 14.4]``: a loss row's effect with its interval."""
    return f"{fmt_pct(row['effect_pct'])} {fmt_ci(row['ci_low'], row['ci_high'])}"


def limits(row) -> str:
    """``fio-bound, CPU saturated``: what limited a loss row's baseline ("" when nothing did)."""
    return ", ".join(text for flag, text in LIMITS.items() if bool(row.get(flag) or False))


def multi_job(table: pd.DataFrame, host: str = "host") -> bool:
    """Do some result files hold several jobs (then cells need the job name to be told apart)?"""
    return bool(len(table)) and bool(
        table.groupby([host, "workload"])["job_slot"].nunique().max() > 1
    )


def md_table(header: list[str], rows, fields: list[str] | None = None) -> str:
    """A Markdown table. A ``header`` title ending in ":" heads a right-aligned column (printed
    without the ":", as Markdown's ``---:``); ``rows`` are lists of values or, with ``fields``,
    mappings whose values at those keys fill the columns."""
    if fields:
        rows = [[row[f] for f in fields] for row in rows]
    lines = ["| " + " | ".join(_cell(title.removesuffix(":")) for title in header) + " |"]
    lines.append("|" + "".join("---:|" if title.endswith(":") else "---|" for title in header))
    return "\n".join(lines + ["| " + " | ".join(map(_cell, row)) + " |" for row in rows])


_UNESCAPED_PIPE = re.compile(r"(?<!\\)((?:\\\\)*)\|")


def _cell(value) -> str:
    """A table cell: on one line, its "|" escaped (an already escaped one stays as it is)."""
    text = re.sub(r"[\r\n\x85\u2028\u2029]+", " ", str(value))
    return _UNESCAPED_PIPE.sub(r"\1\\|", text)


# ------------------------------------------------------------------------- escaping for Markdown
# Text from raw data or config reaches Markdown only through md_escape: inert in CommonMark, GFM
# and kramdown (Jekyll), in running text and in table cells, and inside a code span it can at most
# end the span early (the rest is escaped text again). Kept readable: ordinary names (letters,
# digits, ".", "-", "_" inside a word, "(R)") print as they are.
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "{": "&#123;", "}": "&#125;"}
_MD_ENTITIES |= {"$": "&#36;", "~": "&#126;", "@": "&#64;"}
_MD_SPECIAL = re.compile(
    r"(?i)\b(?:https?|ftp|mailto|javascript|vbscript|data|file)(?=:)"  # a scheme: "\:" follows
    r"|(?i:\bwww)(?=\.)"  # GFM's www. autolink: "\." follows
    r"|[\x00-\x1f\x7f\x85\u2028\u2029]"  # line breaks and controls: a space
    r"|(?<=[A-Za-z0-9._+-])@"  # an e-mail address (GFM autolinks it)
    r"|[&<>{}$~\\`*\[\]|!#]"
    r"|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])"  # "_" not inside a word (emphasis)
)
_MD_LINE_START = re.compile(r"^( *(?:\d{1,9}(?=[.)])|))([-+.)])(?= |$)")  # a list marker


def _md_special(match: re.Match) -> str:
    s = match.group(0)
    if len(s) > 1:
        return s + "\\"  # a scheme or "www": the ":" or "." after it is escaped
    if s in _MD_ENTITIES:
        return _MD_ENTITIES[s]
    return " " if s.isspace() or ord(s) < 32 or ord(s) == 127 else "\\" + s


def md_escape(value) -> str:
    """``value`` as inert Markdown text (no HTML, link, image, code span, emphasis, table cell
    break, list, heading or Liquid tag of its own); missing values print as "n/a"."""
    if missing(value):
        return "n/a"
    text = _MD_SPECIAL.sub(_md_special, str(value))
    return _MD_LINE_START.sub(r"\1\\\2", text)


def rst_text(value) -> str:
    """``value`` as plain reStructuredText inside a paragraph (the Snakemake report's captions):
    every ASCII punctuation character behind a backslash (no emphasis, literal, reference, role,
    substitution or target of its own) and every line break or control character a space (so no
    directive such as ``.. include::`` or ``.. raw::`` can start a line)."""
    text = "".join(
        " " if ch.isspace() or ord(ch) < 32 or ord(ch) == 127 else ch for ch in str(value)
    )
    text = text.strip()  # "**text**": strong emphasis ends at a character that is no space
    return "".join(
        f"\\{ch}" if ch.isascii() and not ch.isalnum() and ch != " " else ch for ch in text
    )


def md_escape_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every text value escaped for Markdown (:func:`md_escape`): what a paper built
    from it prints is inert, and names compare with names as before. Missing values and numbers
    stay as they are."""
    out = df.copy()
    for column in out.columns:
        if not pd.api.types.is_string_dtype(out[column]) and out[column].dtype != object:
            continue
        values = out[column].dropna().unique()  # a run has few distinct names: escape those
        changed = {v: e for v in values if isinstance(v, str) and (e := md_escape(v)) != v}
        if changed:
            out[column] = out[column].map(
                lambda v, c=changed: c.get(v, v) if isinstance(v, str) else v
            )
    return out


_PLAIN_CODE = re.compile(r"[^`|{}\x00-\x1f\x7f\x85\u2028\u2029]+")


def md_escape_keeping_code(text) -> str:
    """Text the code wrote with `code` spans around names from data (a figure caption): each span
    kept when what it holds cannot leave it, everything else through :func:`md_escape`."""
    parts = re.split(r"(`[^`]+`)", str(text))
    return "".join(
        part if k % 2 and _PLAIN_CODE.fullmatch(part[1:-1]) else md_escape(part) if part else ""
        for k, part in enumerate(parts)
    )


def decision_words(decision: str) -> str:
    """``undecided (straddles 20 %)`` for the table's ``undecided: straddles 20 %``."""
    head, _, why = decision.partition(": ")
    return f"{head} ({why})" if why else head
