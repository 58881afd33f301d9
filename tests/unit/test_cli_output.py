"""What a terminal user sees of ``luksbench``: help that matches behaviour, with examples;
``loss`` as a readable table in a terminal, CSV in a pipe, JSON on request, to a file with --out;
``plan`` naming the backend `auto` selects here and the extra a missing package belongs to."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from luksbench import cli
from luksbench.analysis.stats import DEFAULT_METRICS

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
LOSS = ["loss", str(SAMPLE), "--metric", "bw_bytes", "--metric", "clat_p99_ns"]


def luksbench(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "luksbench.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd)


def in_a_terminal(*args: str) -> str:
    """stdout of ``luksbench ARGS`` run with stdout on a pseudo-terminal."""
    leader, follower = pty.openpty()
    argv = [sys.executable, "-m", "luksbench.cli", *args]
    proc = subprocess.Popen(argv, stdout=follower, stderr=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=300) == 0
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_the_loss_help_names_the_default_metrics_it_computes():
    assert cli.LOSS_DEFAULT_METRICS == DEFAULT_METRICS
    text = cli.build_parser()._subparsers._group_actions[0].choices["loss"].format_help()
    flat = " ".join(text.split())
    assert f"{', '.join(DEFAULT_METRICS)} (all {len(DEFAULT_METRICS)};" in flat


def help_text(command: list[str], capsys) -> str:
    """What ``luksbench COMMAND --help`` prints (the parser in this process; the top-level help
    is also checked through a fresh interpreter below)."""
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", [[], ["loss"], ["plan"], ["targets"], ["next"], ["compare"]])
def test_help_is_for_users_with_examples(command, capsys):
    text = help_text(command, capsys)
    assert "examples:\n  luksbench " in text
    assert "argument handling" not in text  # not the module's docstring
    assert max(len(line) for line in text.splitlines()) <= 100


def test_the_command_line_prints_the_same_help(capsys):
    done = luksbench("--help")
    assert done.returncode == 0 and done.stdout == help_text([], capsys)


@pytest.mark.slow
def test_loss_is_a_readable_table_in_a_terminal_and_csv_in_a_pipe():
    shown = in_a_terminal(*LOSS).splitlines()
    assert shown[0].split()[:2] == ["decision", "workload"]
    piped = pd.read_csv(io.StringIO(luksbench(*LOSS).stdout))
    assert len(shown) == len(piped) + 1
    assert piped.equals(pd.read_csv(io.StringIO(luksbench(*LOSS, "--format", "csv").stdout)))
    # each table row: the decision first, the effect and its interval rounded to 0.1
    for line, row in zip(shown[1:], piped.to_dict("records"), strict=True):
        assert line.startswith(row["decision"]) and row["workload"] in line
        if row["ci_low"] == row["ci_low"]:
            assert line.endswith(f"{row['ci_low']:.1f} .. {row['ci_high']:.1f}"), line
        else:
            assert line.endswith(" -"), line
    assert len(piped.columns) > 50 and len(shown[0].split()) < 12


@pytest.mark.slow
def test_loss_as_json_records_to_a_file(tmp_path):
    out = tmp_path / "loss.json"
    done = luksbench(*LOSS, "--format", "json", "--out", str(out))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert f"wrote {out} (json)" in done.stderr
    records = json.loads(out.read_text())
    table = pd.read_csv(io.StringIO(luksbench(*LOSS).stdout))
    assert [r["decision"] for r in records] == table["decision"].tolist()
    assert set(records[0]) == set(table.columns)
    csv_out = tmp_path / "loss.csv"
    assert luksbench(*LOSS, "--out", str(csv_out)).returncode == 0  # --out: csv by default
    assert pd.read_csv(csv_out).equals(table)


def test_loss_to_an_unwritable_file_names_it(tmp_path, capsys):
    code = cli.main([*LOSS, "--out", str(tmp_path / "missing" / "loss.csv")])  # raises nothing
    assert code == 1 and "luksbench loss: --out " in capsys.readouterr().err


def test_plan_names_the_backend_auto_selects_here_and_why(tmp_path, capsys, monkeypatch):
    from luksbench.studies import load_config
    from luksbench.testbox.backends.choose import resolve_plan_backend
    from luksbench.testbox.planbuild import plan_from_config

    monkeypatch.chdir(REPO)
    code = cli.main(["plan", "--host", "pytest"])
    done = capsys.readouterr()
    assert code in (0, 1), done.err  # 1: a destructive action refused here
    line = next(x for x in done.out.splitlines() if x.startswith("  backend here: "))
    plan = plan_from_config(load_config(REPO, None), "pytest", tmp_path)
    assert plan["backend"] == "auto"
    chosen = resolve_plan_backend(plan, try_modprobe=False)
    assert line.endswith(chosen["reason"]) and chosen["reason"].startswith("auto: ")
    assert line.split()[2] == (chosen["selected"] or "none")
    if chosen["selected"] == "userspace":
        assert "not dm-crypt" in line  # a box without device-mapper says what it measures


# A fresh interpreter where snakemake is not installed (the analysis extra without the workflow's)
MISSING_SNAKEMAKE = """
import sys


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "snakemake":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NotInstalled())
from luksbench import cli

sys.exit(cli.main(sys.argv[1:]))
"""


def test_plan_without_the_workflow_extra_says_what_to_install():
    argv = [sys.executable, "-c", MISSING_SNAKEMAKE, "plan", "--host", "pytest"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 1, done.stderr
    assert "snakemake is not installed: pip install 'luksbench[workflow]'" in done.stderr
    assert "invalid config" not in done.stderr and "Traceback" not in done.stderr


def test_the_table_labels_sequential_intervals_by_what_they_are():
    """A sequential row's interval is a repeated confidence interval at the look where the cell
    stopped, at that look's level: the table says so instead of the run's 95 %."""
    from simulate import loss_row

    from luksbench.cli_output import loss_readable, write_loss_output

    cell = {"host": "h", "direction": "read", "effect": "loss"}
    fixed = loss_row([-0.1, -0.12, -0.09], workload="read-4k-qd1", **cell)
    seq = loss_row([-0.1, -0.11] * 4, level=0.9944, kind="sequential", workload="w-1m", **cell)
    table = pd.DataFrame([fixed, seq])
    header, first, second = loss_readable(table, 0.95)
    assert header[-2:] == ["interval", "interval is"] and "95% interval" not in header
    assert first[-1] == "95% CI"
    assert second[-1] == "repeated CI at the stopping look, 99.44%"
    assert second[-2] == f"{seq['ci_low']:.1f} .. {seq['ci_high']:.1f}"
    out = io.StringIO()
    write_loss_output(table, "table", out, 0.95)
    assert out.getvalue().splitlines()[2].endswith("repeated CI at the stopping look, 99.44%")
    # without sequential rows the header gives the one level every interval has
    (header, _) = loss_readable(pd.DataFrame([fixed]), 0.9)
    assert header[-1] == "90% interval"
