"""The processed tables as CSV beside their parquet files, and their column dictionary
(``<processed_dir>/README.md``: every table's columns with unit and meaning) from :data:`COLUMNS`,
the one list of them: a column missing here shows as "undocumented" (and fails a test)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import csv

from luksbench.formats.layout import replace_file, replacing

TABLES = {
    "fio": "one row per fio job and direction of every repetition (tidy)",
    "latency": "completion-latency histograms from fio's json+ bins, one row per bin",
    "cryptsetup": "`cryptsetup benchmark` per host: PBKDF and cipher speeds",
    "env": "the environment of each host: kernel, CPU, tool versions",
    "stacks": "every stack measured (or unavailable, with the reason)",
    "job_devices": "each host's disks under the fio jobs (env.json): queues, NUMA node, job CPUs",
    "patterns": "the patterns each host's plan declared (env.json), one row per pattern",
    "plan_fio": "the fio options of each host's plan (env.json), one row per option",
    "plan_stacks": "the stacks each host's plan asked for (env.json), top layer's settings",
    "perf_flags": "dm-crypt perf flags per stack, one row per flag: planned, applied, skipped",
    "stack_notes": "the notes of each stack's description, one row per note",
    "schedule": "when each fio run ran: session, round, place in its cell, times",
    "problems": "raw files left out or noted by ingest, and why",
    "ceph": "one row per fio run of an RBD arm: verified messenger mode, OSD encryption, CPU of OSDs and client",
    "loss": "the loss table: effect of each variant against its baseline per cell and metric",
    "cpu_loss": "the CPU-cost rows of the loss table",
    "arms": "mean over repetitions with its interval, per stack, cell and metric",
    "reps": "every repetition's value per stack and cell (the dots of the figures)",
    "order": "the effect of the stack order within pairs, per comparison and metric",
    "ceph_loss": "Ceph arms: CPU per GiB and per I/O of client and OSDs, each arm against its reference",
    "ceph_arms": "Ceph arms: mean CPU per GiB and per I/O of client and OSDs per arm and cell, with intervals",
    "ceph_reef": "the Ceph Reef study's published % (data/reference) beside each Ceph cell of the same shape",
    "tuning": "dm-crypt settings ranked against the reference arm (and the unencrypted ceiling)",
    "paper_numbers": "every number the paper's answer quotes, one row each, with its source row",
}

# column[, column ...] | unit | meaning
_COLUMN_LINES = """
run | | run name (`data/raw/<run>/`)
host | | host that measured (in a fleet: the fio server)
host_dir | | the raw layout's host folder
hostname, fio_hostname | | host name as capture-env (fio) reported it
stack, baseline, variant | | stack name from the config (baseline: the reference; variant: compared)
kind | | stack kind (plain, luks, md, ...) or benchmark kind (pbkdf2, argon2, cipher)
workload | | cell id: rw-bs-qd (pattern cells: the pattern's name)
pattern | | the pattern a cell belongs to (empty: the plain matrix)
rw | | fio's rw (read, write, randread, randwrite, ...)
bs | | fio's block size as written
bs_bytes, io_bs_bytes | bytes | block size of the cell; bytes per I/O as fio ran it
iodepth | | queue depth
numjobs | | fio jobs
direct, ioengine | | fio's direct I/O flag and I/O engine
rep | | repetition (pair) number
job, job_index, job_slot, groupid | | fio job: name, index in fio's output, slot in the cell, group id
direction | | read, write or trim
ns | ns | completion latency of a histogram bin
count | | I/Os in the bin
file | | raw file (path in the run folder)
runtime_ms, job_runtime_ms | ms | fio's measured runtime (group; job)
io_bytes | bytes | bytes transferred
io_gib | GiB | bytes transferred in GiB
bw_bytes | B/s | bandwidth
iops | 1/s | I/O operations per second
lat_mean_ns, clat_mean_ns, slat_mean_ns, clat_stddev_ns | ns | total, completion and submission latency (mean, SD)
clat_p50_ns, clat_p99_ns, clat_p999_ns, lat_p99_ns, clat_max_ns | ns | latency percentiles and maximum
clat_ios | | completions in the latency histogram
usr_cpu, sys_cpu | % | fio's own user and system CPU share
ctx | | context switches
error | | fio's job error (0: none)
fio_version, cryptsetup_version, qemu_version | | tool versions
timestamp | s | fio's end time (unix seconds)
ss_attained | | fio's steady-state criterion met (1/0; empty without one)
busy_cpu_s, sys_cpu_s, idle_busy_cpu_s | s | CPU seconds over the run (busy, system; idle baseline)
busy_cpu_pct, cpu_util_pct | % | CPU busy share of the run (gross; net of idle)
cpu_interval_s | s | wall time the CPU sample covers
busy_cpu_s_per_gib, sys_cpu_s_per_gib | s/GiB | CPU seconds per GiB moved
busy_cpu_us_per_io | µs | busy CPU per I/O
cpu_net | | whether CPU values are net of the idle baseline
target_pairs, pilot_pairs, hit_cap, noisy | | adaptive design: target, pilot pairs, capped at max_pairs
remeasured_pairs | | the cell's pairs measured again, beyond its design's pairs, to replace pairs fio flagged (an error, a steady state not attained; counted in n_fio_error, n_ss_not_attained); fixed design and adaptive stage 2, from remeasure.json, at most remeasure_flagged_max; 0 when none (the sequential design's replacements: flagged_pairs in targets.json)
session, sessions_planned, sessions | | stack-up session id; sessions planned; sessions in the interval
session_started, session_ended, started, ended | UTC | times of the session and of the fio run
seed, index, round, position_in_cell, status | | schedule: seed, run number, round, place in the cell, outcome
idle_busy_cpu_s_per_s, idle_sys_cpu_s_per_s | s/s | idle CPU baseline of the session per second
idle_busy_pct | % | idle CPU baseline as a share
cpu_model, cpu_count, aes, vaes, kernel | | CPU model, CPUs, AES-NI and VAES flags; kernel release
backend, backend_reason | | test-box backend (kernel, userspace) and why
captured | UTC | when capture-env recorded the host's environment
coordinator | | a fio server of a fleet run: the host that captured the environment and built the stacks (empty: the host itself)
scratch_dir | | the plan's scratch directory on the measuring host
config_hash | | first 16 hex digits of SHA-256 over the host's plan (env.json) as canonical JSON
luks_type, hash, pbkdf | | LUKS header version, its hash and PBKDF as built
sector_size | bytes | dm-crypt sector size (plan_stacks: as asked; empty: the default)
device_size_bytes | bytes | size of the device fio ran on
loop_direct_io | | the loop device below the stack does direct I/O on its backing file
device, backing_file | | the device fio ran on; the file behind a loop device (paths of the measuring machine)
dm_table | | the dm-crypt table of the stack's luks layer (no key; empty: none recorded)
block_device | | the block device under a planned disk (sysfs name)
numa_node, queues, scheduler | | its NUMA node, hardware queues and I/O scheduler
io_poll, nvme_poll_queues | | polled I/O enabled on the queue; nvme's poll queues
job_cpus | | CPUs the fio jobs ran on (empty: any)
holds_scratch | | the device holds the scratch directory
description | | what a pattern measures, in words (the config's)
io_bs, fsync_per_block, sync, rate_pct | | a pattern's I/O size inside each block, fsync per block, O_SYNC writes, rate as % of the unthrottled baseline
option, option_value | | a fio option of the plan and its value as text
flag | | a dm-crypt perf flag (no_read_workqueue, ...)
planned, applied, in_dm_table | | the plan asked for the flag; cryptsetup applied it; it is in the dm table (empty: no table recorded)
skipped_reason | | why the test box did not apply the flag
cipher | | cipher
key_bits | bits | key size
available, reason | | stack built (or cipher available); why not
algorithm | | PBKDF or cipher
iterations_per_s | 1/s | PBKDF2 iterations per second
memory_kib | KiB | argon2 memory cost
threads, time_cost | | argon2 threads and iterations
requested_ms | ms | argon2 time target the costs were calibrated to
encryption_mib_s, decryption_mib_s | MiB/s | cipher speed in memory
source | | who measured a cipher row: `cryptsetup benchmark` (the kernel's cipher) or `userspace estimate (openssl)` (`openssl speed -evp` of the same cipher, where the kernel's could not be benchmarked)
block_bytes | B | buffer size of a userspace estimate (openssl's largest)
note | | notes (a withheld percentile, CPU within noise, no pilot; a stack's, from its description)
severity | | error (left out) or note
metric | | the measured quantity (`bw_bytes`, `iops`, latency, CPU columns above)
higher_is_better | | whether a larger value of the metric is better
n, n_dropped, n_outliers | | pairs used, pairs without both halves, pairs flagged
n_fio_error, n_ss_not_attained | | pairs left out of the estimates because fio reported an error, or a steady state not attained, on either run (the sequential design measures a replacement)
mean, ci_half | as `metric` | mean over repetitions and half-width of its interval
baseline_mean, variant_mean | as `metric` | geometric means of the two arms
mean_log_ratio, sd_log_ratio | | mean and SD of d = ln(variant/baseline)
ratio | | variant / baseline (geometric mean)
effect | | which of loss_pct / increase_pct is filled
effect_pct, loss_pct, increase_pct, ci_low, ci_high | % | how much worse the variant is, with its interval
confidence | | confidence level of the intervals
verdict | | significant, equivalent, inconclusive or insufficient
p_value, q_value | | paired test of no effect (sequential: Bonferroni over the looks); Benjamini-Hochberg q per metric and comparison
equivalence_margin_pct, equiv_low, equiv_high | % | equivalence margin and the 90 % TOST interval (sequential: at the look level)
equivalent | | TOST interval inside the margin
fieller_low, fieller_high, boot_low, boot_high | % | Fieller and BCa bootstrap intervals (cross-checks)
outlier_reps, outliers_excluded | | flagged pairs and whether they were left out
decision | | negligible, moderate, material (gain), undecided or insufficient
decision_lower_pct, decision_upper_pct | % | the decision's margins
interval | | t, stein, sequential, sessions, none or withheld (net CPU whose one idle sample nets every pair)
family_cells | | cells with an interval in the row's family (its metric in its comparison): the m the selection adjustment divides by
selection_confidence | | level of the selection-adjusted interval: 1 - alpha / family_cells (alpha: the row's own, a sequential look's)
selection_ci_low, selection_ci_high | % | the effect's interval at selection_confidence: holds for every cell of the family at once, so for the one picked as the largest
selection_decision | | the decision by magnitude on the selection-adjusted interval
largest | | the family's cell whose own interval has the highest lower end (the largest effect the paper quotes, with the selection-adjusted interval)
p_material, q_material | | one-sided test of "effect > the upper margin" (sequential: times the looks); Benjamini-Hochberg q over the family
material_listed | | material, and q_material <= alpha / 2: listed as material after adjusting for the family's other cells
look_confidence | | sequential design: level of the interval at the look the cell is read at, from its boundary (targets.json)
device_seconds, fixed3_seconds | s | sequential design: the cell's device time (fio's runtimes of every stack); that of its first 3 pairs
fixed3_decision, fixed3_pairs | | sequential design: what the fixed 3-pair design would have decided on the cell's first 3 pairs at the nominal confidence; pairs it used
job_cpu_pct, baseline_job_cpu_pct | % of a core | fio job's usr + sys CPU (the baseline's largest)
baseline_busy_pct | % | the baseline's largest system-wide busy CPU
fio_bound | | a job used > 90 % of a core: fio, not the device, may be the limit
cpu_saturated | | the whole machine was >= 90 % busy during the run
setting, reference, ceiling | | tuning arm; the reference arm; the unencrypted ceiling
recommendation | | recommended (a gain, no cost), costs, undecided, no measured benefit, not measured
rank | | order of the recommended settings (more gains first)
n_gains, n_costs, n_undecided | | rows of the setting decided as gains, costs, undecided (or without an interval)
not_applied | | why the box did not apply the setting (empty: applied)
n_decisions | | decisions against the reference in the family the intervals are adjusted for
row_confidence, family_confidence | | level of each row's Bonferroni interval; of all of them together
metric_label | | what the paper calls the metric
ceiling_effect_pct, ceiling_ci_low, ceiling_ci_high | % | effect and interval against the ceiling
ceiling_decision | | decision by magnitude against the ceiling
pilot_sd_log_ratio | | SD of d in the adaptive pilot
derived_from | | the metric whose test an IOPS row repeats
covers | | what the interval covers (sessions or repetitions)
sd_within_session, sd_between_sessions | | variance components of d
drift_rho | | AR(1) coefficient of d across pairs in time order, pooled over the host's cells of the metric (lag-1 and lag-2, clipped to 0-0.9)
drift_inflation | | factor on the variance of a t or sequential interval for that drift (1: none detected; empty: the interval does not take it)
drift_widening_pct | % | how much wider the interval is for the drift: 100 (sqrt(drift_inflation) - 1)
added, added_low, added_high | as `metric` | CPU rows: variant minus baseline (e.g. added CPU seconds per GiB) with its interval
idle_sample | s | the idle CPU sample a run is netted with (its start, POSIX seconds)
moderated, prior_df, interval_df | | the interval rests on a variance moderated across the host's cells (empirical Bayes, <= 3 sessions); its prior degrees of freedom (inf: the cells share one variance); the degrees of freedom of the interval's t quantile
fio_error, ss_not_attained | | the repetition had a fio error; fio's steady state not reached
n_cells, n_in_order, n_reversed | | cells and pairs run in order and reversed
order_log | | order effect on d
order_pct | % | order effect in percent
key | | the quoted number's name: `<variant>-vs-<baseline>[/<metric>]/<quantity>[/<label>]`
value | as `unit` | the quoted number
unit | | unit of `value` (%, cells, pairs, rows)
quantity, label | | what the number is (cells, count, largest_effect_pct, ...); the decision a count is of
messenger_mode, messenger_mode_seen | | Ceph arm: client messenger mode asked; the one mode every connection of the run's probe client used (verified before fio)
daemon_modes | | Ceph: messenger modes the daemons accept
osd_ids, osd_encryption, osd_encrypted | | Ceph: the arm's OSDs; their block device's encryption (none, dm-crypt, qemu luks); all encrypted
osd_cpu_s, other_daemon_cpu_s | s | Ceph: user + system CPU of the arm's OSD daemons (gross: background included); of the monitor and other OSDs, over daemon_window_s (/proc/<pid>/stat)
daemon_window_s | s | Ceph: wall time the daemons' CPU covers (fio's start to its exit)
osd_peak_rss_bytes | bytes | Ceph: peak resident memory (VmHWM) of the arm's OSDs so far
client_cpu_s, client_window_s | s | Ceph: the client's user + system CPU (see client_cpu_basis); the wall time it covers
client_cpu_basis | | Ceph: what client_cpu_s counts: fio's process tree, every thread (librbd/librados included), or fio's job thread only (its usr_cpu + sys_cpu)
ios | | I/Os of the run (every direction)
osd_cpu_s_per_gib, client_cpu_s_per_gib | s/GiB | Ceph: OSD and client CPU seconds per GiB moved
osd_cpu_us_per_io, client_cpu_us_per_io | µs | Ceph: OSD and client CPU per I/O
on_disk, on_wire | | Ceph arm: OSDs on encrypted devices; client messenger mode secure
section, test_set, clients, io_size, configuration | | published study: table, test set, client processes, I/O size and configuration as published
pct_of_unencrypted_as_published | | published: % of unencrypted performance, as printed
published_loss_pct | % | published: the loss that means (100 - the printed %)
reference_file | | the transcribed table in data/reference the row comes from (its README cites the source)
source_table, source_row | | the processed table a number is read from; its 0-based row (empty: a count over the family)
"""
ENTRIES = [
    ([n.strip() for n in names.split(",")], unit.strip(), meaning.strip())
    for names, unit, meaning in (line.split("|") for line in _COLUMN_LINES.strip().splitlines())
]
COLUMNS = {name: (unit, meaning) for names, unit, meaning in ENTRIES for name in names}


def write_tables(
    processed_dir: Path,
    tables: dict[str, pd.DataFrame],
    machine_paths: dict[str, str] | None = None,
) -> dict[str, Path]:
    """Each table as ``<name>.parquet`` and ``<name>.csv`` in ``processed_dir``, then the folder's
    dictionary; returns {name: parquet path}. ``machine_paths``: {absolute path of the measuring
    machine: what the CSV shows instead} (:func:`without_machine_paths`; parquet keeps them)."""
    out = {name: Path(processed_dir) / f"{name}.parquet" for name in tables}
    # one Arrow table for both files: the CSV is what the parquet file holds (Arrow's writer,
    # several times faster than pandas'; times in ISO 8601 with "Z" for UTC)
    arrow = {name: pa.Table.from_pandas(df, preserve_index=False) for name, df in tables.items()}
    with ThreadPoolExecutor(2) as pool:  # Arrow's writers release the GIL: fio.csv beside the rest
        csvs = {n: without_machine_paths(t, machine_paths or {}) for n, t in arrow.items()}
        writes = [pool.submit(write_csv, t, out[n].with_suffix(".csv")) for n, t in csvs.items()]
        writes += [pool.submit(_replaced, pq.write_table, t, out[n]) for n, t in arrow.items()]
    for write in writes:
        write.result()  # what a writer raised
    write_dictionary(processed_dir)
    return out


def write_dictionary(processed_dir: Path) -> Path:
    """``README.md``: every processed table in ``processed_dir`` with its columns."""
    lines = ["# Processed tables", "", "Each table as parquet and CSV; generated by luksbench.", ""]
    lines += [CSV_NOTE, "", PATHS_NOTE]
    for name, what in TABLES.items():
        path = Path(processed_dir) / f"{name}.parquet"
        if not path.exists():
            continue
        lines += ["", f"## {name} (`{name}.parquet`, `{name}.csv`)", "", what, ""]
        lines += ["| column | unit | meaning |", "|---|---|---|"]
        present = pq.read_schema(path).names
        for names, unit, meaning in ENTRIES:
            if here := [f"`{n}`" for n in names if n in present]:
                lines.append(f"| {', '.join(here)} | {unit} | {meaning} |")
        lines += [f"| `{c}` | | undocumented |" for c in present if c not in COLUMNS]
    readme = Path(processed_dir) / "README.md"
    return replace_file(readme, ("\n".join(lines) + "\n").encode())


#: a text cell a spreadsheet would evaluate as a formula (OWASP's list of leading characters)
FORMULA_START = "=+-@\t\r"
CSV_NOTE = (
    "In the CSV files a text cell that a spreadsheet would evaluate as a formula (one that starts "
    "with `=`, `+`, `-`, `@`, a tab or a carriage return, e.g. a host or job name from a raw run) "
    "starts with an added `'`, so it opens as text; the parquet files keep every value as it is. "
    "Numbers are written as numbers (a negative number stays one)."
)


PATHS_NOTE = (
    "The CSV files carry no absolute path of the measuring machine: a path inside the run's raw "
    "folder is written relative to it (`vm/fio/luks/read-4k-qd1/rep1.json`), the host's scratch "
    "directory as `<scratch_dir>` (its backing files as `<scratch_dir>/luksbench-<run>-luks.img`) "
    "and a planned device that is no `/dev` path as `<device nvme0n1>` (its block device). "
    "The parquet files keep the paths as recorded (the "
    "paper prints them only with `paper.machine_paths: true`)."
)


def without_machine_paths(table: pa.Table, machine_paths: dict[str, str]) -> pa.Table:
    """``table`` with every occurrence of a key of ``machine_paths`` (an absolute path) in a text
    cell replaced by its value, longest path first (a path inside another is replaced whole)."""
    if not machine_paths:
        return table
    order = sorted(machine_paths, key=len, reverse=True)
    columns = []
    for column in table.columns:
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            for path in order:
                column = pc.replace_substring(column, path, machine_paths[path])
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def csv_safe(table: pa.Table) -> pa.Table:
    """``table`` with every text cell that starts like a formula (:data:`FORMULA_START`) prefixed
    with ``'``; other columns (numbers, times, booleans) as they are."""
    pattern = "^[" + re.escape(FORMULA_START) + "]"
    columns = []
    for column in table.columns:
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            formula = pc.fill_null(pc.match_substring_regex(column, pattern), False)
            quote, empty = pa.scalar("'", column.type), pa.scalar("", column.type)
            column = pc.if_else(formula, pc.binary_join_element_wise(quote, column, empty), column)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def csv_safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with :func:`csv_safe`'s rule applied to its text cells, for a CSV pandas writes (to
    standard output: ``luksbench loss``, ``luksbench warehouse --csv``)."""
    out = df.copy()
    for column in out.columns:
        if pd.api.types.is_string_dtype(out[column]) or out[column].dtype == object:
            out[column] = out[column].map(
                lambda v: f"'{v}" if isinstance(v, str) and v[:1] and v[0] in FORMULA_START else v
            )
    return out


def write_csv(table: pa.Table | pd.DataFrame, path: Path) -> Path:
    """``table`` as CSV (Arrow's writer: a header row, strings quoted, empty for missing, times in
    ISO 8601), formula-like text neutralised (:func:`csv_safe`), written by replacing ``path``."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    return _replaced(csv.write_csv, csv_safe(table), path)


def _replaced(writer, table: pa.Table, path: Path) -> Path:
    """``writer(table, <path>)`` into a new file renamed over ``path`` (never through a link)."""
    with replacing(path) as tmp:
        writer(table, tmp)
    return Path(path)
