"""The manual's module map (docs/architecture.md, the four package tables under "The package: one
way from raw to paper") lists every module of src/luksbench in the table of its folder, and nothing
that is not there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "luksbench"
FOLDERS = ("testbox", "formats", "analysis", "publish")


def _tables(readme: str) -> dict[str, set[str]]:
    """folder -> the module paths named in the first column of its table."""
    tables: dict[str, set[str]] = {}
    folder = None
    for line in readme.splitlines():
        head = re.match(r"\| [a-z ]+: `(\w+)/`", line)
        if head:
            folder = head[1]
            tables[folder] = set()
        elif folder and line.startswith("|") and not line.startswith("|---"):
            tables[folder] |= set(re.findall(r"`([\w/]+\.py)`", line.split(" | ")[0]))
        elif not line.startswith("|"):
            folder = None
    return tables


def test_the_module_map_lists_every_module_in_its_folders_table():
    tables = _tables((REPO / "docs" / "architecture.md").read_text())
    assert sorted(tables) == sorted(FOLDERS)
    for folder in FOLDERS:
        modules = {
            str(p.relative_to(PACKAGE / folder))
            for p in (PACKAGE / folder).rglob("*.py")
            if p.name != "__init__.py"
        }
        assert tables[folder] == modules, folder
