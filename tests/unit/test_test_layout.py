"""The suite collects as one: pytest imports test modules by basename (rootdir on sys.path), so
two tiers must not hold files of the same name."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1]


def imported_modules(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports, at any depth (also inside
    functions); relative imports count by their module name."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_module_imports_another():
    """Shared builders live in conftest fixtures or the helper modules (testkit, simulate,
    hostile); a test module, or a helper, that imports a test module or conftest would make one
    test file's edits break another's and tie the suite to pyproject's pythonpath."""
    tests = {p.stem for p in TESTS.rglob("test_*.py")} | {"conftest"}
    offenders = {
        f"{path.relative_to(TESTS)} imports {sorted(imported_modules(path) & tests)}"
        for path in TESTS.rglob("*.py")
        if imported_modules(path) & tests
    }
    assert not offenders, sorted(offenders)


def test_the_scan_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text("def f():\n    from test_y import z\n    import conftest\n")
    assert {"test_y", "conftest"} <= imported_modules(module)


def test_only_the_helper_folder_is_on_the_path():
    """tests/unit is not on sys.path: nothing may rely on importing a unit test module by name."""
    import tomllib

    pyproject = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())
    assert pyproject["tool"]["pytest"]["ini_options"]["pythonpath"] == ["tests"]
