"""The one record of settings a run's loss tables are computed with (:class:`LossSettings`).

The workflow builds it from the run's config (:meth:`LossSettings.from_config`), ``luksbench
loss`` from its options, and the loss stage records it beside the tables it writes
(:data:`SETTINGS_FILE`). A notebook opened on its own reads that record (:func:`run_settings`);
where there is none it takes the default config (config/config.yaml with the schema's defaults)
and the baseline of the run's plan, and says so on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable
from dataclasses import MISSING, dataclass
from pathlib import Path

from luksbench.analysis.contrasts import Pair, parse, resolve

#: the record of the settings the loss tables beside it were computed with
SETTINGS_FILE = "loss-settings.json"


@dataclass(frozen=True)
class LossSettings:
    """What a loss table depends on besides the data: config ``baseline`` and ``analysis.*``.

    ``comparisons``: {baseline, variant} mappings as in the config (empty: every stack against
    ``baseline``), resolved against the stacks with results; with ``exact_pairs`` (one pair asked
    for by name, ``luksbench loss``) a stack without results is an error instead. ``metrics``:
    None for every default metric the data has. ``source``: where the settings came from."""

    baseline: str
    variant: str
    confidence: float
    equivalence_margin_pct: float
    decision_regions: dict
    comparisons: tuple[dict, ...] = ()
    metrics: tuple[str, ...] | None = None
    exclude_outliers: bool = False
    exact_pairs: bool = False
    source: str = "given"

    def __post_init__(self) -> None:
        given = self.comparisons  # a list, or JSON text (the notebooks' parameter)
        given = given if isinstance(given, str) else list(given or [])
        object.__setattr__(self, "comparisons", tuple(parse(given)))
        if self.metrics is not None:
            object.__setattr__(self, "metrics", tuple(self.metrics) or None)
        regions = self.decision_regions  # a mapping, or JSON text (the notebooks' parameter)
        regions = json.loads(regions) if isinstance(regions, str) else regions
        object.__setattr__(self, "decision_regions", dict(regions or {}))

    def replaced(self, **changes) -> LossSettings:
        """These settings with ``changes`` (fields) in place, the source saying so."""
        source = f"{self.source}, with {', '.join(changes)} given" if changes else self.source
        return dataclasses.replace(self, **changes, source=source)

    @classmethod
    def from_config(cls, config: dict, source: str = "the run's config") -> LossSettings:
        """The settings of a validated workflow config (schema defaults filled)."""
        analysis = config["analysis"]
        return cls(
            baseline=config["baseline"],
            variant=analysis["variant"],
            confidence=float(analysis["confidence"]),
            equivalence_margin_pct=float(analysis["equivalence_margin_pct"]),
            decision_regions=analysis.get("decision_regions") or {},
            comparisons=parse(analysis.get("comparisons")),
            source=source,
        )

    @classmethod
    def one_pair(cls, baseline: str, variant: str, **settings) -> LossSettings:
        """The settings of one comparison named by its stacks (``luksbench loss``)."""
        pair = ({"baseline": baseline, "variant": variant},)
        return cls(baseline, variant, comparisons=pair, exact_pairs=True, **settings)

    def pairs(self, stacks: Iterable[str]) -> list[Pair]:
        """The (baseline, variant) pairs to table, headline first, given the stacks measured."""
        stacks = set(stacks)
        if not self.exact_pairs:
            return resolve(stacks, self.baseline, self.variant, list(self.comparisons))
        for name in {s for c in self.comparisons for s in c.values()}:
            if name not in stacks:
                raise ValueError(f"stack {name!r} not in the data (stacks: {sorted(stacks)})")
        return [(c["baseline"], c["variant"]) for c in self.comparisons]

    def describe(self) -> str:
        """One line: every setting and where it came from."""
        pairs = ", ".join(f"{c['variant']} vs {c['baseline']}" for c in self.comparisons)
        return (
            f"baseline {self.baseline!r}, variant {self.variant!r}, comparisons "
            f"[{pairs or 'every stack vs the baseline'}], confidence {self.confidence:g}, "
            f"equivalence margin {self.equivalence_margin_pct:g} %, decision regions "
            f"{json.dumps(self.decision_regions, sort_keys=True)}, metrics "
            f"{list(self.metrics) if self.metrics else 'default'}, exclude outliers "
            f"{self.exclude_outliers} (from {self.source})"
        )

    def write(self, path: Path) -> Path:
        """Record the settings as JSON at ``path``."""
        doc = dataclasses.asdict(self)
        doc["comparisons"] = list(self.comparisons)
        Path(path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return Path(path)

    @classmethod
    def read(cls, path: Path) -> LossSettings:
        """The settings recorded at ``path``; ValueError naming the file and key if unreadable."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a loss settings record: {exc}") from exc
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(doc, dict) or (unknown := set(doc) - fields):
            raise ValueError(f"{path}: unknown loss settings key(s) {sorted(unknown or [doc])}")
        try:
            return cls(**{**doc, "source": f"{path}"})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc


def default_settings(baseline: str | None = None) -> LossSettings:
    """The settings of the default config (config/config.yaml, schema defaults), with
    ``baseline`` (a run's plan's) in place of the config's when given."""
    from luksbench.studies import load_config

    settings = LossSettings.from_config(load_config(Path.cwd()), "the default config")
    if baseline and baseline != settings.baseline:
        source = "the default config, baseline from the run's plan"
        settings = dataclasses.replace(settings, baseline=baseline, source=source)
    return settings


def run_settings(processed_dir: Path, plan_baseline: str | None = None) -> LossSettings:
    """The settings of the loss tables in ``processed_dir`` as recorded there (the workflow's, from
    the run's config); without a record :func:`default_settings`, named on stderr."""
    recorded = Path(processed_dir) / SETTINGS_FILE
    if recorded.exists():
        return LossSettings.read(recorded)
    settings = default_settings(plan_baseline)
    print(
        f"luksbench: no {SETTINGS_FILE} in {processed_dir} (the loss stage records the run's "
        f"settings there); using {settings.describe()}",
        file=sys.stderr,
    )
    return settings


def settings_with(processed_dir: Path, plan_baseline: str | None = None, **given) -> LossSettings:
    """The settings a notebook computes with: the ``given`` ones (its parameters; None: not
    given) in place of the run's (:func:`run_settings`). Given all, as the workflow gives them
    from the run's config, nothing else is read."""
    given = {key: value for key, value in given.items() if value is not None}
    required = {f.name for f in dataclasses.fields(LossSettings)}
    required = {n for n in required if LossSettings.__dataclass_fields__[n].default is MISSING}
    if required <= set(given):
        return LossSettings(**given, source="the notebook's parameters")
    return run_settings(processed_dir, plan_baseline).replaced(**given)
