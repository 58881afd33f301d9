"""``luksbench testbox ...``: the commands that run on the test box (standard library only).

    luksbench testbox capture-env       --plan P --out env.json
    luksbench testbox benchmark-ciphers [--plan P] --out cryptsetup-benchmark.txt [--cipher C --key-size N]
    luksbench testbox stack-up          --plan P --state STATE.json --describe stacks.json
    luksbench testbox run-fio           --plan P --state STATE.json --raw-host-dir data/raw/<run>/<host> --manifest M.json [--targets T.json [--one-session]]
    luksbench testbox stack-down        [--plan P] --state STATE.json [--record teardown.json]

Progress goes to stderr. Exit codes: 0 ok, 1 failure, 2 usage, 130/143 interrupted (run-fio
leaves the devices up: run stack-down afterwards, as the workflow's error handler does).
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from luksbench.formats.envdoc import write_env
from luksbench.formats.opensslspeed import OPENSSL_SPEED_FILE
from luksbench.testbox import lock
from luksbench.testbox.capture import benchmark_ciphers, benchmark_ciphers_userspace, capture_env
from luksbench.testbox.orphans import watch_session
from luksbench.testbox.planbuild import PlanError, load_plan
from luksbench.testbox.runner import run_fio
from luksbench.testbox.safety import SafetyError
from luksbench.testbox.stacks import stack_down, stack_up
from luksbench.testbox.stopping import Interrupted, raise_on_stop_signals
from luksbench.testbox.sysutil import TestboxError, log, use_c_locale


def _cmd_capture_env(args) -> int:
    plan = load_plan(Path(args.plan))
    lock.acquire(plan)
    env = capture_env(plan)
    write_env(Path(args.out), env)
    b = env["backend"]
    log(f"luksbench testbox capture-env: backend {b['selected']} ({b['reason']}); wrote {args.out}")
    return 0


def _cmd_benchmark_ciphers(args) -> int:
    # Without a plan the lock is held while this command runs: it names no stacks.
    plan = load_plan(Path(args.plan)) if args.plan else None
    lock.acquire(plan, None if plan else Path(args.out).with_name(".benchmark-ciphers.state"))
    extra = []
    if args.cipher:
        extra += ["--cipher", args.cipher]
    if args.key_size:
        extra += ["--key-size", str(args.key_size)]
    out = Path(args.out)
    benchmark_ciphers(out, extra)
    if plan is not None:  # the plan's ciphers cryptsetup could not run: measured in userspace
        kernel = out.read_text(encoding="utf-8", errors="replace")
        benchmark_ciphers_userspace(plan, kernel, out.with_name(OPENSSL_SPEED_FILE))
    return 0  # the tool's own exit code is logged, not a failure of this step


def _cmd_stack_up(args) -> int:
    # SIGTERM, like Ctrl-C, unwinds through stack_up's teardown of what was built so far.
    raise_on_stop_signals(lambda signum: KeyboardInterrupt(signal.Signals(signum).name))
    watch_session()  # killed with the workflow, it unwinds the same way
    stack_up(load_plan(Path(args.plan)), Path(args.state), Path(args.describe))
    return 0


def _cmd_run_fio(args) -> int:
    plan = load_plan(Path(args.plan))
    lock.acquire(plan, Path(args.state))
    watch_session()  # a run-fio outliving its workflow stops its fio and keeps no partial rep
    try:
        return run_fio(
            plan,
            Path(args.state),
            Path(args.raw_host_dir),
            Path(args.manifest),
            Path(args.describe) if args.describe else None,
            Path(args.targets) if args.targets else None,
            one_session=args.one_session,
        )
    except Interrupted as exc:
        return 130 if exc.signum == signal.SIGINT else 143


def _cmd_stack_down(args) -> int:
    record = stack_down(Path(args.state), Path(args.record) if args.record else None)
    return 0 if record["ok"] else 1


def _run(func):
    def wrapper(args) -> int:
        use_c_locale()  # every tool it starts prints what the parsers read
        try:
            return func(args)
        except (TestboxError, PlanError, SafetyError) as exc:
            log(f"luksbench testbox {args.testbox_command}: error: {exc}")
            return 1
        except KeyboardInterrupt:
            log(f"luksbench testbox {args.testbox_command}: interrupted")
            return 130

    return wrapper


PLAN_HELP = "plan.json, as the workflow writes it (data/scratch/<run>/<host>/plan.json)"
STATE_HELP = "STATE.json written by stack-up (no key material)"


def add_testbox_commands(commands) -> None:
    """Register the ``testbox`` command group on the top-level subparsers object."""
    tb = commands.add_parser(
        "testbox",
        help="test-box side: capture env, bring stacks up/down, run fio (standard library only)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = tb.add_subparsers(dest="testbox_command", required=True)

    p = sub.add_parser(
        "capture-env", help="kernel, CPU, tools, backend choice, mitigations -> JSON"
    )
    p.add_argument("--plan", required=True, help=PLAN_HELP)
    p.add_argument("--out", required=True, help="env.json")
    p.set_defaults(func=_run(_cmd_capture_env))

    p = sub.add_parser(
        "benchmark-ciphers",
        help="`cryptsetup benchmark`, output kept verbatim; with --plan, `openssl speed` beside it "
        f"({OPENSSL_SPEED_FILE}) for each plan cipher cryptsetup could not measure (no AF_ALG)",
    )
    p.add_argument("--plan", help="optional; validated, names the run that holds the test box")
    p.add_argument("--out", required=True, help="cryptsetup-benchmark.txt")
    p.add_argument("--cipher", help="pass --cipher to cryptsetup benchmark (default: all)")
    p.add_argument("--key-size", type=int, help="pass --key-size to cryptsetup benchmark")
    p.set_defaults(func=_run(_cmd_benchmark_ciphers))

    p = sub.add_parser("stack-up", help="create backing files, bring stacks up, precondition")
    p.add_argument("--plan", required=True, help=PLAN_HELP)
    p.add_argument(
        "--state", required=True, help="STATE.json for run-fio and stack-down (no key material)"
    )
    p.add_argument(
        "--describe", required=True, help="stacks.json: per-stack description (no key material)"
    )
    p.set_defaults(func=_run(_cmd_stack_up))

    p = sub.add_parser("run-fio", help="run the fio matrix (resumable: existing reps are skipped)")
    p.add_argument("--plan", required=True, help=PLAN_HELP)
    p.add_argument("--state", required=True, help=STATE_HELP)
    p.add_argument("--raw-host-dir", required=True, help="data/raw/<run>/<host>")
    p.add_argument("--manifest", required=True, help="the schedule as run (JSON)")
    p.add_argument("--describe", help="stacks.json from stack-up, recorded with the run")
    p.add_argument(
        "--targets",
        help="adaptive stage 2: targets.json (workload id -> pairs); each cell is topped up to its target",
    )
    p.add_argument(
        "--one-session",
        action="store_true",
        help="a round of the sequential design over sessions: the targets are the pairs in all "
        "sessions together; one stack-up (fresh: the live one is rebuilt when it measured a "
        "round already) measures the round's shortfall as the session it belongs to",
    )
    p.set_defaults(func=_run(_cmd_run_fio))

    p = sub.add_parser(
        "stack-down",
        help="tear everything down and verify (idempotent); with STATE lost, what the scratch "
        "folder beside it shows (FUSE exports, their daemons, backing files, key directories)",
    )
    p.add_argument("--plan", help="optional; STATE holds everything needed")
    p.add_argument("--state", required=True, help=STATE_HELP)
    p.add_argument("--record", help="teardown.json: what was removed, checks passed")
    p.set_defaults(func=_run(_cmd_stack_down))
