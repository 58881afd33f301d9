"""Config is data, strictly: a config file or --config value that YAML would bend (duplicate keys,
alias bombs, NaN, names read as numbers, overlong names) is refused naming the key, quickly,
through `luksbench plan` and through the workflow's dry run.

The subprocess timeouts are hang guards (an alias bomb ran for 15 minutes before), not timings.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate
from testkit.workflow import copy_workflow

from luksbench.studies import (
    MAX_CONFIG_VALUES,
    ConfigError,
    check_config_data,
    load_config_file,
    load_yaml_strictly,
)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
BIN = Path(sys.executable).parent
HANG_GUARD_S = 60


def alias_bomb(levels: int = 9) -> str:
    """Billion laughs in paper.front_matter.tags: 9**levels strings from a few hundred bytes."""
    lines = ["paper:", "  front_matter:", "    tags:", "      - &a [" + ",".join(["lol"] * 9) + "]"]
    previous = "a"
    for name in "bcdefghijkl"[: levels - 1]:
        lines.append(f"      - &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = name
    return "\n".join(lines) + "\n"


#: (file text, what the refusal must name)
HOSTILE_FILES = {
    "alias-bomb": (alias_bomb(), "paper.front_matter.tags"),
    "duplicate-run": ("run: a\nrepetitions: 3\nrun: b\n", "'run' is given twice (lines 1 and 3)"),
    "duplicate-device": (
        "devices:\n  d0: {path: /dev/disk/by-id/x, wipe_serial: S1}\n  d0: {path: /dev/disk/by-id/x}\n",
        "'devices.d0' is given twice (lines 2 and 3)",
    ),
    "confidence-nan": ("analysis:\n  confidence: .nan\n", "'analysis.confidence' (line 2)"),
    "margin-inf": (
        "analysis:\n  equivalence_margin_pct: .inf\n",
        "'analysis.equivalence_margin_pct' (line 2)",
    ),
    "run-007": ("run: 007\n", "config key 'run': 7 is not a name"),
    "run-True": ("run: True\n", "config key 'run': True is not a name"),
    "run-nan": ("run: nan\n", "config key 'run': the name 'nan'"),
    "run-1e3": ("run: '1e3'\n", "config key 'run': the name '1e3'"),
    "run-None": ("run: None\n", "config key 'run': the name 'None'"),
    "stack-nan": (
        "stacks:\n  plain: {kind: plain}\n  nan: {kind: luks}\nanalysis: {variant: nan}\n",
        "config key 'stacks.nan'",
    ),
    "stack-007": ("stacks:\n  plain: {kind: plain}\n  007: {kind: luks}\n", "'stacks.7'"),
    "run-300-chars": ("run: " + "r" * 300 + "\n", "has 300 characters, more than 64"),
    "stack-300-chars": (
        "stacks:\n  plain: {kind: plain}\n  " + "l" * 300 + ": {kind: luks}\n",
        "has 300 characters, more than 64",
    ),
}


#: cases run through the installed `luksbench` (the alias bomb under the hang guard); the others
#: call the same entry point in this process, where an uncaught exception fails the test
THROUGH_THE_COMMAND = ("alias-bomb", "duplicate-run")


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_luksbench_plan_refuses_the_config_naming_the_key(case, tmp_path, capsys):
    from luksbench import cli

    text, named = HOSTILE_FILES[case]
    (tmp_path / "bad.yaml").write_text(text)
    argv = ["plan", "--host", "pytest", "--workdir", str(REPO)]
    argv += ["--configfile", str(tmp_path / "bad.yaml")]
    if case in THROUGH_THE_COMMAND:
        result = subprocess.run(
            [str(BIN / "luksbench"), *argv], capture_output=True, text=True, timeout=HANG_GUARD_S
        )
        code, out, err = result.returncode, result.stdout, result.stderr
        assert "Traceback" not in err
    else:
        code = cli.main(argv)
        out, err = capsys.readouterr()
    assert code == 1, out[-2000:]
    assert named in err, err[-2000:]


@pytest.fixture(scope="module")
def workflow_copy(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("strict") / "work")


def dry_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "snakemake"), "--cores", "1", "-n", "all", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


@pytest.mark.parametrize(
    "case", ["alias-bomb", "duplicate-device", "confidence-nan", "run-007", "stack-nan"]
)
def test_the_dry_run_refuses_the_config_naming_the_key(case, workflow_copy, tmp_path):
    text, named = HOSTILE_FILES[case]
    (tmp_path / "bad.yaml").write_text(text)
    result = dry_run("--configfile", str(tmp_path / "bad.yaml"), cwd=workflow_copy)
    assert result.returncode != 0
    assert named in result.stdout + result.stderr, result.stderr[-3000:]
    assert "run_fio" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("run=007", "config key 'run': 7 is not a name"),
        ("run=nan", "config key 'run': nan is not a finite number"),
        ("run=1e3", "config key 'run': 1000.0 is not a name"),
        ("repetitions=inf", "config key 'repetitions': inf is not a finite number"),
    ],
)
def test_the_dry_run_refuses_a_retyped_config_argument(given, named, workflow_copy):
    """Snakemake reads --config run=007 as the number 7: the text is gone, the value refused."""
    result = dry_run("--config", given, cwd=workflow_copy)
    assert result.returncode != 0
    assert named in result.stdout + result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_a_quoted_date_is_a_name_and_the_dry_run_plans_it(workflow_copy, tmp_path):
    (tmp_path / "ok.yaml").write_text("run: '2026-01-15'\nhost: box-1\n")
    result = dry_run("--configfile", str(tmp_path / "ok.yaml"), cwd=workflow_copy)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "run 2026-01-15 on box-1" in result.stderr


# --- the strict loader itself ----------------------------------------------------------------


def test_aliases_within_the_limit_load_as_yaml_does():
    text = "base: &b {kind: luks, cipher: aes-xts-plain64}\nstacks: {a: *b, c: {<<: *b, x: 1}}\n"
    assert load_yaml_strictly(text, "f.yaml") == yaml.safe_load(text)


def test_an_alias_bomb_is_refused_before_anything_is_built():
    with pytest.raises(
        ConfigError, match=r"f\.yaml: config key 'paper\.front_matter\.tags\["
    ) as err:
        load_yaml_strictly(alias_bomb(levels=11), "f.yaml")
    assert f"more than {MAX_CONFIG_VALUES} values" in str(err.value)


def test_a_recursive_alias_is_refused():
    with pytest.raises(ConfigError, match=r"'paper\.front_matter\.tags\[1\]' contains itself"):
        load_yaml_strictly("paper: {front_matter: {tags: &t [a, *t]}}\n", "f.yaml")


def test_duplicate_keys_in_a_flow_mapping_name_the_line():
    with pytest.raises(ConfigError, match=r"'fio\.runtime_s' is given twice \(lines 2 and 2\)"):
        load_yaml_strictly("run: a\nfio: {runtime_s: 5, runtime_s: 6}\n", "f.yaml")


def test_a_bomb_built_in_python_is_refused_as_the_merged_config():
    """--config values are YAML too (Snakemake's BaseLoader keeps aliases as shared lists)."""
    inner = ["lol"] * 9
    for _ in range(8):
        inner = [inner] * 9
    with pytest.raises(ConfigError, match=r"config key 'paper\.front_matter\.tags"):
        check_config_data({"paper": {"front_matter": {"tags": inner}}})


@pytest.mark.parametrize(
    "name", ["007", "1e3", "nan", "NaN", "inf", "True", "None", "null", "yes", "off", "0x1f", "1_0"]
)
def test_the_schema_refuses_a_name_that_reads_as_something_else(name):
    with pytest.raises(Exception, match="should not be valid under"):
        validate({"run": name}, SCHEMA)
    with pytest.raises(ConfigError, match=f"the name '{name}' reads as a number"):
        check_config_data({"run": name})


@pytest.mark.parametrize("name", ["default", "run-007", "2026-01-15", "nvme0", "luks2", "n1"])
def test_names_with_letters_or_dates_pass(name):
    validate({"run": name}, SCHEMA)
    check_config_data({"run": name, "stacks": {name.lower(): {}, "plain": {}}})


def test_the_seed_studies_and_the_default_pass_the_strict_reading():
    studies = sorted((REPO / "config" / "studies").glob("*.yaml"))
    for path in [REPO / "config" / "config.yaml", *studies]:
        check_config_data(load_yaml_strictly(path.read_text(), str(path)))


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"baseline": "nan"}, "config key 'baseline'"),
        ({"fleet": {"hosts": [{"name": 7, "address": "10.0.0.1"}]}}, "'fleet.hosts[0].name'"),
        ({"analysis": {"comparisons": [{"baseline": "plain", "variant": "True"}]}}, "variant'"),
        ({"devices": {"null": {"size_mib": 64}}}, "config key 'devices.null'"),
        ({"patterns": {"inf": {}}}, "config key 'patterns.inf'"),
    ],
)
def test_every_name_of_the_config_is_checked(config, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        check_config_data(config)


def test_a_deeply_nested_or_huge_file_is_refused():
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_yaml_strictly("paper: {front_matter: {tags: " + "[" * 80 + "]" * 80 + "}}", "f.yaml")
    with pytest.raises(ConfigError, match="more than a config may have"):
        load_yaml_strictly("# " + "x" * (2 << 20), "f.yaml")


def test_a_json_config_file_is_read_as_json_and_as_strictly(tmp_path):
    """Snakemake reads a --configfile as JSON first: tabs are fine, duplicates and NaN are not."""
    good = tmp_path / "good.json"
    good.write_text('{\n\t"run": "json-run",\n\t"repetitions": 4\n}\n')
    assert load_config_file(good) == {"run": "json-run", "repetitions": 4}
    (tmp_path / "twice.json").write_text('{"run": "a", "run": "b"}')
    with pytest.raises(ConfigError, match="'run' is given twice"):
        load_config_file(tmp_path / "twice.json")
    (tmp_path / "nan.json").write_text('{"analysis": {"confidence": NaN}}')
    with pytest.raises(ConfigError, match="NaN is not a finite number"):
        load_config_file(tmp_path / "nan.json")


def test_a_device_mapper_name_past_the_kernel_limit_is_refused():
    check_config_data({"run": "r" * 64, "stacks": {"plain": {}, "l" * 49: {}}})
    with pytest.raises(ConfigError, match=r"config keys 'run' and 'stacks\.l+': the device-mapper"):
        check_config_data({"run": "r" * 64, "stacks": {"plain": {}, "l" * 50: {}}})
