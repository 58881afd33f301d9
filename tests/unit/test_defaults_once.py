"""Every config default is written once, in workflow/schemas/config.schema.yaml: no module keeps
its own copy (a ``.get("runtime_s", 3)`` or a ``"fill_passes": 2`` table) and config/ states only
values that differ from the schema's. The keys come from the schema itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
LITERAL = r"""(-?\d+(?:\.\d+)?|True|False|"[^"\n]*"|'[^'\n]*')"""


# Values that equal a schema default but are not one, each with its reason.
NOT_DEFAULTS = {
    ("src/luksbench/testbox/cephstack.py", "optional"): (
        "the stacks under an OSD are never optional: the arms over them need them"
    ),
}


def schema_defaults() -> dict[str, list[tuple[str, object]]]:
    """key -> [(dotted path, default)] of every config key with a scalar default in the schema,
    the top-level keys and those of its ``$defs`` (a stack layer's ``cipher`` as ``$defs.layer.cipher``)."""
    keys: dict[str, list[tuple[str, object]]] = {}

    def walk(properties: dict, prefix: str) -> None:
        for key, spec in properties.items():
            walk(spec.get("properties") or {}, f"{prefix}{key}.")
            default = spec.get("default")
            if default is not None and not isinstance(default, dict | list):
                keys.setdefault(key, []).append((prefix + key, default))

    schema = yaml.safe_load(SCHEMA.read_text())
    walk(schema["properties"], "")
    for name, definition in (schema.get("$defs") or {}).items():
        walk(definition.get("properties") or {}, f"$defs.{name}.")
    return keys


def same_value(literal: str, default) -> bool:
    value = ast.literal_eval(literal)
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    return (type(value) in (int, float) and type(default) in (int, float) and value == default) or (
        isinstance(value, str) and value == default
    )


def both_numbers(literal: str, default) -> bool:
    """A number where the schema has one: another value of it is as misleading (runtime 3 s)."""
    value = ast.literal_eval(literal)
    return all(type(x) in (int, float) for x in (value, default))


def migration_lines(tree: ast.Module) -> set[int]:
    """Lines of the records' version migrations: what an old file meant is a fact about that file,
    not a default (it must not follow the schema when a default changes)."""
    return {
        line
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and re.fullmatch(r"_migrate_v\d+", node.name)
        for line in range(node.lineno, node.end_lineno + 1)
    }


def default_copies(path: Path, keys: dict) -> set[tuple[str, str, int]]:
    """(file, key, line) of each ``.get("key", <the default, or any number for a number>)`` and
    ``"key": <the schema's default>``."""
    text = path.read_text()
    name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    skip = migration_lines(ast.parse(text))
    found = set()
    for number, line in enumerate(text.splitlines(), 1):
        if number in skip or ("'" not in line and '"' not in line):
            continue
        for key, defaults in keys.items():
            quoted = rf"""["']{re.escape(key)}["']"""
            m = re.search(rf"\.get\(\s*{quoted}\s*,\s*{LITERAL}", line)
            if m and any(same_value(m[1], d) or both_numbers(m[1], d) for _, d in defaults):
                found.add((name, key, number))
            for m in re.finditer(rf"{quoted}\s*:\s*{LITERAL}\s*[,}}\n]", line + "\n"):
                if any(same_value(m[1], d) for _, d in defaults):
                    found.add((name, key, number))
    return found


def test_the_known_keys_come_from_the_schema():
    keys = schema_defaults()
    assert {"runtime_s", "ramp_time_s", "output_format", "pilot_pairs", "max_pairs"} <= set(keys)
    assert ("fio.runtime_s", 2) in keys["runtime_s"]
    assert ("$defs.layer.cipher", "aes-xts-plain64") in keys["cipher"]
    assert ("$defs.layer.mode", "crc") in keys["mode"]


def test_no_module_keeps_its_own_copy_of_a_config_default():
    keys = schema_defaults()
    found = set().union(*(default_copies(p, keys) for p in sorted((REPO / "src").rglob("*.py"))))
    copies = sorted(f"{f}:{n}: {k}" for f, k, n in found if (f, k) not in NOT_DEFAULTS)
    assert not copies, "defaults written outside the schema:\n" + "\n".join(copies)
    gone = sorted(set(NOT_DEFAULTS) - {(f, k) for f, k, _ in found})
    assert not gone, f"no longer there, take them out of NOT_DEFAULTS: {gone}"


def test_the_scan_finds_a_copied_default(tmp_path):
    keys = schema_defaults()
    module = tmp_path / "probe.py"
    module.write_text(
        'def run_seconds(fio):\n    return fio.get("runtime_s", 3)\n\n'
        'FIO = {"ramp_time_s": 1, "output_format": "json"}\n\n'
        'def _migrate_v1(doc):\n    return {"sessions": 1, **doc}\n\n'
        'def _migrate_v2(doc):\n    return {"fill_passes": 2, **doc}\n'
    )
    found = {(k, n) for _, k, n in default_copies(module, keys)}
    # any number in a .get; a table entry only when it is the schema's default; migrations apart
    assert found == {("runtime_s", 2), ("ramp_time_s", 4)}


def config_leaves(doc, prefix: str = ""):
    for key, value in (doc or {}).items():
        if isinstance(value, dict):
            yield from config_leaves(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def test_config_states_only_values_that_differ_from_the_schema():
    defaults = {path: d for entries in schema_defaults().values() for path, d in entries}
    for name in sorted((REPO / "config").glob("*.yaml")):
        doc = yaml.safe_load(name.read_text())
        same = [p for p, v in config_leaves(doc) if p in defaults and v == defaults[p]]
        assert not same, f"{name.name} repeats the schema's default of {same}"
