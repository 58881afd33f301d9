"""Snakemake workflow catalog conventions: config/README.md generated from the schema, the
catalog's YAML, workflow/Snakefile, and per-rule conda environments in step with the pip lock."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_config_readme_is_generated_from_the_schema():
    result = subprocess.run(
        [sys.executable, "scripts/config_readme.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    readme = (REPO / "config/README.md").read_text()
    for key in schema["properties"]:
        assert f"**`{key}`**" in readme, key


def test_the_catalog_file_declares_conda_and_the_report():
    catalog = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())
    usage = catalog["usage"]
    assert usage["software-stack-deployment"]["conda"] is True
    assert usage["report"] is True
    # the catalog's standardized layout: workflow/Snakefile, which is the top-level Snakefile
    assert 'include: "../Snakefile"' in (REPO / "workflow/Snakefile").read_text()
