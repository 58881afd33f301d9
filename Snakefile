"""luksbench: what does disk encryption cost on my hardware, and how sure are we?

snakemake --cores 1 all                    # measure the configured run here, analyse, write the paper
snakemake --cores 1 paper/sample/index.md  # re-analyse the shipped sample (no fio)
"""


configfile: "config/config.yaml"


# `snakemake --report report.html`: the study explained, every figure and the paper
report: "report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/analysis.smk"


rule all:
    """Measure the configured run on this host and publish it."""
    input:
        paper=f"paper/{RUN}/index.md",


# The test box's lifecycle (src/luksbench/orchestrate/lifecycle.py): stop signals reach the jobs,
# the test box is released at the end, and a failed rule leaves no devices, mounts or daemons.
onstart:
    lifecycle.on_start()


onsuccess:
    lifecycle.on_success(MEASURED_STATE)


onerror:
    lifecycle.on_error(MEASURED_STATE)
