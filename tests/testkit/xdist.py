"""How the suite's tests share pytest-xdist's workers (README's test command runs two): the tests
of one group run one at a time on one worker, in collection order; the integration tier and the
notebooks share the test box (its lock fails fast, it does not wait) and the repository's sample
outputs; the VM tier (its own guest) and a few integration files that only publish run beside
them, as a second group. The unit tier touches neither and spreads over the workers. (xdist's
own `loadgroup` cannot do this under pytest 9: it renames a test's `_nodeid`, which pytest 9 no
longer reads.)"""

from __future__ import annotations

# Integration tests that publish from raw files they are given (snakemake in a workflow copy, the
# paper, the report, chromium) and never take the test box: with the VM tier, the group that runs
# beside the test box's. (xdist hands out the largest groups first, one per worker: the test box's
# goes to one worker, this one to the other, and the unit tests fill in after.)
ANALYSIS_ONLY = (
    "test_executor_profiles.py",
    "test_hostile_workflow.py",
    "test_plots_paper.py",
    "test_published_sample.py",
    "test_retyped_names.py",
    "test_sequential_cli.py",
    "test_workflow_report.py",
)
XDIST_GROUPS = {
    **{f"tests/integration/{name}": "beside" for name in ANALYSIS_ONLY},
    "tests/integration/": "testbox",
    "notebooks/": "testbox",
    "tests/vm/": "beside",
}


def xdist_group(nodeid: str) -> str | None:
    """The group a test id runs in (None: any worker, on its own)."""
    return next((g for prefix, g in XDIST_GROUPS.items() if nodeid.startswith(prefix)), None)


def tier_scheduling(config, log):
    """xdist's scope scheduling with :func:`xdist_group` as the scope: a group's tests go to one
    worker in collection order; every other test is a scope of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return TierScheduling(config, log)
