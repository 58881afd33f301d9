"""The package source files a step runs, found from its imports (stdlib ast, nothing imported).

A workflow rule lists these as inputs, so editing any module the step imports, directly or
through another luksbench module, re-runs it; a new import is followed without editing the rules.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

PACKAGE = "luksbench"


def _module_file(module: str, src_dir: Path) -> Path | None:
    """The file of ``module`` (``luksbench.a.b``) under ``src_dir``, or None if it is not one."""
    base = src_dir.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module an ``from ... import`` names, relative imports resolved against ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def imported_modules(tree: ast.AST, package: str = "") -> set[str]:
    """Every module name an import statement in ``tree`` names, anywhere (functions included):
    ``from a import b`` gives ``a`` and ``a.b`` (which is kept only if it is a module)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _with_parents(module: str) -> list[str]:
    """``a.b.c`` -> a, a.b, a.b.c: importing a module runs its packages' __init__ first."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _data_dirs(path: Path) -> list[Path]:
    """The data folders next to module ``path`` (subfolders that are not packages:
    publish/templates/) that it names in a string (``PackageLoader("luksbench.publish",
    "templates")``): the files it reads at run time."""
    named = {
        node.value.split("/")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    return [
        sub
        for sub in sorted(path.parent.iterdir())
        if sub.is_dir() and sub.name in named and not (sub / "__init__.py").exists()
    ]


def _data_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def package_sources(modules, src_dir: str | Path) -> list[str]:
    """The source files under ``src_dir`` of ``modules`` (luksbench module names) and of every
    luksbench module they import, transitively, with each package's __init__.py and the data
    files a module names (its package's data folder);
    sorted paths as ``src_dir`` is given (relative stays relative). Other packages are ignored; a
    name in ``modules`` that is neither a module nor a name in one is an error naming it."""
    src_dir = Path(src_dir)
    pending = [m for name in modules for m in _with_parents(name)]
    seen: dict[str, Path] = {}
    while pending:
        module = pending.pop()
        if module in seen or module.split(".")[0] != PACKAGE:
            continue
        path = _module_file(module, src_dir)
        if path is None:
            # `from luksbench.x import name` names luksbench.x.name: not a module, a name in x
            if module in modules and _module_file(module.rpartition(".")[0], src_dir) is None:
                raise ValueError(f"{module}: no such module under {src_dir}")
            continue
        seen[module] = path
        tree = ast.parse(path.read_text(), filename=str(path))
        for found in imported_modules(tree, _package_of(module, path)):
            pending.extend(_with_parents(found))
    files = set(seen.values())
    for path in seen.values():
        for folder in _data_dirs(path):
            files.update(_data_files(folder))
    return sorted(str(p) for p in files)


def notebook_modules(notebook: str | Path) -> list[str]:
    """The luksbench modules a notebook's code cells import (magics and shell lines skipped)."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    found = set()
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError as exc:
            raise ValueError(f"{notebook}: a code cell does not parse: {exc}") from exc
        found.update(imported_modules(tree))
    return sorted(m for m in found if m.split(".")[0] == PACKAGE)
