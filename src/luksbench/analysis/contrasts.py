"""Which stacks the analysis compares: config ``analysis.comparisons``, checked and resolved.

A comparison is a (baseline, variant) pair of stacks; ``[]`` (default) compares every other stack
with the top-level ``baseline``. The headline, (``baseline``, ``analysis.variant``) when listed,
else the first, comes first; the others keep their order (with ``[]``: alphabetical).
:func:`check_config` runs when the workflow parses the config, :func:`resolve` at analysis time.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

Pair = tuple[str, str]


class ComparisonError(ValueError):
    """A comparison that cannot be made as configured; the message names the config key."""


def label(pair: Pair) -> str:
    """``"`raid0-luks` against `raid0`"``: how the paper names a comparison."""
    baseline, variant = pair
    return f"`{variant}` against `{baseline}`"


def parse(comparisons) -> list[dict]:
    """The comparisons as a list of {baseline, variant} from the config value, a JSON string (the
    notebooks' parameter) or pairs; None and "" are []."""
    if comparisons is None or comparisons == "":
        return []
    if isinstance(comparisons, str):
        try:
            comparisons = json.loads(comparisons)
        except json.JSONDecodeError as exc:
            raise ComparisonError(f"analysis.comparisons: not valid JSON: {exc}") from exc
    if not isinstance(comparisons, list | tuple):
        raise ComparisonError("analysis.comparisons must be a list of {baseline, variant}")
    out = []
    for i, item in enumerate(comparisons):
        if isinstance(item, list | tuple) and len(item) == 2:
            item = {"baseline": item[0], "variant": item[1]}
        if not isinstance(item, dict):
            raise ComparisonError(
                f"analysis.comparisons[{i}] must be a mapping {{baseline: <stack>, "
                f"variant: <stack>}}, not {item!r}"
            )
        for key in ("baseline", "variant"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise ComparisonError(f"analysis.comparisons[{i}].{key} must name a stack")
        out.append({"baseline": item["baseline"], "variant": item["variant"]})
    return out


def _headline_first(pairs: list[Pair], baseline: str, variant: str) -> list[Pair]:
    headline = (baseline, variant)
    return [headline, *[p for p in pairs if p != headline]] if headline in pairs else pairs


def check(stacks: Iterable[str], baseline: str, variant: str, comparisons) -> list[Pair]:
    """The comparisons of a config, headline first; :class:`ComparisonError` naming the key when
    a stack is unknown, a stack is compared with itself or a comparison repeats."""
    stacks = list(stacks)
    known = ", ".join(stacks)
    items = parse(comparisons)
    if not items:
        if variant not in stacks or variant == baseline:
            raise ComparisonError(
                f"analysis.variant: {variant!r} is not a stack other than the baseline {baseline!r}"
                f" (stacks: {known}); with analysis.comparisons empty it is the headline comparison"
            )
        others = sorted(s for s in stacks if s != baseline)  # as resolve() orders them
        return _headline_first([(baseline, s) for s in others], baseline, variant)
    if variant not in stacks:  # also names the headline when comparisons are given
        raise ComparisonError(f"analysis.variant: no stack {variant!r} (stacks: {known})")
    seen: dict[Pair, int] = {}
    pairs = []
    for i, item in enumerate(items):
        for key in ("baseline", "variant"):
            if item[key] not in stacks:
                raise ComparisonError(
                    f"analysis.comparisons[{i}].{key}: no stack {item[key]!r} (stacks: {known})"
                )
        pair = (item["baseline"], item["variant"])
        if pair[0] == pair[1]:
            raise ComparisonError(
                f"analysis.comparisons[{i}].variant: {pair[1]!r} is also its baseline; a stack "
                "is not compared with itself"
            )
        if pair in seen:
            raise ComparisonError(
                f"analysis.comparisons[{i}]: {label(pair)} repeats analysis.comparisons"
                f"[{seen[pair]}]"
            )
        seen[pair] = i
        pairs.append(pair)
    return _headline_first(pairs, baseline, variant)


def check_config(config: dict) -> list[Pair]:
    """:func:`check` on a validated workflow config (the schema filled baseline and variant)."""
    analysis = config["analysis"]
    return check(
        list(config.get("stacks") or {}),
        config["baseline"],
        analysis["variant"],
        analysis.get("comparisons") or [],
    )


def resolve(measured: Iterable[str], baseline: str, variant: str, comparisons=None) -> list[Pair]:
    """The comparisons the data can answer, headline first: those whose two stacks both have
    results; the others are named on stderr. :class:`ComparisonError` when nothing is left."""
    measured = set(measured)
    items = parse(comparisons)
    if not items:
        others = [s for s in sorted(measured) if s != baseline]
        pairs = [(baseline, s) for s in others] if baseline in measured else []
    else:
        pairs = []
        for item in items:
            pair = (item["baseline"], item["variant"])
            if missing := [s for s in pair if s not in measured]:
                names = ", ".join(f"`{s}`" for s in missing)
                note = f"luksbench: comparison {label(pair)} left out: no results for {names}"
                print(note, file=sys.stderr)
            elif pair not in pairs:
                pairs.append(pair)
    pairs = _headline_first(pairs, baseline, variant)
    if not pairs:
        raise ComparisonError(
            f"nothing to compare: the stacks with results ({', '.join(sorted(measured)) or 'none'})"
            f" answer none of the comparisons (baseline {baseline!r}, comparisons "
            f"{json.dumps(items)})"
        )
    return pairs


def comparison_pairs(losses) -> list[Pair]:
    """The (baseline, variant) pairs of a loss table in the order of its rows (headline first)."""
    if losses is None or losses.empty:
        return []
    pairs = zip(losses["baseline"].astype(str), losses["variant"].astype(str), strict=True)
    return list(dict.fromkeys(pairs))
