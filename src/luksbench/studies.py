"""Study profiles: config/profiles/<name>.yaml, one per seed study, as the base of a run's config.

A user's config names a profile and lists its devices::

    profile: scs-2023
    devices:
      nvme0: {path: /dev/disk/by-id/nvme-..., wipe_serial: "S64F..."}

and runs ``snakemake --cores 1 all --configfile mybox.yaml``. The profile replaces the embedded
default (config/config.yaml) as the base; the keys the user gives (--configfile, --config)
override it. ``devices`` and ``stacks`` are replaced as a whole, never merged: a profile's
scratch-file devices must not survive next to the user's disks under the same name.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

REPLACED_WHOLE = ("devices", "stacks")


class ProfileError(ValueError):
    """An unknown or unreadable profile; the message names the config key and the choices."""


def available_profiles(profiles_dir: Path) -> list[str]:
    return sorted(p.stem for p in Path(profiles_dir).glob("*.yaml"))


def load_profile(name: str, profiles_dir: Path) -> dict:
    path = Path(profiles_dir) / f"{name}.yaml"
    if not path.is_file():
        raise ProfileError(
            f"config key 'profile': no profile {name!r} in {profiles_dir}/ "
            f"(available: {', '.join(available_profiles(profiles_dir)) or 'none'})"
        )
    try:
        profile = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"config key 'profile': {path} is not valid YAML: {exc}") from exc
    if not isinstance(profile, dict):
        raise ProfileError(f"config key 'profile': {path} must hold a mapping of config keys")
    return profile


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_profile(config: dict, overrides: dict, profiles_dir: Path) -> dict:
    """The config a run uses: ``config`` unchanged when no profile is named, else the profile
    with ``overrides`` (the user's --configfile/--config keys) on top."""
    name = (overrides or {}).get("profile") or config.get("profile")
    if not name:
        return config
    merged = load_profile(name, profiles_dir)
    for key, value in (overrides or {}).items():
        if key in REPLACED_WHOLE or not isinstance(value, dict):
            merged[key] = copy.deepcopy(value)
        else:
            merged[key] = _merge(merged.get(key) or {}, value)
    merged["profile"] = name
    return merged


def load_config(workdir: Path, configfiles: list[Path] | None = None) -> dict:
    """The config a workflow run in ``workdir`` with ``--configfile``s would use: the embedded
    default, the user's files on top (as Snakemake merges them), the profile, schema defaults."""
    from snakemake.utils import validate

    workdir = Path(workdir)
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text()) or {}
    overrides: dict = {}
    for path in configfiles or []:
        overrides = _merge(overrides, yaml.safe_load(Path(path).read_text()) or {})
    config = _merge(config, overrides)
    config = apply_profile(config, overrides, workdir / "config" / "profiles")
    validate(config, str(workdir / "workflow" / "schemas" / "config.schema.yaml"))
    return config
