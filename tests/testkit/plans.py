"""Configs and plans the tests resolve: a two-stack plan config, a config with patterns, and
what each study (config/studies/) must set up."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from snakemake.utils import validate

from luksbench.testbox.planbuild import plan_from_config, resolve_layer, walk_layers
from testkit.paths import REPO, SCHEMA

STUDIES_DIR = REPO / "config" / "studies"


def fio_settings(runtime_s: int = 1, ramp_time_s: int = 0, ioengine: str = "libaio") -> dict:
    """A plan's ``fio`` section as the small test plans set it: direct I/O, json+ output."""
    return {
        "ioengine": ioengine,
        "direct": True,
        "runtime_s": runtime_s,
        "ramp_time_s": ramp_time_s,
        "output_format": "json+",
    }


def validated(config: dict) -> dict:
    """The config as the workflow sees it: checked against the schema, defaults filled."""
    config = copy.deepcopy(config)
    validate(config, str(SCHEMA))
    return config


def plan_stacks(stacks: dict) -> dict:
    """Config stacks as a plan holds them: the schema's defaults filled (as validation fills a
    config's), then each resolved to its kind's keys."""
    padded = {"zz-pad": {"kind": "plain"}, "zz-pad2": {"kind": "plain"}}
    filled = validated({"stacks": {**padded, **copy.deepcopy(stacks)}})["stacks"]
    return {name: resolve_layer(filled[name], f"stacks.{name}") for name in stacks}


# A plan config as the workflow sees it (the schema's defaults filled): plain and luks,
# 2 x 2 x 2 cells, 3 repetitions.
_PLAN_SETTINGS = {
    "run": "r1",
    "host": "",
    "backend": "auto",
    "scratch_dir": "data/scratch",
    "device_size_mib": 256,
    "precondition": {"enabled": True},
    "baseline": "plain",
    "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks", "key_bits": 256}},
    "matrix": {"rw": ["randread", "read"], "bs": ["4k", "1m"], "iodepth": [1, 32]},
    "fio": fio_settings(runtime_s=2, ramp_time_s=1),
    "repetitions": 3,
    "seed": 7,
}


# --- patterns

KIB, MIB = 1024, 2**20

LARGEBLOCK = {
    "description": "8 KiB buffered I/Os per block, fsync, seek to the next block",
    "matrix": {"rw": ["randread", "randwrite"], "bs": ["4k", "8k", "64k", "1m"], "iodepth": [1]},
    "io_bs": "8k",
    "fsync_per_block": True,
    "fio": {"ioengine": "psync", "direct": False},
}
SYNC = {
    "matrix": {"rw": ["randread", "randwrite"], "bs": ["4k"], "iodepth": [1]},
    "fio": {"ioengine": "psync", "direct": True, "sync": True},
}


def pattern_config(**over) -> dict:
    """A schema-validated config (defaults filled) with two patterns."""
    cfg = {
        "run": "pt",
        "device_size_mib": 64,
        "stacks": {"plain": {"kind": "plain"}, "luks": {"kind": "luks"}},
        "matrix": {"rw": ["randread"], "bs": ["4k"], "iodepth": [1, 32]},
        "fio": {"runtime_s": 1, "ramp_time_s": 0},
        "patterns": {"largeblock": copy.deepcopy(LARGEBLOCK), "sync": copy.deepcopy(SYNC)},
        **over,
    }
    validate(cfg, str(SCHEMA))
    return cfg


def pattern_plan(cfg: dict, tmp_path: Path = Path("/nonexistent")) -> dict:
    return plan_from_config(cfg, "box1", tmp_path / "scratch")


# --- studies

TUNING_ARMS = ("luks-submit", "luks-samecpu", "luks-noreadwq", "luks-nowritewq", "luks-nowq")
TUNING_ARMS += ("luks-highprio", "luks-4k", "luks-key256", "adiantum", "null-cipher")
# What each study needs, from issue 3: the arms with the devices each one names, the baseline and
# primary variant, the number of matrix cells and the study's seconds per fio run.
EXPECTED = {
    "scs-2023": {
        "stacks": {
            "raw": {"d0"},
            "luks": {"d0"},
            "linear": set(),
            "null-cipher": {"d1"},
            "raid0": {"d2", "d3", "d4"},
            "raid0-luks": {"d5", "d6", "d7"},
        },
        "baseline": "raw",
        "variant": "luks",
        "cells": 4 * 6 * 2,
        "runtime_s": 60,
    },
    "ceph-reef-2023": {
        "stacks": {
            "raw": {"d0"},
            "luks": {"d0"},
            "luks-4k": {"d1"},
            "luks-submit": {"d2"},
            "luks-nowq": {"d3"},
            "null-cipher": {"d4"},
        },
        "baseline": "raw",
        "variant": "luks-submit",
        "cells": 2 * 2 * 2 + 2,  # + the "sync" set: 4k randread/randwrite at qd1, O_SYNC
        "runtime_s": 300,
    },
    "ceph-reef-2023-cluster": {
        "stacks": {arm: set() for arm in ("rbd-crc", "rbd-secure", "rbd-luks", "rbd-luks-secure")},
        "baseline": "rbd-crc",
        "variant": "rbd-luks",
        "cells": 2 * 2 * 2,  # the "sync" set is the qd1 cells (an RBD write is durable on ack)
        "runtime_s": 30,  # scaled from the study's 300 s
    },
    "raid5-2012": {
        "stacks": {
            "raid5": {f"d{i}" for i in range(0, 5)},
            "luks-raid5": {f"d{i}" for i in range(5, 10)},
            "linear-raid5": set(),
            "ext4-luks-raid5": {f"d{i}" for i in range(10, 15)},
        },
        "baseline": "raid5",
        "variant": "luks-raid5",
        "cells": 2 * 11 * 1 + 2 * 19,  # + the large-block pattern: 4k..1g
        "runtime_s": 30,
    },
    "ciphers-2010": {
        "stacks": {
            "raw": {"d0"},
            "aes-xts": {"d0"},
            "aes-cbc-essiv": {"d1"},
            "serpent-xts": {"d2"},
            "twofish-xts": {"d3"},
            "cast5-cbc": {"d4"},
            "adiantum": {"d5"},
            "null-cipher": {"d6"},
        },
        "baseline": "raw",
        "variant": "aes-xts",
        "cells": 1,
        "runtime_s": 30,
    },
    "tune-dmcrypt": {
        "stacks": {
            "plain": {"d0"},
            "luks": {"d0"},
            **{arm: {f"d{i}"} for i, arm in enumerate(TUNING_ARMS, start=1)},
        },
        "baseline": "plain",
        "variant": "luks",
        "cells": 2 * 2 + 2 + 2,  # + 1M sequential read/write at qd32, + 4k at equal load
        "runtime_s": 30,
    },
}


PLAN_CONFIG = validated(_PLAN_SETTINGS)


def precondition_settings(**over) -> dict:
    """Every preconditioning option: the schema's defaults, then ``over``."""
    spec = yaml.safe_load(SCHEMA.read_text())["properties"]["precondition"]["properties"]
    return {key: option["default"] for key, option in spec.items()} | over


def load_study(name: str) -> dict:
    return yaml.safe_load((STUDIES_DIR / f"{name}.yaml").read_text())


def luks_layers(stack: dict) -> list[dict]:
    return [
        lay for _, lay in walk_layers(stack, "") if isinstance(lay, dict) and lay["kind"] == "luks"
    ]
