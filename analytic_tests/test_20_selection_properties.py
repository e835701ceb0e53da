"""Properties of temperature, top-p, top_k=0 and seeded selection, for random logits.

Strategies are constrained on purpose, each for a stated reason; nothing is widened or retried
after a failure. Hypothesis runs derandomized (same examples every run) so that a failure is
reproducible evidence rather than a flaky rerun, and without an example database so that the
tests write nothing.
"""

import math
from fractions import Fraction

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import GenerationConfig
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from analytic_tests import reference
from inferlab import protocol
from inferlab.specimen.build import tiny_gpt_neox

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None)

# Logits on a grid of 1/4 in [-10, 10]: two different logits differ by >= 1/4, so after division
# by any temperature in [1/8, 8] they still differ by >= 1/32, far above float32 resolution at
# these magnitudes (~1e-5). Arbitrary floats would test rounding collisions, not temperature.
grid_logits = st.lists(st.integers(-40, 40), min_size=2, max_size=12).map(lambda xs: [x / 4 for x in xs])
temperatures = st.floats(min_value=0.125, max_value=8.0)
# A temperature that really is below one: within a few ulps of 1 the float change of the top
# probability can be smaller than its rounding error, which would test rounding, not temperature.
cooler = st.floats(min_value=0.125, max_value=0.9)


def as_tensor(values, dtype=torch.float32):
    return torch.tensor([values], dtype=dtype)  # (1, vocab)


@PROPERTY
@given(logits=grid_logits, temperature=temperatures)
def test_temperature_preserves_order_in_library_and_reference(logits, temperature):
    library = TemperatureLogitsWarper(temperature)(None, as_tensor(logits))[0].tolist()
    ours = reference.scale(logits, temperature)
    for scaled in (library, ours):
        for i in range(len(logits)):
            for j in range(len(logits)):
                if logits[i] < logits[j]:
                    assert scaled[i] < scaled[j], (i, j, logits, scaled)
                elif logits[i] == logits[j]:
                    assert scaled[i] == scaled[j], (i, j, logits, scaled)


@PROPERTY
@given(logits=grid_logits, temperature=cooler)
def test_temperature_below_one_never_lowers_the_top_probability(logits, temperature):
    # float64 for the library's softmax: the claim is about the warper, not float32 rounding.
    base = torch.softmax(as_tensor(logits, torch.float64), dim=-1).max().item()
    cooled = torch.softmax(TemperatureLogitsWarper(temperature)(None, as_tensor(logits, torch.float64)), dim=-1)
    assert cooled.max().item() >= base
    assert max(reference.softmax(reference.scale(logits, temperature))) >= max(reference.softmax(logits))


@PROPERTY
@given(logits=grid_logits, temperature=temperatures)
def test_library_and_reference_temperature_probabilities_agree(logits, temperature):
    library = torch.softmax(TemperatureLogitsWarper(temperature)(None, as_tensor(logits, torch.float64)), dim=-1)
    ours = reference.softmax(reference.scale(logits, temperature))
    # Two double-precision softmaxes of <= 12 terms: a 1e-12 disagreement would be a real difference.
    assert max(abs(a - b) for a, b in zip(library[0].tolist(), ours)) <= 1e-12


# Integer weights give exact probabilities w / sum(w) (logits log w), so the rule can be checked
# in exact arithmetic. Small weights make ties common, which is intended.
weights_lists = st.lists(st.integers(1, 50), min_size=1, max_size=10)
thresholds = st.fractions(min_value=Fraction(1, 1000), max_value=1)


def is_smallest_prefix(probs, keep, top_p) -> bool:
    """Kept set is most-probable-first, reaches top_p, and stops reaching it without its least likely member."""
    kept_probs = [p for p, k in zip(probs, keep) if k]
    dropped = [p for p, k in zip(probs, keep) if not k]
    if not kept_probs:
        return False
    upward_closed = not dropped or min(kept_probs) >= max(dropped)
    mass = sum(kept_probs)
    return upward_closed and mass >= top_p and mass - min(kept_probs) < top_p


@PROPERTY
@given(weights=weights_lists, top_p=thresholds)
def test_reference_top_p_keeps_the_smallest_prefix_reaching_the_threshold(weights, top_p):
    probs = reference.exact_probs(weights)
    assert is_smallest_prefix(probs, reference.nucleus_keep(probs, top_p), top_p)


@PROPERTY
@given(weights=weights_lists, data=st.data())
def test_reference_top_p_on_an_exact_boundary_stops_at_the_token_that_reaches_it(weights, data):
    # Random fractions almost never equal a prefix mass, so draw the threshold as one: the mass of
    # the k most probable tokens. The rule must then keep exactly those k.
    probs = reference.exact_probs(weights)
    k = data.draw(st.integers(1, len(weights)), label="k")
    top_p = sum(sorted(probs, reverse=True)[:k])
    keep = reference.nucleus_keep(probs, top_p)
    assert sum(keep) == k
    assert is_smallest_prefix(probs, keep, top_p)


# Distance from every exact prefix mass below which the float library may legitimately decide
# differently (see the boundary tests in test_10): a few hundred ulps of each dtype.
BOUNDARY_MARGIN = {torch.float32: 1e-5, torch.float64: 1e-12}


@PROPERTY
@given(weights=weights_lists, top_p=st.floats(min_value=0.001, max_value=1.0),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_library_top_p_keeps_the_smallest_prefix_away_from_boundaries(weights, top_p, dtype):
    probs = reference.exact_probs(weights)
    exact_p = Fraction(top_p)  # the exact binary value the library receives
    masses, total = [], Fraction(0)
    for i in reference.descending_order(probs):
        total += probs[i]
        masses.append(total)
    assume(all(abs(m - exact_p) > BOUNDARY_MARGIN[dtype] for m in masses))
    logits = as_tensor([math.log(w) for w in weights], dtype)
    keep = torch.isfinite(TopPLogitsWarper(top_p)(None, logits))[0].tolist()
    assert is_smallest_prefix(probs, keep, exact_p), (weights, top_p, keep)
    expected = reference.nucleus_keep(probs, exact_p)
    assert sum(keep) == sum(expected)
    if len(set(weights)) == len(weights):  # without ties the set itself is determined
        assert keep == expected


MODEL = tiny_gpt_neox()  # only its _get_logits_processor is used; building it takes milliseconds


@PROPERTY
@given(logits=st.lists(st.floats(-30, 30, width=32), min_size=2, max_size=96))
def test_s1_processors_leave_logits_unchanged(logits):
    # S1 is temperature 1, top_p 1, top_k 0: generate builds no warper, so the scores it samples
    # from are the model's logits bit for bit (top_k=0 builds no TopKLogitsWarper at all).
    config = GenerationConfig(**protocol.CONDITIONS["S1"].generate_kwargs(), **protocol.GENERATION_FIXED)
    processors = MODEL._get_logits_processor(generation_config=config, input_ids_seq_length=1,
                                             encoder_input_ids=torch.zeros(1, 1, dtype=torch.long),
                                             device=torch.device("cpu"), model_kwargs={})
    scores = as_tensor(logits)
    assert torch.equal(processors(torch.zeros(1, 1, dtype=torch.long), scores.clone()), scores)


def worked_single_candidate_probs():
    """The spec's worked case: temperature 1/2 then top-p 3/4 on (log 8, log 4, log 2, 0)."""
    logits = as_tensor([math.log(8), math.log(4), math.log(2), 0.0])
    scores = TopPLogitsWarper(0.75)(None, TemperatureLogitsWarper(0.5)(None, logits))
    return torch.softmax(scores, dim=-1)  # (1, vocab)


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1))
def test_a_filter_leaving_one_candidate_makes_every_seed_select_it(seed):
    probs = worked_single_candidate_probs()
    assert probs[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    torch.manual_seed(seed)
    assert torch.multinomial(probs, num_samples=1).item() == 0


def test_different_seeds_can_select_the_same_token():
    # Temperature 1 on the worked logits leaves four candidates, all with nonzero probability.
    # Five seeds therefore cannot all select different tokens; exhibit the pair.
    probs = torch.tensor([[8 / 15, 4 / 15, 2 / 15, 1 / 15]])
    seeds = list(protocol.SEEDS) + [41, 43]
    chosen = {}
    for seed in seeds:
        torch.manual_seed(seed)
        chosen[seed] = torch.multinomial(probs, num_samples=1).item()
    assert all(0 <= token < probs.shape[1] for token in chosen.values()), chosen
    pairs = [(a, b) for a in seeds for b in seeds if a < b and chosen[a] == chosen[b]]
    assert pairs, f"no two seeds chose the same token: {chosen}"
