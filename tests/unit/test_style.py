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
