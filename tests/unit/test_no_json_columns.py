"""Ingest flattens every JSON document into columns and long tables once: nothing after it
(src/luksbench outside ingest, formats/ and testbox/; the notebooks) decodes JSON held in a table
column. Found by reading the code: a string or attribute naming a ``*_json`` column, a call of
``json.loads`` (or another JSON decoder) on a row's or table's value, or a decoder mapped over a
column."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "luksbench"
#: the readers of raw documents: JSON is theirs to decode
EXEMPT = ("analysis/ingest", "formats/", "testbox/")
DECODERS = {"loads", "parse_env_json", "json_normalize", "read_json"}
_JSON_COLUMN = re.compile(r"^\w*_json$")
_MODULES = ("json", "self", "pd", "np")


def _decoder(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name in DECODERS


def _from_table(node: ast.AST) -> bool:
    """An expression that reads a value out of a row or table: ``row["x"]``, ``row.get("x")``,
    ``row.x`` (an attribute that is not called)."""
    called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant):
            return True
        attribute = isinstance(sub, ast.Attribute) and id(sub) not in called
        if attribute and isinstance(sub.value, ast.Name) and sub.value.id not in _MODULES:
            return True
        if isinstance(sub, ast.Call) and getattr(sub.func, "attr", None) == "get":
            return True
    return False


def json_column_decoding(source: str) -> list[str]:
    """What in ``source`` decodes a JSON table column (``[]``: nothing)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _JSON_COLUMN.match(node.value):
                found.append(f"line {line}: column {node.value!r}")
        elif isinstance(node, ast.Attribute) and _JSON_COLUMN.match(node.attr):
            if node.attr != "to_json":
                found.append(f"line {line}: column .{node.attr}")
        elif isinstance(node, ast.Name) and node.id == "parse_env_json":
            found.append(f"line {line}: parse_env_json")
        if not isinstance(node, ast.Call):
            continue
        if _decoder(node.func) and any(_from_table(a) for a in node.args):
            found.append(f"line {line}: {ast.unparse(node)[:80]}")
        mapping = getattr(node.func, "attr", None) in ("map", "apply", "transform", "agg")
        if mapping and any(_decoder(a) for a in node.args):
            found.append(f"line {line}: {ast.unparse(node)[:80]}")
    return found


def _notebook_source(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    lines = [
        ln for cell in code for ln in cell.splitlines() if not ln.lstrip().startswith(("%", "!"))
    ]
    return "\n".join(lines)


def test_nothing_after_ingest_decodes_a_json_column():
    sources = {
        str(p.relative_to(PACKAGE)): p.read_text()
        for p in sorted(PACKAGE.rglob("*.py"))
        if not str(p.relative_to(PACKAGE)).startswith(EXEMPT)
    }
    sources |= {p.name: _notebook_source(p) for p in sorted((REPO / "notebooks").glob("*.ipynb"))}
    assert len(sources) > 40  # the package and the notebooks were found
    found = {name: hits for name, text in sources.items() if (hits := json_column_decoding(text))}
    assert found == {}


def test_the_check_finds_each_way_of_decoding_a_column():
    decoding = [
        'doc = parse_env_json(row["env_json"])',
        'doc = json.loads(row["description"])',
        "doc = json.loads(row.description)",
        'doc = json.loads(row.get("plan"))',
        "docs = table['plan'].map(json.loads)",
        "for r in env.itertuples():\n    x = r.env_json",
    ]
    for source in decoding:
        assert json_column_decoding(source), source
    reading_files = [
        "doc = json.loads(path.read_text())",
        'cells = json.loads(Path(nb).read_text())["cells"]',
        "value = json.loads(text)",
        "out.write(table.to_json(orient='records'))",
    ]
    for source in reading_files:
        assert json_column_decoding(source) == [], source
