"""Notebooks run by papermill: raw JSON -> tidy tables -> loss tables -> figures -> paper.

Each rule lists its notebook and the package code it runs (common.smk: notebook_code, from the
notebook's imports) as inputs, so a change to either re-runs it; the executed notebooks are kept beside the processed
data as a record of what ran. Ingest writes the package's table list (PROCESSED_TABLES); the steps
after it read those tables.
"""

import json
import shlex

from luksbench.analysis.ingest import raw_digest

# notebooks/ as working directory, like JupyterLab (the paths handed to a notebook are relative to
# it: notebook_path); cell output goes to the log. A loaded or slow
# machine (a VM under emulation) may need more than papermill's default 60 s to start a kernel.
PAPERMILL_OPTIONS = (
    "--cwd notebooks --kernel python3 --log-output --no-progress-bar --start-timeout 300"
)


rule ingest_raw:
    """Parse every raw fio result, cipher benchmark and environment capture into tidy parquet.

    Incremental (only raw files new since the last ingest are parsed; the cache sits in
    data/processed/<run>/.ingest-cache/) and parallel (one parsing process per thread)."""
    input:
        notebook=f"{NOTEBOOKS}/01-ingest.ipynb",
        manifests=fio_manifests,
        envs=env_captures,
        ciphers=cipher_benchmarks,
        teardown=teardown_records,
        code=notebook_code(f"{NOTEBOOKS}/01-ingest.ipynb"),
    output:
        **processed(*PROCESSED_TABLES),
        notebook=f"{PROCESSED}/{{run}}/notebooks/01-ingest.ipynb",
    log:
        "logs/{run}/ingest_raw.log",
    conda:
        "../../envs/analysis.yaml"
    threads: 2
    params:
        papermill=PAPERMILL_OPTIONS,
        raw_dir=notebook_path(f"{RAW}/{{run}}"),
        processed_dir=notebook_path(f"{PROCESSED}/{{run}}"),
        strict=config["analysis"]["strict_ingest"],
        # a raw file added, removed or edited changes it: Snakemake re-runs a rule whose params
        # changed (evaluated when the rule is about to run, after the raw files are written)
        raw_files=lambda wildcards: raw_digest(Path(RAW) / wildcards.run),
    shell:
        "papermill {params.papermill} {input.notebook:q} {output.notebook:q}"
        " -r run {wildcards.run:q} -p raw_dir {params.raw_dir:q}"
        " -p processed_dir {params.processed_dir:q}"
        " -p strict {params.strict:q} -p workers {threads:q} > {log:q} 2>&1"


rule compute_loss:
    """Loss per cell and metric with paired confidence intervals, for every comparison
    (analysis.comparisons: variant vs its baseline; the headline first). The notebook writes the
    run's loss tables only when told to (loss_dir); opened by hand it writes to its own folder."""
    input:
        **processed(*PROCESSED_TABLES),
        notebook=f"{NOTEBOOKS}/02-loss.ipynb",
        code=notebook_code(f"{NOTEBOOKS}/02-loss.ipynb"),
    output:
        **processed(*LOSS_TABLES),
        # every number the paper's answer quotes, with its source row (+ CSV beside it)
        paper_numbers=f"{PROCESSED}/{{run}}/paper_numbers.parquet",
        notebook=f"{PROCESSED}/{{run}}/notebooks/02-loss.ipynb",
    log:
        "logs/{run}/compute_loss.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        papermill=PAPERMILL_OPTIONS,
        processed_dir=notebook_path(f"{PROCESSED}/{{run}}"),
        baseline=config["baseline"],
        variant=config["analysis"]["variant"],
        # as configured ([] = every stack against the baseline): resolved against the stacks
        # that have results, so an optional stack that could not be built is left out
        comparisons=json.dumps(config["analysis"]["comparisons"]),
        confidence=config["analysis"]["confidence"],
        margin=config["analysis"]["equivalence_margin_pct"],
        regions=json.dumps(config["analysis"]["decision_regions"]),
        min_pairs=min_pairs,
    shell:
        "papermill {params.papermill} {input.notebook:q} {output.notebook:q}"
        " -r run {wildcards.run:q} -p processed_dir {params.processed_dir:q}"
        " -p loss_dir {params.processed_dir:q}"
        " -r baseline {params.baseline:q} -r variant {params.variant:q}"
        " -r comparisons {params.comparisons:q}"
        " -p confidence {params.confidence:q} -p equivalence_margin_pct {params.margin:q}"
        " -r decision_regions {params.regions:q} -p min_pairs {params.min_pairs:q} > {log:q} 2>&1"
        " && python -m luksbench.analysis.paper_numbers {output.paper_numbers:q} >> {log:q} 2>&1"


rule plot_figures:
    """Seaborn figures (PNG + SVG with provenance metadata) from the processed tables, drawn by
    one process per thread."""
    input:
        **processed(*PROCESSED_TABLES, *LOSS_TABLES),
        notebook=f"{NOTEBOOKS}/03-figures.ipynb",
        code=notebook_code(f"{NOTEBOOKS}/03-figures.ipynb"),
    output:
        # in `snakemake --report`: every figure, its caption and family from the figure index
        figures=report(
            directory("figures/{run}"),
            patterns=["{name}.png"],
            caption="../../report/figure.rst",
            category=lambda wildcards, params: params.figure_index.family(wildcards.name)[0],
            labels={"figure": "{name}"},
        ),
        notebook=f"{PROCESSED}/{{run}}/notebooks/03-figures.ipynb",
    log:
        "logs/{run}/plot_figures.log",
    conda:
        "../../envs/analysis.yaml"
    threads: 2
    params:
        papermill=PAPERMILL_OPTIONS,
        processed_dir=notebook_path(f"{PROCESSED}/{{run}}"),
        figures_dir=notebook_path("figures/{run}"),
        figure_index=lambda wildcards: FigureIndex(f"figures/{wildcards.run}"),
        per_host_max=config["analysis"]["per_host_figures_max"],
    shell:
        "papermill {params.papermill} {input.notebook:q} {output.notebook:q}"
        " -r run {wildcards.run:q} -p processed_dir {params.processed_dir:q}"
        " -p figures_dir {params.figures_dir:q} -p workers {threads:q}"
        " -p per_host_figures_max {params.per_host_max:q} > {log:q} 2>&1"


rule render_paper:
    """The paper / blog post (index.md with front matter + self-contained index.html), generated
    from the processed tables, the figures and the transcribed published results only."""
    input:
        **processed(*PROCESSED_TABLES, *LOSS_TABLES, "paper_numbers"),
        notebook=f"{NOTEBOOKS}/04-paper.ipynb",
        figures="figures/{run}",
        references=sorted(str(p) for p in Path("data/reference").glob("*.csv")),
        # and the report page's writer (publish/render.py) it runs after the notebook
        code=notebook_code(f"{NOTEBOOKS}/04-paper.ipynb", "luksbench.publish.render"),
    output:
        paper="paper/{run}/index.md",
        html="paper/{run}/index.html",
        # the report's copy (figures downscaled: the browser opens it from the report)
        report_page=report(
            f"{PROCESSED}/{{run}}/report/paper.html",
            caption="../../report/paper.rst",
            category="Paper",
        ),
        notebook=f"{PROCESSED}/{{run}}/notebooks/04-paper.ipynb",
    log:
        "logs/{run}/render_paper.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        papermill=PAPERMILL_OPTIONS,
        processed_dir=notebook_path(f"{PROCESSED}/{{run}}"),
        figures_dir=notebook_path("figures/{run}"),
        paper_dir=notebook_path("paper/{run}"),
        reference_dir=notebook_path("data/reference"),
        # -r: papermill takes the value as a raw string (an empty title stays a string); quoted
        # here, as `:q` leaves an empty value out
        title=shlex.quote(config["paper"]["title"]),
        author=shlex.quote(config["paper"]["author"]),
        # papermill -y: a YAML (here JSON) document of parameters
        front_matter=json.dumps(
            {
                "front_matter": config["paper"]["front_matter"],
                "machine_paths": config["paper"]["machine_paths"],
            }
        ),
    shell:
        "papermill {params.papermill} {input.notebook:q} {output.notebook:q}"
        " -r run {wildcards.run:q} -p processed_dir {params.processed_dir:q}"
        " -p figures_dir {params.figures_dir:q} -p paper_dir {params.paper_dir:q}"
        " -p reference_dir {params.reference_dir:q} -y {params.front_matter:q}"
        " -r title {params.title} -r author {params.author} > {log:q} 2>&1"
        # the report's copy of the paper: figures downscaled to what a browser opens from it
        " && python -c 'import sys; from luksbench.publish.render import write_report_page as w;"
        " print(w(*sys.argv[1:]))' {output.html:q} {output.report_page:q}"
        " >> {log:q} 2>&1"


rule pdf:
    """Optional, not in `all`: the configured run's paper as PDF (snakemake --cores 1 pdf)."""
    input:
        f"paper/{RUN}/index.pdf",


rule render_pdf:
    """The paper as PDF with pandoc (and weasyprint); a missing tool is named with how to get it."""
    input:
        paper="paper/{run}/index.md",
    output:
        pdf="paper/{run}/index.pdf",
    log:
        "logs/{run}/render_pdf.log",
    run:
        from luksbench.publish.render import render_pdf

        Path(log[0]).write_text(f"wrote {render_pdf(input.paper, output.pdf)}\n")
