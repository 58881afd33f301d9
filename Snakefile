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


onstart:
    forward_stop_signals()


onsuccess:
    release_test_box()


onerror:
    # A failed rule must not leave dm/loop devices, FUSE mounts or daemons behind.
    tear_down_after_failure()
