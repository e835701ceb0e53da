"""inferlab.recheck.agreement: the one rule by which a claimed run agrees with trusted outputs (exact under the same
conditions, else within the declared tolerance) and the one way its first difference is named."""

from __future__ import annotations

import numpy

from inferlab.recheck.agreement import Allowance, allowance, array_difference, nucleus_edge

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


# Six tokens whose probabilities put token 3 exactly on top-p's line: the mass at or below it is 0.2 = 1 - 0.8.
PROBABILITIES = numpy.array([0.5, 0.2, 0.1, 0.1, 0.06, 0.04])
LOGITS = numpy.log(PROBABILITIES).astype(numpy.float32)  # (vocab,), temperature 1: a kept score is its logit
TOP_P = 0.8


def scores(kept: int, values=LOGITS):
    """Processed scores keeping the first `kept` tokens (the logits are in descending order), the rest -inf."""
    out = numpy.full(values.shape, -numpy.inf, dtype=numpy.float32)
    out[:kept] = values[:kept]
    return out


def test_a_token_on_top_p_s_line_may_be_kept_on_one_side_only_and_its_value_is_still_compared():
    """Under other kernels the token on the line can fall either way: kept by one run, dropped by the other."""
    for claimed, trusted in ((scores(4), scores(3)), (scores(3), scores(4))):
        a, b, moved = nucleus_edge(claimed, trusted, LOGITS, 1.0, TOP_P, TOLERANT)
        assert moved == 1 and array_difference(a, b, TOLERANT) is None
    wrong = scores(4)
    wrong[3] += 1.0  # kept at the line, but not with the value the trusted logits give it
    a, b, moved = nucleus_edge(wrong, scores(3), LOGITS, 1.0, TOP_P, TOLERANT)
    assert moved == 1 and array_difference(a, b, TOLERANT).startswith("element [3]: ")
    assert nucleus_edge(scores(4), scores(3), LOGITS, 1.0, TOP_P, EXACT)[2] == 0  # the same bits: no room
    assert nucleus_edge(scores(4), scores(3), LOGITS, 1.0, 1.0, TOLERANT)[2] == 0  # no filter: no line


def test_a_nucleus_cut_inside_widened_flattened_or_emptied_is_named_not_let_through():
    """Only the trusted logits decide where the line is: the claimed run's own values decide nothing."""
    flattened = scores(6, numpy.full(6, LOGITS[2], dtype=numpy.float32))
    flattened[:3] = LOGITS[:3]
    for forged, first in ((scores(2), 2), (scores(6), 3), (scores(0), 0), (flattened, 3)):
        a, b, moved = nucleus_edge(forged, scores(3), LOGITS, 1.0, TOP_P, TOLERANT)
        assert moved == 0 and array_difference(a, b, TOLERANT).startswith(f"element [{first}]: "), forged
