"""ruff is the project's linter and formatter: the tree (notebooks included) stays clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_check_is_clean():
    result = subprocess.run([str(RUFF), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean():
    result = subprocess.run(
        [str(RUFF), "format", "--check", "."], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_interval_bars_draw_a_mean_at_or_below_zero():
    # net CPU within idle noise can average below 0: its bar has no lower error bar, no error
    import matplotlib.pyplot as plt

    from luksbench.publish.style import interval_bars

    fig, ax = plt.subplots()
    interval_bars(ax, [0, 1, 2], [-0.2, 0.0, 2.0], [0.5, 0.1, 0.5], 0.8, "C0", "net")
    plt.close(fig)


def test_snakefmt_is_clean():
    # line length and file pattern come from pyproject's [tool.snakefmt]
    snakefmt = Path(sys.executable).parent / "snakefmt"
    result = subprocess.run(
        [str(snakefmt), "--check", "Snakefile", "workflow"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
