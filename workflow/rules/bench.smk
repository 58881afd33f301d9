"""Device stacks and fio: stack up, run the matrix in counterbalanced pairs, stack down.

The stacks stay up across the three rules. Their undo log (STATE, <scratch>/<run>/<host>/state.json)
is no rule's output, so Snakemake never deletes it when a job fails: `onerror` tears the stacks down
when any rule fails, and a run whose snakemake was killed is torn down when the workflow starts
again (both in orchestrate/lifecycle.py). stacks.json (written last by stack-up, removed by
stack-down) says the stacks are up.
"""


rule stack_up:
    """Create backing files, bring up every stack of the plan and precondition it."""
    input:
        plan=f"{HOST_SCRATCH}/plan.json",
        env=ancient(f"{HOST_RAW}/env.json"),
        ciphers=ancient(f"{HOST_RAW}/cryptsetup-benchmark.txt"),
    output:
        stacks=f"{HOST_SCRATCH}/stacks.json",
    log:
        "logs/{run}/{host}/stack_up.log",
    wildcard_constraints:
        **MEASURED,
    conda:
        "../../envs/testbox.yaml"
    params:
        state=STATE,
    shell:
        # Progress to the terminal as well: preconditioning real disks takes hours. tee ignores
        # the stop signals and ends with the step's output: how a stopped step unwound is logged.
        "luksbench testbox stack-up --plan {input.plan:q} --state {params.state:q}"
        " --describe {output.stacks:q} 2>&1 | (trap '' INT TERM; exec tee {log:q} >&2)"


rule run_pilot:
    """Adaptive stage 1: run the pilot pairs (adaptive.pilot_pairs) of every cell on every stack."""
    input:
        plan=f"{HOST_SCRATCH}/plan.json",
        stacks=ancient(f"{HOST_SCRATCH}/stacks.json"),
    output:
        manifest=f"{HOST_RAW}/fio/pilot-manifest.json",
    log:
        "logs/{run}/{host}/run_pilot.log",
    wildcard_constraints:
        **measuring("fio/pilot-manifest.json"),
    conda:
        "../../envs/testbox.yaml"
    params:
        state=STATE,
        host_dir=measured_host_dir,
    shell:
        "luksbench testbox run-fio --plan {input.plan:q} --state {params.state:q}"
        " --describe {input.stacks:q} --raw-host-dir {params.host_dir:q}"
        " --manifest {output.manifest:q}"
        " 2>&1 | (trap '' INT TERM; exec tee {log:q} >&2)"


rule plan_repetitions:
    """Adaptive: per-cell pair targets from the pilot pairs alone (Stein's two-stage rule)."""
    input:
        pilot=f"{HOST_RAW}/fio/pilot-manifest.json",
    output:
        targets=f"{HOST_RAW}/fio/targets.json",
    log:
        "logs/{run}/{host}/plan_repetitions.log",
    wildcard_constraints:
        **MEASURED,
    params:
        raw_dir=abs_raw_dir,
        baseline=config["baseline"],
        variants=variant_stacks,
        comparisons=COMPARISONS,
        adaptive=ADAPTIVE,
        confidence=config["analysis"]["confidence"],
        cells=plan_cells,
    run:
        from luksbench.analysis.design import write_design_targets
        from luksbench.analysis.ingest import fio_table

        design = {k: v for k, v in params.items() if k != "raw_dir"}
        fio = fio_table(Path(params.raw_dir))
        write_design_targets(fio, wildcards.host, output.targets, log=log[0], **design)


rule run_fio:
    """Run every missing repetition of the matrix on every stack; existing raw files are kept.

    With adaptive repetitions, each cell is topped up to its own target from the pilot. Then each
    pair fio flagged is measured again (remeasure_flagged_max), decided from the ingested table.
    """
    input:
        plan=f"{HOST_SCRATCH}/plan.json",
        # Fresh stacks alone (e.g. after the scratch directory was cleaned) are no reason to measure.
        stacks=ancient(f"{HOST_SCRATCH}/stacks.json"),
        targets=adaptive_targets,
    output:
        manifest=f"{HOST_RAW}/fio/manifest.json",
    log:
        "logs/{run}/{host}/run_fio.log",
    wildcard_constraints:
        **measuring("fio/manifest.json", not SEQUENTIAL),
    params:
        state=STATE,
        raw_dir=abs_raw_dir,
        cells=plan_cells,
        targets=adaptive_targets,
        design={
            "repetitions": config["repetitions"],
            "sessions": config["sessions"],
            "remeasure_flagged_max": config["remeasure_flagged_max"],
        },
    run:
        from luksbench.orchestrate.remeasure import run_fio_rule

        run_fio_rule(input, output, params, wildcards.host, log[0])


rule run_rounds:
    """Sequential design: `luksbench next` decides every cell and writes targets.json, run-fio
    --targets measures the next pair of each undecided cell; again until every cell stopped.
    Interrupted, the same command resumes: each round is derived from the raw results alone."""
    input:
        plan=f"{HOST_SCRATCH}/plan.json",
        stacks=ancient(f"{HOST_SCRATCH}/stacks.json"),
    output:
        manifest=f"{HOST_RAW}/fio/manifest.json",
    log:
        "logs/{run}/{host}/run_rounds.log",
    wildcard_constraints:
        **measuring("fio/manifest.json", SEQUENTIAL),
    params:
        state=STATE,
        raw_dir=abs_raw_dir,
        cells=plan_cells,
        design={
            "comparisons": COMPARISONS,
            "adaptive": ADAPTIVE,
            "confidence": config["analysis"]["confidence"],
            "decision_regions": config["analysis"]["decision_regions"],
        },
    run:
        from luksbench.orchestrate.sequential import run_rounds

        stacks = ("--plan", input.plan, "--state", params.state, "--describe", input.stacks)
        where = (params.raw_dir, wildcards.host, output.manifest, log[0])
        run_rounds(*where, stacks, cells=params.cells, **params.design)


rule stack_down:
    """Tear every stack down and check that no mount, mapping, loop device or process is left."""
    input:
        stacks=f"{HOST_SCRATCH}/stacks.json",
        manifest=f"{HOST_RAW}/fio/manifest.json",
    output:
        record=f"{HOST_SCRATCH}/teardown.json",
    log:
        "logs/{run}/{host}/stack_down.log",
    wildcard_constraints:
        **measuring("fio/manifest.json"),
    conda:
        "../../envs/testbox.yaml"
    params:
        state=STATE,
    shell:
        "luksbench testbox stack-down --state {params.state:q} --record {output.record:q} 2> {log:q}"
