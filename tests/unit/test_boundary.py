"""The sequential design's boundaries: the constants against the published tables, and their
error over the looks checked by a seeded simulation of the looks."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from luksbench.analysis import boundary
from luksbench.analysis.boundary import BOUNDARIES, _obrien_fleming, _pocock, look_levels
from luksbench.analysis.sequential import look_confidence


def test_the_constants_are_the_published_ones():
    """Pocock (1977): 2.413 for 5 and 2.555 for 10 equally spaced looks at two-sided 5 %; the
    Lan-DeMets O'Brien-Fleming-type spending at 5 looks (Jennison & Turnbull 2000, table 7.6):
    4.877, 3.357, 2.680, 2.290, 2.031."""
    assert _pocock(tuple(range(1, 6)), 0.05)[0] == pytest.approx(2.413, abs=1e-3)
    assert _pocock(tuple(range(1, 11)), 0.05)[0] == pytest.approx(2.555, abs=1e-3)
    published = [4.877, 3.357, 2.680, 2.290, 2.031]
    assert _obrien_fleming(tuple(range(1, 6)), 0.05) == pytest.approx(published, abs=1e-3)


@pytest.mark.parametrize("name", BOUNDARIES)
def test_all_looks_of_a_cell_hold_together_at_the_confidence(name):
    """200000 seeded cells seen at 3..12 pairs: the share whose sum leaves the boundary at any
    look is the error the boundary spends: 5 % for Pocock and O'Brien-Fleming (Monte Carlo SE
    0.05 points), well under it for Bonferroni (the looks are correlated)."""
    levels = look_levels(name, 0.95, 3, 12)
    n = np.arange(3, 13)
    c = np.array([sps.norm.isf((1 - levels[k]) / 2) for k in n])
    sums = np.random.default_rng(12).standard_normal((200_000, 12)).cumsum(axis=1)[:, 2:]
    error = (np.abs(sums) / np.sqrt(n) >= c).any(axis=1).mean()
    if name == "bonferroni":
        assert levels == dict.fromkeys(n, look_confidence(0.95, 3, 12))
        assert error < 0.03
    else:
        assert error == pytest.approx(0.05, abs=0.0015)


def test_pocock_is_one_level_narrower_than_bonferroni_and_obf_spends_late():
    pocock, obf = look_levels("pocock", 0.95, 3, 12), look_levels("obrien-fleming", 0.95, 3, 12)
    assert len(set(pocock.values())) == 1
    assert 0.95 < pocock[3] < look_confidence(0.95, 3, 12)
    levels = list(obf.values())
    assert levels == sorted(levels, reverse=True) and levels[0] > 0.9999 and levels[-1] < 0.97
    # one look: the plain interval, whatever the boundary
    assert look_levels("obrien-fleming", 0.95, 5, 5) == {5: pytest.approx(0.95)}


def test_an_unknown_boundary_or_bad_looks_are_refused():
    with pytest.raises(ValueError, match="unknown boundary 'wald'; known: pocock"):
        look_levels("wald", 0.95, 3, 12)
    with pytest.raises(ValueError, match="min_pairs <= max_pairs"):
        look_levels("pocock", 0.95, 5, 4)
    assert boundary.level_at("pocock", 0.95, 3, 12, 40) == look_levels("pocock", 0.95, 3, 12)[12]
