"""Config validation, names, paths and input functions shared by all rules."""

import os
import re
import shlex
import socket
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate
from snakemake_interface_executor_plugins.settings import DeploymentMethod

from luksbench.analysis.contrasts import check_config as check_comparisons
from luksbench.analysis.ingest import PROCESSED_TABLES
from luksbench.analysis.loss import LOSS_TABLES
from luksbench.analysis.stats import check_regions
from luksbench.publish.text import rst_text
from luksbench.studies import (
    STUDIES_DIR,
    apply_study,
    check_config_data,
    check_layer_kinds,
    load_config_file,
)
from luksbench.orchestrate import lifecycle
from luksbench.orchestrate.imports import notebook_modules, package_sources
from luksbench.testbox.planbuild import plan_from_config, workloads, write_plan
from luksbench.testbox.planview import describe_plan
from luksbench.testbox.preflight import check_scratch_space, check_tools
from luksbench.testbox.runner import measurement_final

min_version("8.0")


# --- config: a study (config key `study`) replaces config/config.yaml as the base; the user's own
# --configfile/--config keys (Snakemake's overwrite_config) go on top of it.
# Snakemake's loader keeps the last of two equal keys and expands aliases: every config file is read
# again strictly (duplicates, alias bombs, NaN refused naming the key and line), then the merged
# values (--config retypes run=007 to 7) before anything walks them.
for _configfile in workflow.configfiles:
    load_config_file(_configfile)
check_config_data(config)
_studied = apply_study(config, workflow.config_settings.overwrite_config, STUDIES_DIR)
if _studied is not config:
    config.clear()
    config.update(_studied)
    check_config_data(config)
validate(config, schema="../schemas/config.schema.yaml")
check_layer_kinds(config, Path(str(workflow.current_basedir)) / "../schemas/config.schema.yaml")
# (baseline, variant) pairs the analysis reports, headline first; an error names the key.
COMPARISONS = check_comparisons(config)
# decision margins: 0 < lower_pct < upper_pct in every family (the error names it)
check_regions(config["analysis"]["decision_regions"])
# Adaptive repetitions (two-stage): run_pilot -> plan_repetitions (targets.json) -> run_fio.
# Disabled, run_fio alone measures the fixed design and the two extra rules are not in the DAG.
ADAPTIVE = config["adaptive"]
# Sequential: run_rounds alone (luksbench next, then run-fio --targets, until every cell stopped).
SEQUENTIAL = ADAPTIVE["enabled"] and ADAPTIVE["mode"] == "sequential"

# Rules call the console scripts (luksbench, papermill) of the environment Snakemake runs in, also
# when its bin directory is not on PATH (e.g. `.venv/bin/snakemake` without activating the venv).
# With --software-deployment-method conda a rule runs in its own environment (envs/testbox.yaml,
# envs/analysis.yaml): the package is the workflow's src/, and `luksbench` its CLI module.
SOURCE_DIR = Path(str(workflow.current_basedir)).resolve().parents[1] / "src"
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    shell.prefix(
        f"set -euo pipefail; export PYTHONPATH={shlex.quote(str(SOURCE_DIR))}"
        '${{PYTHONPATH:+:$PYTHONPATH}}; luksbench() {{ python -m luksbench.cli "$@"; }}; '
    )
else:
    shell.prefix(
        f'set -euo pipefail; export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"; '
    )


# --- names and paths
RUN = config["run"]
# Short hostname: the raw layout's <host> level; config can name the box explicitly.
HOST = config["host"] or socket.gethostname().split(".")[0]
RAW = "data/raw"
PROCESSED = "data/processed"
SCRATCH = config["scratch_dir"]
NOTEBOOKS = "notebooks"
# One measured host's folders: raw results (kept) and the test box's working files.
HOST_RAW = f"{RAW}/{{run}}/{{host}}"
HOST_SCRATCH = f"{SCRATCH}/{{run}}/{{host}}"
# The stacks' undo log: no rule's output, so no failure path of Snakemake deletes it before
# teardown (a failed job's outputs are removed before `onerror` runs).
STATE = f"{HOST_SCRATCH}/state.json"


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    host=r"[A-Za-z0-9][A-Za-z0-9._-]*",


# The measuring rules' wildcard constraints. They measure only the configured run on this
# machine; every other run folder under data/raw (the shipped sample, runs copied from other test
# boxes) is analysed as it is.
MEASURED = {"run": re.escape(RUN), "host": re.escape(HOST)}


def measuring(raw_file, active=True):
    """The wildcard constraints of the rule writing ``raw_file`` (in data/raw/<run>/<host>/) of the
    run measured here: none that match once the file is final (an env.json or cipher benchmark
    that exists, a manifest of this plan's whole design), so no invocation, not even --forceall,
    rewrites raw data."""
    path = Path(RAW) / RUN / HOST / raw_file
    if raw_file.endswith("manifest.json"):
        pilot = raw_file != "fio/manifest.json"
        final = measurement_final(MEASURED_PLAN, path, path.parents[1] / "env.json", pilot)
    else:
        final = path.exists()
    return {"run": "(?!)", "host": "(?!)"} if final or not active else MEASURED


def processed(*tables):
    """{table: data/processed/{run}/<table>.parquet}: named inputs and outputs."""
    return {table: f"{PROCESSED}/{{run}}/{table}.parquet" for table in tables}


def notebook_code(notebook, *modules):
    """The package files a notebook runs (with ``modules`` its step runs besides): the luksbench
    modules its cells import and all they import in turn (orchestrate/imports.py), listed as
    inputs so a change to that code, and only to that code, re-runs the step; a new import is
    followed without editing the rules."""
    return package_sources([*notebook_modules(notebook), *modules], "src")


# --- input functions
def host_dir(run, host):
    return f"{RAW}/{run}/{host}"


def run_hosts(run):
    """Hosts whose raw data a run's analysis reads: those already there, plus this one if measured."""
    run_dir = Path(RAW) / run
    hosts = {p.name for p in run_dir.iterdir() if p.is_dir()} if run_dir.is_dir() else set()
    if run == RUN:
        hosts.add(HOST)
    return sorted(hosts)


def fio_manifests(wildcards):
    return [f"{host_dir(wildcards.run, h)}/fio/manifest.json" for h in run_hosts(wildcards.run)]


def env_captures(wildcards):
    return [f"{host_dir(wildcards.run, h)}/env.json" for h in run_hosts(wildcards.run)]


def cipher_benchmarks(wildcards):
    return [
        f"{host_dir(wildcards.run, h)}/cryptsetup-benchmark.txt" for h in run_hosts(wildcards.run)
    ]


def teardown_records(wildcards):
    """Analysis of the run measured here waits until its devices are torn down.

    This also makes sure stack_down runs whenever stack_up does (e.g. when a run is extended).
    Once the measurement is final no rule writes the record; kept as an input while it exists, so
    the next invocation sees the same inputs and has nothing to do.
    """
    record = f"{SCRATCH}/{wildcards.run}/{HOST}/teardown.json"
    if wildcards.run != RUN:
        return []
    return [record] if measuring("fio/manifest.json") == MEASURED or Path(record).exists() else []


def plan_for(wildcards):
    """The config resolved into the JSON plan the test-box code reads."""
    return plan_from_config(config, wildcards.host, Path(SCRATCH) / wildcards.run / wildcards.host)


def abspath(path):
    return str(Path(path).resolve())


def measured_env_path(wildcards):
    """env.json of a run already (partly) measured here: its plan is what new data must match."""
    return f"{host_dir(wildcards.run, wildcards.host)}/env.json"


def measured_host_dir(wildcards):
    return host_dir(wildcards.run, wildcards.host)


# Notebooks run with notebooks/ as working directory: their paths are relative to it, so that a
# moved or copied checkout has the same params (Snakemake re-runs a rule whose params changed).
def notebook_path(path):
    """``path`` (relative to the checkout; may hold {run}) as a notebook opens it: from
    notebooks/."""

    def relative(wildcards):
        return f"../{path.format(run=wildcards.run) if '{' in path else path}"

    return relative


def abs_raw_dir(wildcards):
    return abspath(f"{RAW}/{wildcards.run}")


class FigureIndex:
    """A run's figure index (figures/<run>/index.json, written by notebook 03), read only when
    `snakemake --report` asks for a figure's caption or family. A param of no plain type, so it
    is no rerun trigger. What report/figure.rst prints is reStructuredText escaped (a host or
    stack name from a raw run is in figure names and captions)."""

    def __init__(self, figures_dir):
        self.figures_dir = figures_dir

    def __repr__(self):
        return f"{self.figures_dir}/index.json"  # as the report's job parameters show it

    def entry(self, name):
        from luksbench.publish.catalog import read_index  # matplotlib: only for the report

        return next(e for e in read_index(self.figures_dir) if e["name"] == name)

    def caption(self, name):
        return rst_text(self.entry(name)["caption"])

    def name(self, name):
        return rst_text(name)

    def family(self, name):
        """(heading, introduction) of the figure's family, as the paper has them (the catalog's
        own text, no data)."""
        from luksbench.publish.catalog import FIGURE_FAMILIES

        heading, intro = FIGURE_FAMILIES[self.entry(name)["family"]]
        return heading, intro.replace(", {cpu_basis}", "")  # the CPU figures state their basis


# The workflow's lifecycle (orchestrate/lifecycle.py): this invocation is the session of its
# test-box steps; the Snakefile's onstart/onsuccess/onerror hooks call it with this state file.
lifecycle.start_session()
MEASURED_STATE = Path(SCRATCH) / RUN / HOST / "state.json"


def min_pairs(wildcards):
    """Pairs every cell must have: all repetitions (adaptive: the pilot's) for the run measured
    here, else the usual 3."""
    if wildcards.run != RUN:
        return 3
    if SEQUENTIAL:
        return ADAPTIVE["min_pairs"]
    return ADAPTIVE["pilot_pairs"] if ADAPTIVE["enabled"] else config["repetitions"]


def adaptive_targets(wildcards):
    """run_fio's targets input: the pilot's per-cell targets when adaptive, else nothing."""
    if ADAPTIVE["enabled"] and not SEQUENTIAL:
        return [f"{host_dir(wildcards.run, wildcards.host)}/fio/targets.json"]
    return []


def targets_option(wildcards):
    return [arg for path in adaptive_targets(wildcards) for arg in ("--targets", path)]


def plan_cells(wildcards):
    """Workload ids of the configured matrix (cells missing from the pilot get the cap)."""
    return [w.id for w in workloads(plan_for(wildcards))]


def variant_stacks(wildcards):
    return [name for name in config["stacks"] if name != config["baseline"]]


# The plan of the run measured here, resolved now: a config error (an unknown device, a stack on
# a device that md claims, ...) stops every invocation before anything runs, naming the key.
MEASURED_PLAN = plan_from_config(config, HOST, Path(SCRATCH) / RUN / HOST)
if lifecycle.is_dry_run(workflow.output_settings, sys.argv):
    print("\n".join(describe_plan(MEASURED_PLAN)), file=sys.stderr)


# An invocation that runs the workflow (not a dry run, lint, report, ...; not a job's own
# snakemake) first recovers what a killed run left behind, before the DAG is built.
if not lifecycle.only_looks(workflow.output_settings, sys.argv, workflow.is_main_process):
    try:
        lifecycle.before_dag(MEASURED_STATE, os.getcwd())
    except lifecycle.RecoveryError as exc:
        raise WorkflowError(str(exc)) from exc
