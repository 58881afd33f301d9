"""Placeholder: measure() is started first; the replay follows."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

LONG_PAIRS = 20
MATRIX = {"rw": ["read", "write", "randread", "randwrite"], "bs": ["4k", "1m"], "iodepth": [32]}


def measure(work: Path) -> Path:
    """The default target's stacks and fio settings, eight of its 16 cells, LONG_PAIRS pairs each,
    measured by the workflow in a copy of it."""
    names = ("Snakefile", "workflow", "config", "envs", "notebooks", "src", "data/reference")
    for name in (*names, "profiles/default"):
        src = REPO / name
        if (work / name).exists():
            continue
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / name)
    config = {"run": "sequential-bench", "matrix": MATRIX, "repetitions": LONG_PAIRS}
    (work / "sequential.yaml").write_text(json.dumps(config))
    target = "data/processed/sequential-bench/fio.parquet"
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", target]
    subprocess.run([*cmd, "--configfile", "sequential.yaml"], cwd=work, check=True)
    return work / "data" / "raw" / "sequential-bench"
