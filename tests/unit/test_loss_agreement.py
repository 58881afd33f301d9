"""One loss table: ``luksbench loss`` (the CLI, from raw) and the tables the paper reads (the
workflow's loss stage, from the processed tables) agree on every row of the shipped sample, and
the loss stage records the settings its tables were computed with."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from luksbench.analysis.ingest import write_processed
from luksbench.analysis.loss import run_tables, write_loss
from luksbench.analysis.losssettings import SETTINGS_FILE, LossSettings, default_settings
from luksbench.publish.run import load_run

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"


@pytest.fixture(scope="module")
def processed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("processed") / "sample"
    write_processed(SAMPLE, out)
    return out


def cli_loss(*args: str) -> pd.DataFrame:
    argv = [sys.executable, "-m", "luksbench.cli", "loss", str(SAMPLE), "--format", "csv", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return pd.read_csv(io.StringIO(done.stdout), keep_default_na=False, na_values=[""])


def paper_loss(processed: Path, settings: LossSettings) -> pd.DataFrame:
    """loss.parquet as the paper loads it, written by the workflow's loss stage with ``settings``,
    typed as the CLI's CSV is read back."""
    write_loss(processed, settings)
    loss = load_run(processed).loss
    return pd.read_csv(io.StringIO(loss.to_csv(index=False)), keep_default_na=False, na_values=[""])


@pytest.mark.slow
@pytest.mark.parametrize("options", [[], ["--confidence", "0.9", "--region", "throughput=3,10"]])
def test_the_cli_and_the_paper_agree_on_every_row_of_the_sample(processed, options):
    cli = cli_loss(*options)
    # the workflow's settings: the run's config (the default config here: every stack against
    # the baseline), with the same changes as the CLI's options
    settings = default_settings()
    if options:
        regions = {**settings.decision_regions, "throughput": (3.0, 10.0)}
        settings = settings.replaced(confidence=0.9, decision_regions=regions)
    assert not settings.exact_pairs and settings.comparisons == ()
    paper = paper_loss(processed, settings)
    assert list(cli.columns) == list(paper.columns)
    assert len(cli) == len(paper) > 0
    # every row, every column: the notes ("too few I/Os"), flags and decisions included
    pd.testing.assert_frame_equal(cli, paper, check_exact=False, rtol=1e-9)
    assert paper["note"].str.contains("too few").any() == cli["note"].str.contains("too few").any()
    assert (cli["confidence"] == (0.9 if options else 0.95)).all()


def test_the_loss_stage_records_its_settings_and_a_run_alone_reuses_them(processed, capsys):
    settings = default_settings().replaced(confidence=0.9)
    write_loss(processed, settings, metrics=["bw_bytes"])
    recorded = LossSettings.read(processed / SETTINGS_FILE)
    assert recorded.confidence == 0.9 and recorded.metrics == ("bw_bytes",)
    for name in ("loss", "arms"):
        (processed / f"{name}.parquet").unlink()
    capsys.readouterr()
    run_tables("sample", SAMPLE.parent, processed)  # a notebook opened on its own
    loss = pd.read_parquet(processed / "loss.parquet")
    assert (loss["confidence"] == 0.9).all() and set(loss["metric"]) == {"bw_bytes"}
    assert "using" not in capsys.readouterr().err


def test_a_run_without_recorded_settings_says_which_defaults_it_used(tmp_path, capsys):
    write_processed(SAMPLE, tmp_path)
    run_tables("sample", SAMPLE.parent, tmp_path)
    err = capsys.readouterr().err
    assert f"no {SETTINGS_FILE} in {tmp_path}" in err and "confidence 0.95" in err
    assert "from the default config" in err
    assert LossSettings.read(tmp_path / SETTINGS_FILE).confidence == 0.95


def test_an_unreadable_settings_record_is_refused_naming_file_and_key(tmp_path):
    path = tmp_path / SETTINGS_FILE
    default_settings().write(path)
    path.write_text(path.read_text().replace('"confidence"', '"confidance"'))
    with pytest.raises(ValueError, match=rf"{SETTINGS_FILE}.*confidance"):
        LossSettings.read(path)
