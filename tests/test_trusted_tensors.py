"""inferlab.recheck.trusted's comparison of saved tensors under other conditions: element by element against the
trusted run's own files, except the matched prefixes past a near-tie divergence (from there the runs fed the model
other ids), and a claimed tensor whose file does not match its record is a contradiction, never a silent skip."""

from __future__ import annotations

import numpy

from inferlab.measure import near_tie
from inferlab.recheck import trusted
from inferlab.recheck.agreement import Allowance

TOLERANT = Allowance(1e-4, 1e-4, ["kernel set: 'DEFAULT' in the run, 'AVX2' in the course's run"])
PROMPT_LENGTH = 8


class Files:
    """A run's saved tensors by label, as RunView.verified_tensor hands them (None: not as its record says)."""

    def __init__(self, arrays: dict):
        self.arrays = arrays

    def verified_tensor(self, reference: dict):
        return self.arrays.get(reference["key"])


def hashes(labels) -> dict:
    return {label: {"file": "tensors/cache.safetensors", "key": label, "sha256": label.replace(" ", "-")}
            for label in labels}


def test_a_prefix_past_a_near_tie_divergence_is_left_out_and_every_other_tensor_is_compared():
    vocab = numpy.linspace(-3.0, 3.0, 50, dtype=numpy.float32)  # (vocab,)
    labels = [f"cache_comparison {n} {side}" for n in (8, 9, 10) for side in ("cached", "uncached")]
    ours = {label: vocab.copy() for label in labels}
    ours["cache_comparison 10 cached"] = vocab[::-1].copy()  # fed other ids after the divergence
    theirs = {label: vocab.copy() for label in labels}
    result = trusted.Comparison(diverged_prefixes={10})
    trusted._compare_tensors(result, hashes(labels), hashes(labels), Files(ours), Files(theirs), TOLERANT)
    assert result.contradictions == [] and result.compared["tensors"] == 4
    result = trusted.Comparison()
    trusted._compare_tensors(result, hashes(labels), hashes(labels), Files(ours), Files(theirs), TOLERANT)
    assert len(result.contradictions) == 1 and "cache_comparison 10 cached" in result.contradictions[0]
    assert "beyond the tolerance against the reference, element [0]" in result.contradictions[0]


def test_the_cache_comparison_names_the_prefixes_it_left_out_after_a_near_tie():
    """P1's continuation takes the runner-up at step 1 (the claimed margin 2e-3 at a top of 10: within
    2*(1e-4 + 1e-4*10)); prefix 10 holds the first differing id, so its tensors are left out only where the trusted
    run's own margin there is a near tie too."""
    def cache(continuation):
        return {"continuation": continuation,
                "prefixes": [{"prefix_length": PROMPT_LENGTH + k, "argmax_uncached": 1, "argmax_cached": 1,
                              "top2_margin_uncached": 1.0, "top2_uncached": {"values": [10.0, 9.0], "ids": [1, 2]}}
                             for k in range(3)]}

    def steps(selected, other, margin=1e-3):
        return {near_tie.STEP_VALUES_FIELD: [[10.0, 9.0], [10.0, 10.0 - margin], [10.0, 9.0]],
                near_tie.STEP_IDS_FIELD: [[1, 2], [selected, other], [3, 2]]}

    def compared(trusted_margin):
        result, counts = trusted.Comparison(), {"cache_prefixes": 0}
        trusted._compare_cache(result, cache([1, 5, 3]), cache([1, 7, 3]), trusted._PromptSteps({}),
                               {"atol": 1e-4, "rtol": 1e-4}, counts, [steps(5, 7, 2e-3), steps(7, 5, trusted_margin)])
        assert any("a near-tie divergence at step 1" in n for n in result.notes), result.notes
        return result, counts

    result, counts = compared(1e-3)
    assert result.contradictions == [] and counts["cache_prefixes"] == 2
    assert result.diverged_prefixes == {PROMPT_LENGTH + 2} and f"cache prefixes {PROMPT_LENGTH + 2}: after" in \
        result.notes[-1]
    # a near tie in the claimed run's margin only: its later prefixes' tensors are still compared
    result, counts = compared(3e-3)  # above the limit 2.2e-3; the claimed 2e-3 is within it
    assert result.diverged_prefixes == set()


def test_under_other_conditions_a_claimed_tensor_not_as_its_record_says_is_a_contradiction():
    labels = ["generation P1-G-rep1 first_step_logits"]
    theirs = {labels[0]: numpy.zeros(4, dtype=numpy.float32)}
    result = trusted.Comparison()
    trusted._compare_tensors(result, hashes(labels), hashes(labels), Files({}), Files(theirs), TOLERANT)
    assert len(result.contradictions) == 1 and "the run's file does not match its record" in result.contradictions[0]
    result = trusted.Comparison()
    trusted._compare_tensors(result, hashes(labels), hashes(labels), Files(theirs), None, TOLERANT)
    assert result.contradictions == [] and result.compared["tensors"] == 0
    assert result.notes == ["saved tensors: the reference holds their hashes only, so under other conditions they "
                            "are not compared"]
