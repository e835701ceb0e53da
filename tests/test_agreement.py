"""inferlab.recheck.agreement: the one rule by which a claimed run agrees with trusted outputs (exact under the same
conditions, else within the declared tolerance) and the one way its first difference is named."""

from __future__ import annotations

import numpy

from inferlab.recheck.agreement import Allowance, allowance, array_difference, filter_edge

EXACT = Allowance(0.0, 0.0)
TOLERANT = Allowance(1e-4, 1e-4, ["kernel set: 'DEFAULT' in the run, 'AVX2' in the course's run"])


def test_bit_for_bit_means_the_same_bits():
    values = numpy.array([1.0, -2.5, numpy.nan, 0.0], dtype=numpy.float32)
    assert array_difference(values, values.copy(), EXACT) is None
    signed = values.copy()
    signed[3] = -0.0
    found = array_difference(signed, values, EXACT)
    assert found is not None and found.startswith("element [3]: -0 against 0") and "1 element(s) differ" in found
    moved = values.copy()
    moved[1] = numpy.nextafter(moved[1], numpy.float32(0))
    assert array_difference(moved, values, EXACT).startswith("element [1]:")


def test_within_the_tolerance_b_is_the_trusted_value_and_the_first_element_beyond_it_is_named():
    trusted = numpy.array([[10.0, -3.0], [0.5, 7.0]], dtype=numpy.float32)
    near = trusted + numpy.float32(5e-5)
    assert array_difference(near, trusted, TOLERANT) is None
    far = trusted.copy()
    far[1, 0] += 1.0
    found = array_difference(far, trusted, TOLERANT)
    assert found.startswith("element [1, 0]: 1.5 against 0.5") and "max |a-b| 1" in found
    assert "|a-b| <= 0.0001 + 0.0001*|b|" in found


def test_within_the_tolerance_equal_infinities_agree_and_a_nan_agrees_only_with_a_nan():
    """A top-p filtered score is -inf on both sides: that is agreement; -inf against a finite value is not."""
    trusted = numpy.array([2.0, -numpy.inf, -numpy.inf], dtype=numpy.float32)
    assert array_difference(trusted.copy(), trusted, TOLERANT) is None
    unfiltered = trusted.copy()
    unfiltered[2] = -1.0
    assert array_difference(unfiltered, trusted, TOLERANT).startswith("element [2]: -1 against -inf")
    nan = trusted.copy()
    nan[0] = numpy.nan
    assert array_difference(nan, trusted, TOLERANT).startswith("element [0]: nan against 2")
    assert array_difference(nan, nan.copy(), TOLERANT) is None  # as bit for bit: a NaN agrees with a NaN
    assert array_difference(trusted[:2], trusted, TOLERANT) == "shape [2] against [3]"


def test_the_rule_is_exact_only_when_every_condition_is_recorded_and_equal():
    mine = {"torch": "2.13.0", "kernel set": "AVX2", "threads": {"intra_op": 1}}
    assert allowance(mine, dict(mine), 1e-4, 1e-4).exact
    other = allowance({**mine, "kernel set": "DEFAULT"}, mine, 1e-4, 1e-4, ("the run", "the course's run"))
    assert not other.exact and other.differing == ["kernel set: 'DEFAULT' in the run, 'AVX2' in the course's run"]
    unknown = allowance({**mine, "torch": None}, {**mine, "torch": None}, 1e-4, 1e-4)
    assert not unknown.exact and unknown.differing == ["torch: not recorded"]


def test_the_top_p_edge_may_move_by_the_smallest_kept_token_and_nothing_else():
    """Under other kernels an honest run's nucleus can end one token earlier: that token, the smallest kept score,
    is filtered on one side only. Any other token kept on one side only is a difference, named as before."""
    inf = -numpy.inf
    trusted = numpy.array([3.0, 1.0, 0.25, inf, inf], dtype=numpy.float32)
    shorter = numpy.array([3.0, 1.0, inf, inf, inf], dtype=numpy.float32)  # the edge token 0.25 dropped
    a, b, moved = filter_edge(shorter, trusted, TOLERANT)
    assert moved == 1 and array_difference(a, b, TOLERANT) is None
    longer = numpy.array([3.0, 1.0, 0.25, 0.2, inf], dtype=numpy.float32)  # one token more, below the edge
    assert filter_edge(longer, trusted, TOLERANT)[2] == 1
    tied = numpy.array([3.0, 1.0, 0.25, 0.25, inf], dtype=numpy.float32)  # the trusted run's own tie at its edge
    assert filter_edge(shorter, tied, TOLERANT)[2] == 2
    inside = numpy.array([3.0, inf, 0.25, inf, inf], dtype=numpy.float32)  # a kept token that is not the edge
    a, b, moved = filter_edge(inside, trusted, TOLERANT)
    assert moved == 0 and array_difference(a, b, TOLERANT).startswith("element [1]: -inf against 1")
    assert filter_edge(shorter, trusted, EXACT)[2] == 0  # the same conditions: the same bits, no room


def test_a_nucleus_widened_or_flattened_by_a_forger_is_named_not_let_through():
    """The claimed run's own values decide nothing: more than one token it kept and the trusted run dropped, or one
    ranked above the trusted run's edge, is a difference."""
    inf = -numpy.inf
    trusted = numpy.full(1000, inf, dtype=numpy.float32)
    trusted[:20] = numpy.linspace(5.0, 1.0, 20)
    flattened = trusted.copy()
    flattened[20:] = 1.0  # top-p not applied at all, every dropped token at the edge value
    widened = trusted.copy()
    widened[20:500] = -50.0
    above = trusted.copy()
    above[20] = 3.0  # one token more, but above the trusted edge
    for forged in (flattened, widened, above):
        a, b, moved = filter_edge(forged, trusted, TOLERANT)
        assert moved == 0 and array_difference(a, b, TOLERANT).startswith("element [20]: ")
