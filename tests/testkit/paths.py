"""Where the suite finds the repository, the shipped sample and the venv's commands."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "sample"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
# the venv's bin folder: snakemake and luksbench as the tests' interpreter has them
BIN = Path(sys.executable).parent
