"""Studies: config/studies/<name>.yaml, one per seed study, as the base of a run's config.

A user's config names a study and its devices (``study: scs-2023``, ``devices: {d0: {path:
/dev/disk/by-id/...}}``) for ``snakemake --cores 1 all --configfile mybox.yaml``. The study
replaces the embedded default (config/config.yaml) as the base; the keys the user gives
(--configfile, --config) override it. ``devices`` and ``stacks`` are replaced as a whole, never
merged: a study's scratch-file devices must not survive next to the user's disks under one name.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import yaml

from luksbench.testbox.plan import PlanError

STUDIES_DIR = Path("config/studies")
# where to find config/, workflow/ when not in the workflow directory: the source tree this module
# is in (a checkout, an editable install), else what the package installed (pyproject: data-files)
INSTALLED = (Path(__file__).resolve().parents[2], Path(sys.prefix) / "share" / "luksbench")
REPLACED_WHOLE = ("devices", "stacks")


class StudyError(PlanError):
    """An unknown or unreadable study, or a renamed key: a config that makes no plan."""


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
        study = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise StudyError(f"config key 'study': {path} is not valid YAML: {exc}") from exc
    if not isinstance(study, dict):
        raise StudyError(f"config key 'study': {path} must hold a mapping of config keys")
    return study


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
    config = yaml.safe_load(_found(workdir, "config/config.yaml").read_text()) or {}
    overrides: dict = {}
    for path in configfiles or []:
        overrides = _merge(overrides, yaml.safe_load(Path(path).read_text()) or {})
    config = _merge(config, overrides)
    config = apply_study(config, overrides, _found(workdir, STUDIES_DIR))
    validate(config, str(_found(workdir, "workflow/schemas/config.schema.yaml")))
    return config


def _found(workdir: Path, relative: str | Path) -> Path:
    """``relative`` (the default config, the schema, the studies) in the workflow directory, else
    where the package has it (:data:`INSTALLED`): ``luksbench plan`` works outside a checkout."""
    tree, share = INSTALLED
    found = [workdir / relative, tree / relative, share / Path(relative).name]
    return next((path for path in found if path.exists()), found[0])
