"""The ``luksbench`` command: argument handling only, the work lives in the modules.

Imports are local to each command so that the test-box commands (standard library only) run on a
minimal server without the analysis stack installed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from luksbench import __version__
from luksbench.cli_output import FORMULA_START as FORMULA_START  # the test keeps it equal
from luksbench.cli_output import csv_text_cell, write_loss_output


def _fail(command: str, message) -> int:
    print(f"luksbench {command}: {message}", file=sys.stderr)
    return 1


def _cmd_parse(args: argparse.Namespace) -> int:
    """Rows of every file to CSV on stdout (formula-like text neutralised, see
    :func:`csv_text_cell`); each bad file named on stderr, exit 1 if any."""
    from luksbench.formats import cryptsetup, fio

    parse, error_type, columns = {
        "fio": (fio.parse_fio_file, fio.FioParseError, fio.FIO_COLUMNS),
        "cryptsetup": (
            cryptsetup.parse_cryptsetup_file,
            cryptsetup.CryptsetupParseError,
            cryptsetup.CRYPTSETUP_COLUMNS,
        ),
    }[args.kind]
    rows: list[dict] = []
    status = 0
    for path in args.files:
        try:
            rows.extend(parse(Path(path)))
        except error_type as exc:
            status = _fail(f"parse {args.kind}", exc)
    writer = csv.DictWriter(sys.stdout, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: csv_text_cell(v) for k, v in row.items()} for row in rows)
    return status


#: ``luksbench loss``'s default metrics (analysis.stats.DEFAULT_METRICS, checked by a unit test;
#: named here so that the help needs no pandas)
LOSS_DEFAULT_METRICS = ("bw_bytes", "iops", "clat_p50_ns", "clat_p99_ns", "clat_p999_ns")
LOSS_DEFAULT_METRICS += ("busy_cpu_s_per_gib", "sys_cpu_s_per_gib", "cpu_util_pct")
LOSS_DEFAULT_METRICS += ("busy_cpu_us_per_io",)


def _cmd_loss(args: argparse.Namespace) -> int:
    from luksbench.analysis.ingest import IngestError
    from luksbench.analysis.losssettings import LossSettings
    from luksbench.analysis.rawloss import raw_loss_table

    try:
        settings = LossSettings.one_pair(
            args.baseline,
            args.variant,
            metrics=args.metric or None,
            confidence=args.confidence,
            equivalence_margin_pct=args.equivalence_margin,
            exclude_outliers=args.exclude_outliers,
            decision_regions=dict(args.region or []),
            source="luksbench loss options",
        )
        table = raw_loss_table(Path(args.raw_dir), settings)
    except (IngestError, FileNotFoundError, ValueError) as exc:
        return _fail("loss", exc)
    to_terminal = args.out is None and sys.stdout.isatty()
    fmt = args.format or ("table" if to_terminal else "csv")
    if args.out is None:
        write_loss_output(table, fmt, sys.stdout, args.confidence)
    else:
        try:
            with open(args.out, "w", encoding="utf-8", newline="") as out:
                write_loss_output(table, fmt, out, args.confidence)
        except OSError as exc:
            return _fail("loss", f"--out {args.out}: {exc.strerror or exc}")
    counts = table["decision"].str.split(":").str[0].value_counts()
    summary = ", ".join(f"{counts[v]} {v}" for v in counts.index)
    noisy = int(table["noisy"].sum())
    print(
        f"luksbench loss: {len(table)} rows (cell x metric): {summary}"
        + (f"; {noisy} noisy (adaptive cap)" if noisy else "")
        + (f"; wrote {args.out} ({fmt})" if args.out else ""),
        file=sys.stderr,
    )
    return 0


def _cmd_targets(args: argparse.Namespace) -> int:
    from luksbench.analysis.design import write_design_targets
    from luksbench.analysis.ingest import IngestError, fio_table

    adaptive = {"metric": args.metric, "pilot_pairs": args.pilot_pairs}
    adaptive |= {"target_half_width_pct": args.target_half_width, "max_pairs": args.max_pairs}
    try:
        doc = write_design_targets(
            fio_table(Path(args.raw_dir)),
            args.host,
            Path(args.out),
            baseline=args.baseline,
            variants=[args.variant],
            adaptive=adaptive,
            confidence=args.confidence,
        )
    except (IngestError, FileNotFoundError, ValueError) as exc:
        return _fail("targets", exc)
    total = sum(doc["pairs"].values())
    print(
        f"luksbench targets: {len(doc['pairs'])} cells, {total} pairs in all, "
        f"{len(doc['noisy'])} at the cap; wrote {args.out}",
        file=sys.stderr,
    )
    return 0


def _region(text: str) -> tuple[str, tuple[float, float]]:
    """``FAMILY=LOWER,UPPER`` (e.g. ``throughput=5,20``) for ``--region``."""
    family, _, margins = text.partition("=")
    try:
        lower, upper = (float(x) for x in margins.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FAMILY=LOWER,UPPER, not {text!r}") from None
    return family, (lower, upper)


def _cmd_compare(args: argparse.Namespace) -> int:
    from luksbench.analysis import runcompare
    from luksbench.publish.comparepage import write_compare

    if Path(args.out).exists() and not Path(args.out).is_dir():
        return _fail(
            "compare", f"--out {args.out} is a file, not a folder: left as it is, nothing written"
        )
    try:
        a = runcompare.load_run_data(args.run_a, args.processed_root, args.raw_root)
        b = runcompare.load_run_data(args.run_b, args.processed_root, args.raw_root)
        table = runcompare.compare_runs(
            a,
            b,
            hosts=args.host,
            stacks=args.stack,
            metrics=args.metric,
            confidence=args.confidence,
            equivalence_margin_pct=args.equivalence_margin,
            unpaired=args.unpaired,
            moderate=not args.no_moderation,
        )
        differences = runcompare.env_differences(a, b, runcompare.host_pairs(a, b, args.host))
        out = write_compare(table, Path(args.out), a, b, differences)
    except (runcompare.CompareError, OSError, ValueError) as exc:
        return _fail("compare", exc)
    sys.stdout.write(out["md"].read_text())
    counts = table["outcome"].value_counts()
    print(
        f"luksbench compare: {len(table)} rows: "
        + ", ".join(f"{counts[k]} {k}" for k in counts.index)
        + f"; written to {', '.join(str(p) for p in out.values())}",
        file=sys.stderr,
    )
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    import socket

    from luksbench.testbox.planbuild import PlanError, load_plan, plan_from_config
    from luksbench.testbox.planview import describe_plan, read_components

    try:
        if args.plan:
            plan = load_plan(Path(args.plan))
        else:
            from luksbench.studies import load_config  # a StudyError is a PlanError

            config = load_config(Path(args.workdir), args.configfile)
            host = args.host or config["host"] or socket.gethostname().split(".")[0]
            scratch = Path(args.workdir) / config["scratch_dir"] / config["run"] / host
            plan = plan_from_config(config, host, scratch)
    except (PlanError, OSError) as exc:
        return _fail("plan", exc)
    except ModuleNotFoundError:
        raise  # main() names the extra to install
    except Exception as exc:  # schema validation errors name the key
        return _fail("plan", f"invalid config: {exc}")
    try:
        components = read_components(args.components) if args.components else None
    except (OSError, ValueError) as exc:
        return _fail("plan", exc)
    lines = describe_plan(plan, args.check_devices, components, args.session_cost_s)
    lines.append(backend_line(plan))
    print("\n".join(lines))
    return 1 if any(line.startswith("  REFUSED ") for line in lines) else 0


def backend_line(plan: dict) -> str:
    """Which backend the plan's ``backend`` (auto, kernel, userspace) selects on this machine and
    why, checked read-only (no modprobe)."""
    from luksbench.testbox.backends.choose import resolve_plan_backend

    chosen = resolve_plan_backend(plan, try_modprobe=False)
    if chosen["selected"] is None:
        return f"  backend here: none can run this plan ({chosen['reason']})"
    what = {"kernel": "dm-crypt in the kernel", "userspace": "qemu-storage-daemon, not dm-crypt"}
    return f"  backend here: {chosen['selected']} ({what[chosen['selected']]}): {chosen['reason']}"


DESCRIPTION = """\
What does disk encryption (LUKS/dm-crypt) cost on this machine, and how sure is that?
The workflow (snakemake) measures and publishes a run; these commands plan a run, drive the
test box and compute a run's statistics from its raw results by hand."""
EXAMPLES = """\
examples:
  luksbench plan                           what the configured run will do, before it runs
  luksbench loss data/raw/sample           the loss per cell and metric, decision first
  luksbench loss data/raw/sample --format json --out loss.json
  luksbench compare data/raw/a data/raw/b --out compare/a-vs-b
  luksbench COMMAND --help                 a command's options and examples"""


#: options several commands share, as argparse keywords (a command may give its own help)
OPTIONS = {
    "--baseline": {"default": "plain", "help": "the reference stack (default: plain)"},
    "--variant": {"default": "luks", "help": "the stack compared with it (default: luks)"},
    "--confidence": {
        "type": float,
        "default": 0.95,
        "help": "confidence level of the intervals (default 0.95)",
    },
    "--equivalence-margin": {
        "type": float,
        "default": 2.0,
        "metavar": "PCT",
        "help": "equivalence margin in percentage points (default 2)",
    },
    "--metric": {"default": "bw_bytes"},
    "--max-pairs": {"type": int, "default": 12, "metavar": "CAP"},
    "--out": {"required": True, "metavar": "FILE", "help": "the targets file to write"},
    "--region": {"action": "append", "type": _region, "metavar": "FAMILY=LOWER,UPPER"},
}


def _paragraphs(text: str) -> str:
    """``text`` wrapped to the terminal's usual width, paragraph by paragraph: the description
    of a command whose epilog holds examples (RawDescriptionHelpFormatter keeps both as written)."""
    import textwrap

    return "\n\n".join(textwrap.fill(part, 79) for part in text.split("\n\n"))


def _options(parser: argparse.ArgumentParser, *flags: str, **changes) -> None:
    """Add the shared options ``flags`` (:data:`OPTIONS`), with this command's ``changes``."""
    for flag in flags:
        parser.add_argument(flag, **OPTIONS[flag] | changes)


def _add_loss_commands(commands) -> None:
    """``luksbench loss`` and ``luksbench targets``: one run's statistics straight from raw."""
    loss = commands.add_parser(
        "loss",
        help="loss table with confidence intervals for one run",
        description=_paragraphs(
            "The cost of VARIANT against BASELINE in every cell (workload) and metric of "
            "one raw run, with paired confidence intervals and a decision by magnitude (negligible, "
            "moderate, material, undecided, insufficient).\n\n"
            "Output: a readable table (decision first, effects rounded) when stdout is a terminal; "
            "the full table as CSV when stdout is a pipe or file or with --out, unless --format "
            "says otherwise. A one-line summary goes to stderr."
        ),
        epilog="examples:\n"
        "  luksbench loss data/raw/sample                     # table in a terminal\n"
        "  luksbench loss data/raw/sample --format csv > loss.csv\n"
        "  luksbench loss data/raw/sample --format json --out loss.json\n"
        "  luksbench loss data/raw/sample --metric bw_bytes --region throughput=3,10",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_arguments(loss)
    loss.add_argument(
        "--metric",
        action="append",
        help="a metric to compute, repeatable; default: "
        f"{', '.join(LOSS_DEFAULT_METRICS)} (all {len(LOSS_DEFAULT_METRICS)}; the mean latencies "
        "lat_mean_ns and clat_mean_ns on request)",
    )
    loss.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        help="table: decision, cell, metric, n, effect and interval, rounded; csv: every column "
        "of the loss table; json: the same as records (default: table on a terminal, else csv)",
    )
    loss.add_argument(
        "--out", metavar="FILE", help="write to FILE instead of stdout (default format: csv)"
    )
    _options(loss, "--confidence", "--equivalence-margin")
    loss.add_argument(
        "--exclude-outliers",
        action="store_true",
        help="leave flagged pairs out of the estimates (they are always counted in n_outliers)",
    )
    _options(
        loss,
        "--region",
        help="decision margins in %% of a metric family (throughput, latency, cpu; default "
        "throughput=5,20 latency=10,50 cpu=10,50): negligible within +-LOWER, moderate up to "
        "UPPER, material beyond",
    )
    loss.set_defaults(func=_cmd_loss)

    targets = commands.add_parser(
        "targets",
        help="adaptive design: each cell's pairs from the pilot (Stein), as the targets file",
        description=_paragraphs(
            "Read the pilot pairs (reps 1..N0) of one host of a raw run and write each "
            "cell's target pairs (Stein's two-stage rule) as the run's targets file: the workflow "
            "writes the same file to <RAW_DIR>/<host>/fio/targets.json, where `luksbench loss` "
            "finds it and gives the cells it lists Stein's interval."
        ),
        epilog="examples:\n"
        "  luksbench targets data/raw/myrun --host mybox --out targets.json\n"
        "  luksbench targets data/raw/myrun --host mybox --target-half-width 3 --max-pairs 20 \\\n"
        "    --out targets.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_arguments(targets, "the host whose pilot pairs count")
    targets.add_argument(
        "--pilot-pairs", type=int, default=4, metavar="N0", help="pilot pairs per cell (default 4)"
    )
    targets.add_argument(
        "--target-half-width",
        type=float,
        default=2.0,
        metavar="PCT",
        help="interval half-width to aim for, in %% (default 2)",
    )
    _options(targets, "--max-pairs", help="most pairs a cell gets (default 12)")
    _options(targets, "--metric", help="the metric whose pilot noise counts")
    _options(targets, "--confidence", "--out")
    targets.set_defaults(func=_cmd_targets)


def _add_run_arguments(parser: argparse.ArgumentParser, host_help: str | None = None) -> None:
    """RAW_DIR, --host (with ``host_help``), --baseline and --variant: one comparison of a run."""
    parser.add_argument("raw_dir", metavar="RAW_DIR", help="one run's folder: data/raw/<run>")
    if host_help:
        parser.add_argument("--host", required=True, help=host_help)
    _options(parser, "--baseline", "--variant")


def _cmd_next(args: argparse.Namespace) -> int:
    from luksbench.analysis.ingest import IngestError, fio_table
    from luksbench.analysis.sequential import next_round

    try:
        doc = next_round(
            fio_table(Path(args.raw_dir)),
            args.host,
            Path(args.out),
            comparisons=[(args.baseline, args.variant)],
            min_pairs=args.min_pairs,
            max_pairs=args.max_pairs,
            budget_s=args.budget_h * 3600,
            metric=args.metric,
            confidence=args.confidence,
            decision_regions=dict(args.region or []),
            boundary=args.boundary,
        )
    except (IngestError, ValueError, OSError) as exc:
        return _fail("next", exc)
    for w, cell in doc["cells"].items():
        print(f"{w}: {cell['n']} pairs, {cell.get('decision', 'no interval')}; {cell['why']}")
    state = "done" if doc["done"] else "another round"
    print(f"luksbench next: {state}; wrote {args.out}")
    return 0


def _add_next_command(commands) -> None:
    nxt = commands.add_parser(
        "next",
        help="sequential design: decide every cell, write the next round's targets file",
        description=_paragraphs(
            "Decide every cell of one host from its pairs so far (intervals valid at any "
            "look: the boundary's level at each of the looks min_pairs..max_pairs) and write the "
            "next round's targets (workload id -> pairs wanted so far; a decided cell keeps its "
            "count). The workflow keeps the file at <RAW_DIR>/<host>/fio/targets.json, where "
            "`luksbench loss` reads it."
        ),
        epilog="examples:\n"
        "  luksbench next data/raw/myrun --host mybox --out data/raw/myrun/mybox/fio/targets.json\n"
        "  luksbench next data/raw/myrun --host mybox --budget-h 6 --boundary obrien-fleming "
        "--out next.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_arguments(nxt, "the host whose cells are decided")
    nxt.add_argument(
        "--min-pairs", type=int, default=3, metavar="N", help="pairs before the first look"
    )
    _options(nxt, "--max-pairs", help="pairs at most per cell")
    nxt.add_argument("--budget-h", type=float, default=0.0, help="device hours (0: no budget)")
    _options(nxt, "--metric", help="the metric whose decisions count")
    _options(nxt, "--confidence")
    _options(
        nxt, "--region", help="decision margins in %% of a metric family, as for `luksbench loss`"
    )
    nxt.add_argument(
        "--boundary",
        default="pocock",  # analysis.boundary.DEFAULT_BOUNDARY (not imported: scipy)
        help="level of each look: pocock (one level, calibrated to the looks; default), "
        "obrien-fleming (Lan-DeMets spending: wide early, narrow late) or bonferroni",
    )
    _options(nxt, "--out")
    nxt.set_defaults(func=_cmd_next)


def _add_parse_command(commands) -> None:
    parse = commands.add_parser("parse", help="parse tool output into tidy CSV on stdout")
    parse_kinds = parse.add_subparsers(dest="kind", required=True)
    for kind, what in (
        ("fio", "fio JSON / json+ output (any version)"),
        ("cryptsetup", "`cryptsetup benchmark` text output"),
    ):
        parse_kind = parse_kinds.add_parser(kind, help=what)
        parse_kind.add_argument("files", nargs="+", metavar="FILE", help="files to parse")
        parse_kind.set_defaults(func=_cmd_parse)


def _add_compare_command(commands) -> None:
    comp = commands.add_parser(
        "compare",
        help="change per cell and stack from run A to run B (two kernels, hosts, settings)",
        description=_paragraphs(
            "Change of bandwidth, IOPS, p99 latency and CPU per GiB from run A to run B, "
            "per cell and stack, with confidence intervals (paired by repetition only when the runs "
            "were measured side by side, else Welch over each run's sessions) and Benjamini-Hochberg "
            "verdicts. Writes "
            "compare.parquet, .csv, .md and a figure to --out; prints the Markdown."
        ),
        epilog="examples:\n"
        "  luksbench compare data/raw/kernel-6.1 data/raw/kernel-6.8 --out compare/kernels\n"
        "  luksbench compare runA runB --host boxA=boxB --stack luks --metric bw_bytes --out cmp",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    comp.add_argument(
        "run_a", metavar="RUN_A", help="data/processed/<run>, data/raw/<run> or a name"
    )
    comp.add_argument("run_b", metavar="RUN_B", help="the run compared with RUN_A, as RUN_A")
    comp.add_argument(
        "--host",
        action="append",
        metavar="HOST[=HOST_B]",
        help="compare this host (or host HOST of A with HOST_B of B); repeatable; default: the "
        "hosts both runs have, or their only hosts",
    )
    comp.add_argument("--stack", action="append", help="only these stacks (repeatable)")
    comp.add_argument(
        "--metric",
        action="append",
        help="bw_bytes, iops, clat_p99_ns, busy_cpu_s_per_gib (default) or any loss-table metric",
    )
    _options(comp, "--confidence", "--equivalence-margin")
    comp.add_argument(
        "--unpaired",
        action="store_true",
        help="never pair repetitions (sessions are the replicates)",
    )
    comp.add_argument(
        "--no-moderation",
        action="store_true",
        help="Welch's interval over session means even with <= 3 sessions (default: the "
        "moderated t, its variance borrowed from the host's other cells)",
    )
    comp.add_argument("--out", required=True, metavar="DIR", help="output folder (not a file)")
    comp.add_argument(
        "--processed-root", type=Path, default=Path("data/processed"), help="where runs' tables are"
    )
    comp.add_argument("--raw-root", type=Path, default=Path("data/raw"), help="where raw runs are")
    comp.set_defaults(func=_cmd_compare)


def _add_plan_command(commands) -> None:
    plan = commands.add_parser(
        "plan",
        help="print what a run will do (matrix, every destructive action) before anything runs",
        description=_paragraphs(
            "Print the plan of a run: stacks and their layers, every destructive action "
            "in order (which scratch files and which allowlisted disks are written), the matrix and "
            "the fio time, and the backend `auto` selects on this machine and why (checked "
            "read-only). Reads the workflow config like `snakemake --configfile F` would, or a "
            "plan.json written by the workflow. Touches nothing. Reading a config needs the "
            "workflow extra (pip install 'luksbench[workflow]'); a plan.json does not."
        ),
        epilog="examples:\n"
        "  luksbench plan                                  # config/config.yaml of this checkout\n"
        "  luksbench plan --configfile config/mybox.yaml --check-devices\n"
        "  luksbench plan --plan data/raw/myrun/myhost/plan.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("--configfile", action="append", type=Path, help="as for snakemake")
    plan.add_argument("--plan", help="a plan.json instead of the config")
    plan.add_argument("--host", help="host name (default: config host, else this machine)")
    plan.add_argument("--workdir", default=".", help="the workflow directory (default: .)")
    plan.add_argument(
        "--check-devices",
        action="store_true",
        help="also check each real disk now (read-only: stable path, mounts, holders, signatures)",
    )
    plan.add_argument(
        "--components",
        type=Path,
        metavar="LOSS_CSV",
        help="an earlier run's loss.csv (measured with sessions): advise pairs per session and "
        "sessions from its variance components (Kalibera-Jones)",
    )
    plan.add_argument(
        "--session-cost-s",
        type=float,
        default=600.0,
        help="seconds a session costs besides its fio runs (stack-up, preconditioning) for "
        "--components (default 600)",
    )
    plan.set_defaults(func=_cmd_plan)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="luksbench",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    _add_parse_command(commands)
    _add_loss_commands(commands)
    _add_next_command(commands)
    _add_compare_command(commands)
    _add_plan_command(commands)

    from luksbench.testbox.commands import add_testbox_commands

    add_testbox_commands(commands)
    return parser


# The import names of each extra's packages (pyproject: [project.optional-dependencies]).
EXTRAS = {
    "analysis": "pandas numpy pyarrow orjson scipy matplotlib seaborn jinja2 markdown_it papermill "
    "ipykernel duckdb",
    "workflow": "snakemake yaml jsonschema",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        extra = next((e for e, names in EXTRAS.items() if top in names.split()), None)
        if extra is None:
            raise
        return _fail(
            args.command,
            f"needs the {extra} packages, and {top} is not installed: "
            f"pip install 'luksbench[{extra}]'",
        )


if __name__ == "__main__":
    sys.exit(main())
