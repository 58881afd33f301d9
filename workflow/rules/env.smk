"""Environment capture and the cipher benchmark: what machine, kernel and tools measured this run."""


rule write_plan:
    """Resolve the validated config into the JSON plan the test-box code reads.

    Stops before any device is touched when a tool the plan needs is missing (with install hints),
    and refuses a plan that would mix incomparable measurements into a run that already has data.
    """
    output:
        plan=f"{HOST_SCRATCH}/plan.json",
    log:
        "logs/{run}/{host}/write_plan.log",
    wildcard_constraints:
        **MEASURED,
    params:
        plan=plan_for,
        measured_env=measured_env_path,
    run:
        check_tools(params.plan)
        check_scratch_space(params.plan)
        write_plan(params.plan, output.plan, measured_env=params.measured_env, log=log[0])


rule capture_env:
    """Record kernel, CPU (aes/vaes flags), tool versions and the chosen backend, before any stack."""
    input:
        plan=ancient(f"{HOST_SCRATCH}/plan.json"),
    output:
        env=protected(f"{HOST_RAW}/env.json"),
    log:
        "logs/{run}/{host}/capture_env.log",
    wildcard_constraints:
        **measuring("env.json"),
    conda:
        "../../envs/testbox.yaml"
    shell:
        "luksbench testbox capture-env --plan {input.plan:q} --out {output.env:q} 2> {log:q}"


rule benchmark_ciphers:
    """Run `cryptsetup benchmark`; its output is kept verbatim, also when ciphers are unavailable.
    A plan cipher it could not measure (no AF_ALG) is measured in userspace with `openssl speed`
    beside it (openssl-speed.txt), when openssl is installed."""
    input:
        plan=ancient(f"{HOST_SCRATCH}/plan.json"),
        env=ancient(f"{HOST_RAW}/env.json"),
    output:
        benchmark=protected(f"{HOST_RAW}/cryptsetup-benchmark.txt"),
    log:
        "logs/{run}/{host}/benchmark_ciphers.log",
    wildcard_constraints:
        **measuring("cryptsetup-benchmark.txt"),
    conda:
        "../../envs/testbox.yaml"
    shell:
        "luksbench testbox benchmark-ciphers --plan {input.plan:q} --out {output.benchmark:q}"
        " 2> {log:q}"
