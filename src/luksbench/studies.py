"""Studies: config/studies/<name>.yaml, one per seed study, as the base of a run's config.

A user's config names a study and its devices (``study: scs-2023``, ``devices: {d0: {path:
/dev/disk/by-id/...}}``) for ``snakemake --cores 1 all --configfile mybox.yaml``. The study
replaces the embedded default (config/config.yaml) as the base; the keys the user gives
(--configfile, --config) override it. ``devices`` and ``stacks`` are replaced as a whole, never
merged: a study's scratch-file devices must not survive next to the user's disks under one name.

Config is data, strictly: every config file (the default, the user's, a study) is read with
:func:`load_yaml_strictly` (duplicate keys, YAML aliases past a size, NaN/inf refused naming the
key), and :func:`check_config_data` refuses what YAML or ``--config`` retyped (names that read as
numbers, booleans or nulls; non-finite numbers) before the schema sees the config.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from pathlib import Path

import yaml

from luksbench.formats.plan import walk_layers
from luksbench.testbox.layers import KIND_KEYS
from luksbench.testbox.planbuild import PlanError
from luksbench.testbox.safety import MAPPER_PREFIX

STUDIES_DIR = Path("config/studies")
# where to find config/, workflow/ when not in the workflow directory: the source tree this module
# is in (a checkout, an editable install), else what the package installed (pyproject: data-files)
INSTALLED = (Path(__file__).resolve().parents[2], Path(sys.prefix) / "share" / "luksbench")
REPLACED_WHOLE = ("devices", "stacks")


class StudyError(PlanError):
    """An unknown or unreadable study, or a renamed key: a config that makes no plan."""


class ConfigError(StudyError):
    """A config file or value that is not plain data: duplicate keys, an alias bomb, NaN, a name
    that YAML reads as something else."""


#: bounds of a config: bytes of one file, values once YAML aliases are expanded, nesting
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_DEPTH = 64
#: a name is a path component, a device-mapper name part and a table value
MAX_NAME_CHARS = 64
DM_NAME_MAX = 127  # the kernel's DM_NAME_LEN without its NUL
#: names that YAML 1.1/1.2, Python's float(), papermill or pandas read as a number, boolean or null
#: (the schema's $defs/retyped_name says the same)
RETYPED_NAME = re.compile(
    r"(?i:[0-9][0-9_]*(\.[0-9_]*)?(e[-+]?[0-9]+)?|0x[0-9a-f_]+|0o[0-7_]+|0b[01_]+"
    r"|nan|inf|infinity|none|null|true|false|yes|no|on|off|y|n|na)"
)
_FLOAT_TAG = "tag:yaml.org,2002:float"
_NOT_FINITE = re.compile(r"[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


def load_yaml_strictly(text: str, source: str):
    """The data of one YAML config document, refused (:class:`ConfigError` naming ``source`` and
    the key) when it has a key twice in one mapping, NaN or infinity, more than
    :data:`MAX_CONFIG_VALUES` values once its aliases are expanded, a recursive alias, or nesting
    past :data:`MAX_CONFIG_DEPTH`. Aliases are checked on the composed nodes, before any value
    is built, so a bomb is refused in milliseconds."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{source}: {len(text)} characters, more than a config may have ({MAX_CONFIG_BYTES})"
        )
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node(node, "", source, {}, set(), 0)
        return loader.construct_document(node)
    except RecursionError as exc:
        raise ConfigError(f"{source}: nested too deeply") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from exc
    finally:
        loader.dispose()


def _check_node(node, path: str, source: str, sizes: dict, open_nodes: set, depth: int) -> int:
    """How many values ``node`` stands for with its aliases expanded (each node counted once per
    use, measured once: linear in the document), checking what :func:`load_yaml_strictly` says."""
    where = f"{source}: config key {path or '(top level)'!r}"
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise ConfigError(f"{where} contains itself (a recursive YAML alias)")
    if depth > MAX_CONFIG_DEPTH:
        raise ConfigError(f"{where}: nested deeper than {MAX_CONFIG_DEPTH} levels")
    if isinstance(node, yaml.ScalarNode):
        if node.tag == _FLOAT_TAG and _NOT_FINITE.fullmatch(node.value.strip()):
            raise ConfigError(
                f"{where} (line {node.start_mark.line + 1}): {node.value} is not a finite number"
            )
        return 1
    open_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        _check_duplicate_keys(node, path, source)
        children = [(_child_path(path, key), value) for key, value in node.value]
    else:
        children = [(f"{path}[{i}]", item) for i, item in enumerate(node.value)]
    size = 1
    for child_path, child in children:
        size += _check_node(child, child_path, source, sizes, open_nodes, depth + 1)
        if size > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"{where}: more than {MAX_CONFIG_VALUES} values once its YAML aliases are "
                "expanded (an alias bomb?)"
            )
    open_nodes.discard(id(node))
    sizes[id(node)] = size
    return size


def _child_path(path: str, key) -> str:
    name = key.value if isinstance(key, yaml.ScalarNode) else "?"
    return f"{path}.{name}" if path else str(name)


def _check_duplicate_keys(node, path: str, source: str) -> None:
    seen: dict = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line, ident = key.start_mark.line + 1, (key.tag, key.value)
        if ident in seen:
            raise ConfigError(
                f"{source}: config key {_child_path(path, key)!r} is given twice (lines "
                f"{seen[ident]} and {line}); YAML would silently keep the last"
            )
        seen[ident] = line


def load_config_file(path: Path) -> dict:
    """A config file read strictly (:func:`load_yaml_strictly`, or as JSON first, like
    Snakemake: duplicate keys and NaN/Infinity refused there too); it must hold a mapping."""
    text = Path(path).read_text()
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs(path), parse_constant=_no_nan(path))
    except json.JSONDecodeError:
        data = load_yaml_strictly(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys")
    return data


def _unique_pairs(path: Path):
    def pairs(items: list) -> dict:
        keys = [key for key, _ in items]
        twice = next((key for key in keys if keys.count(key) > 1), None)
        if twice is not None:
            raise ConfigError(f"{path}: config key {twice!r} is given twice in one object")
        return dict(items)

    return pairs


def _no_nan(path: Path):
    def refuse(constant: str):
        raise ConfigError(f"{path}: {constant} is not a finite number")

    return refuse


def check_config_data(config: dict) -> None:
    """Refuse what a strict file check cannot see: values given with --config (Snakemake retypes
    them: run=007 is the number 7), a bomb given there, non-finite numbers, and names (run, host,
    study, stack, device and pattern names, the compared stacks) that are not plain strings or
    that a reader downstream would retype."""
    _check_value(config, "", {}, set(), 0)
    for key, name in _names(config):
        _check_name(key, name)
    _check_mapper_names(config)


def _check_mapper_names(config: dict) -> None:
    """A stack's device-mapper name (luksbench-<run>-<stack>, a -<n> suffix for a second layer)
    must fit the kernel's 127 characters: refused now, not at stack-up."""
    run, stacks = config.get("run"), config.get("stacks")
    if not isinstance(run, str) or not isinstance(stacks, dict):
        return
    for stack in stacks:
        name = f"{MAPPER_PREFIX}{run}-{stack}"
        if len(name) + len("-99") > DM_NAME_MAX:
            raise ConfigError(
                f"config keys 'run' and 'stacks.{stack}': the device-mapper name {name} would "
                f"be {len(name)} characters (at most {DM_NAME_MAX - 3}); shorten either name"
            )


def _check_value(value, path: str, sizes: dict, open_values: set, depth: int) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key {path!r}: {value} is not a finite number")
    if not isinstance(value, (dict, list)):
        return 1
    if id(value) in sizes:
        return sizes[id(value)]
    if id(value) in open_values or depth > MAX_CONFIG_DEPTH:
        raise ConfigError(f"config key {path!r}: contains itself or is nested too deeply")
    open_values.add(id(value))
    items = value.items() if isinstance(value, dict) else enumerate(value)
    size = 1
    for key, item in items:
        child = f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}".lstrip(".")
        size += _check_value(item, child, sizes, open_values, depth + 1)
        if size > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"config key {path!r}: more than {MAX_CONFIG_VALUES} values (an alias bomb?)"
            )
    open_values.discard(id(value))
    sizes[id(value)] = size
    return size


def _names(config: dict):
    """(config key, name) of every name the config gives."""
    for key in ("run", "host", "study", "baseline"):
        if key in config:
            yield key, config[key]
    for section in ("stacks", "devices", "patterns"):
        if isinstance(config.get(section), dict):
            yield from ((f"{section}.{name}", name) for name in config[section])
    fleet = config.get("fleet")
    for i, server in enumerate(fleet.get("hosts") or [] if isinstance(fleet, dict) else []):
        if isinstance(server, dict) and "name" in server:
            yield f"fleet.hosts[{i}].name", server["name"]
    analysis = config.get("analysis")
    if isinstance(analysis, dict):
        for key in ("baseline", "variant"):
            if key in analysis:
                yield f"analysis.{key}", analysis[key]
        for i, pair in enumerate(analysis.get("comparisons") or []):
            for key in ("baseline", "variant"):
                if isinstance(pair, dict) and key in pair:
                    yield f"analysis.comparisons[{i}].{key}", pair[key]


_KINDS = {"int": "a number", "float": "a number", "bool": "a boolean", "NoneType": "null"}
_KINDS.update(date="a date", datetime="a date")


def _check_name(key: str, name) -> None:
    if isinstance(name, str) and name == "" and key in ("host", "study"):
        return
    if not isinstance(name, str):
        raise ConfigError(
            f"config key {key!r}: {name!r} is not a name: YAML (or --config) read it as "
            f"{_KINDS.get(type(name).__name__, type(name).__name__)}. A name is text that reads "
            "as no number, boolean, null or date: use letters (e.g. run-007), or quote a date"
        )
    if RETYPED_NAME.fullmatch(name):
        raise ConfigError(
            f"config key {key!r}: the name {name!r} reads as a number, boolean or null in YAML, "
            "papermill or a spreadsheet; use a name with letters (e.g. run-007)"
        )
    if len(name) > MAX_NAME_CHARS:
        raise ConfigError(
            f"config key {key!r}: the name {name[:20]!r}... has {len(name)} characters, "
            f"more than {MAX_NAME_CHARS}"
        )


def check_layer_kinds(config: dict, schema: Path) -> None:
    """Refuse a layer key that belongs to another kind (``cipher`` on an md layer), naming it,
    unless it holds the schema's default (validation fills every layer key): the plan keeps
    only the layer kind's own keys, so the value would silently do nothing."""
    layer_spec = yaml.safe_load(Path(schema).read_text())["$defs"]["layer"]["properties"]
    defaults = {key: spec["default"] for key, spec in layer_spec.items() if "default" in spec}
    for name, stack in (config.get("stacks") or {}).items():
        for where, layer in walk_layers(stack, f"stacks.{name}"):
            if not isinstance(layer, dict) or layer.get("kind") not in KIND_KEYS:
                continue  # a device name; an unknown kind is refused when the plan is built
            kind = layer["kind"]
            for key, value in layer.items():
                if key in KIND_KEYS[kind] or key in ("kind", "optional"):
                    continue
                if key not in defaults or value != defaults[key]:
                    raise ConfigError(
                        f"config key {where}.{key}: not a setting of kind {kind} "
                        f"(its settings: {', '.join(sorted(KIND_KEYS[kind])) or 'none'})"
                    )


def available_studies(studies_dir: Path) -> list[str]:
    return sorted(p.stem for p in Path(studies_dir).glob("*.yaml"))


def load_study(name: str, studies_dir: Path) -> dict:
    path = Path(studies_dir) / f"{name}.yaml"
    if not path.is_file():
        raise StudyError(
            f"config key 'study': no study {name!r} in {studies_dir}/ "
            f"(available: {', '.join(available_studies(studies_dir)) or 'none'})"
        )
    try:
        return load_config_file(path)
    except ConfigError as exc:
        raise StudyError(f"config key 'study': {exc}") from exc


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_study(config: dict, overrides: dict, studies_dir: Path) -> dict:
    """The config a run uses: ``config`` unchanged when no study is named, else the study
    with ``overrides`` (the user's --configfile/--config keys, also in ``config``) on top. The key
    ``profile`` is refused naming its new spelling: "profiles" are Snakemake's executor profiles."""
    if "profile" in config:
        raise StudyError(f"config key 'profile' is now 'study': write `study: {config['profile']}`")
    overrides = overrides or {}
    name = overrides.get("study") or config.get("study")
    if not name:
        return config
    whole = {k: copy.deepcopy(v) for k, v in overrides.items() if k in REPLACED_WHOLE}
    return {**_merge(load_study(name, studies_dir), overrides), **whole, "study": name}


def load_config(workdir: Path, configfiles: list[Path] | None = None) -> dict:
    """The config a workflow run in ``workdir`` with ``--configfile``s would use: the embedded
    default, the user's files on top (as Snakemake merges them), the study, schema defaults."""
    from snakemake.utils import validate

    workdir = Path(workdir)
    config = load_config_file(_found(workdir, "config/config.yaml"))
    overrides: dict = {}
    for path in configfiles or []:
        overrides = _merge(overrides, load_config_file(path))
    config = _merge(config, overrides)
    config = apply_study(config, overrides, _found(workdir, STUDIES_DIR))
    check_config_data(config)
    schema = _found(workdir, "workflow/schemas/config.schema.yaml")
    validate(config, str(schema))
    check_layer_kinds(config, schema)
    return config


def _found(workdir: Path, relative: str | Path) -> Path:
    """``relative`` (the default config, the schema, the studies) in the workflow directory, else
    where the package has it (:data:`INSTALLED`): ``luksbench plan`` works outside a checkout."""
    tree, share = INSTALLED
    found = [workdir / relative, tree / relative, share / Path(relative).name]
    return next((path for path in found if path.exists()), found[0])
