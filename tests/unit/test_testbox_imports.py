"""The test-box side runs on a bare server: every module of luksbench.testbox and luksbench.formats
imports with the analysis stack blocked, and pulls in nothing beyond the standard library."""

from __future__ import annotations

import json
import subprocess
import sys

BLOCKED = ("numpy", "pandas", "scipy", "yaml", "jinja2")

# Runs in a fresh interpreter: the blocker must be in place before luksbench is first imported.
PROBE = """
import importlib, json, pkgutil, sys, traceback

BLOCKED = set(sys.argv[1].split(","))


class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the test box has the standard library only")
        return None


sys.meta_path.insert(0, Blocker())
before = set(sys.modules)
failed, names = {}, ["luksbench", "luksbench.cli"]


def failure(name):
    failed[name] = traceback.format_exc(limit=-3)


for package in ("luksbench.testbox", "luksbench.formats"):
    try:
        root = importlib.import_module(package)
    except Exception:
        failure(package)
        continue
    names.append(package)
    for info in pkgutil.walk_packages(root.__path__, package + ".", onerror=failure):
        names.append(info.name)
for name in names:
    try:
        importlib.import_module(name)
    except Exception:
        failure(name)
stdlib = sys.stdlib_module_names
outside = sorted(
    {m.partition(".")[0] for m in set(sys.modules) - before}
    - set(stdlib) - {"luksbench"}
)
print(json.dumps({"imported": names, "failed": failed, "outside_stdlib": outside}))
"""


def test_the_test_box_side_imports_without_the_analysis_stack():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["failed"] == {}, "\n".join(f"{k}:\n{v}" for k, v in result["failed"].items())
    assert result["outside_stdlib"] == []
    for package in ("luksbench.testbox", "luksbench.formats"):
        modules = [n for n in result["imported"] if n.startswith(package + ".")]
        assert len(modules) >= 2, f"{package}: found only {modules}"
