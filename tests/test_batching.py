"""inferlab.measure.batching: singletons vs a left-padded two-row batch in both orders, on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch


from inferlab import protocol
from inferlab.measure.batching import left_pad, positions_by_rule, run_batching, truncate_after_eos
from inferlab.measure.stats import first_divergence
from inferlab.specimen.build import tiny_gpt_neox, tiny_tokenizer

@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def batching(tokenizer):
    model = tiny_gpt_neox(vocab_size=len(tokenizer))
    state = (tokenizer.padding_side, tokenizer.pad_token, len(tokenizer))
    record, tensors = run_batching(model, tokenizer, dict(protocol.PROMPTS))
    return record, tensors, state


def test_precondition_prompts_differ_in_length(batching):
    lengths = {r: len(ids) for r, ids in batching[0]["prompt_token_ids"].items()}
    assert len(set(lengths.values())) == 2, f"padding would not be exercised: token lengths {lengths}"


def test_call_count_within_protocol_and_no_warmup(batching):
    record = batching[0]
    assert len(record["calls"]) == record["summary"]["generate_calls"] == 4
    assert record["summary"]["generate_calls"] <= protocol.BATCHING_MAX_CALLS
    assert record["summary"]["warmup_calls"] == 0


def test_calls_are_singletons_then_both_orders(batching):
    order = list(protocol.PROMPTS)
    assert [c["request_ids"] for c in batching[0]["calls"]] == [[order[0]], [order[1]], order, order[::-1]]


@pytest.mark.parametrize("call_index", [2, 3], ids=["batch-in-order", "batch-reversed"])
def test_row_mapping_matches_unpadded_prompt_ids(batching, call_index):
    record = batching[0]
    call = record["calls"][call_index]
    for row, request in call["row_to_request"].items():
        mask = torch.tensor(call["attention_mask"][int(row)], dtype=torch.bool)
        unpadded = torch.tensor(call["input_ids"][int(row)])[mask].tolist()
        assert unpadded == record["prompt_token_ids"][request]
    compared = [c for c in record["comparisons"] if c["batch_call_index"] == call_index]
    assert [c["request_id"] for c in compared] == call["request_ids"]
    assert all(c["unpadded_prompt_matches_singleton"] for c in compared)


def test_padding_is_left_with_the_existing_pad_id(batching):
    record = batching[0]
    call = record["calls"][2]
    padded_rows = [row for row, mask in enumerate(call["attention_mask"]) if 0 in mask]
    assert len(padded_rows) == 1
    row = padded_rows[0]
    mask = call["attention_mask"][row]
    pad_columns = mask.index(1)
    assert mask == [0] * pad_columns + [1] * (len(mask) - pad_columns)
    assert call["input_ids"][row][:pad_columns] == [record["pad_token_id"]] * pad_columns
    assert record["pad_token_id"] < len(tiny_tokenizer())


def test_observed_prefill_positions_follow_the_mask_rule(batching):
    record = batching[0]
    assert record["summary"]["all_prefill_positions_match_rule"] is True
    for call in record["calls"]:
        for positions, mask in zip(call["prefill_position_ids_observed"], call["attention_mask"]):
            real = [p for p, m in zip(positions, mask) if m == 1]
            assert real == list(range(len(real)))


def test_differences_are_quantified_not_assumed_zero(batching):
    record, tensors, _ = batching
    for comparison in record["comparisons"]:
        diff = comparison["first_step_max_abs_diff"]
        assert isinstance(diff, float) and math.isfinite(diff) and diff >= 0.0
        assert comparison["first_step_top2_margin_single"] >= 0.0
        assert isinstance(comparison["first_step_argmax_agree"], bool)
        assert len(comparison["per_step_max_abs_diff"]) >= 1
        batch = tensors[f"call{comparison['batch_call_index']}_step_logits"][comparison["row"], 0]
        single = tensors[f"call{comparison['singleton_call_index']}_step_logits"][0, 0]
        assert diff == float((batch - single).abs().max())
    assert "reduction" in record["summary"]["explanation"]


def test_divergence_summary_is_consistent_with_rows(batching):
    record = batching[0]
    for c in record["comparisons"]:
        assert c["first_divergence"] == first_divergence(c["generated_ids_batch"], c["generated_ids_single"])
    listed = {(d["batch_call_index"], d["row"]) for d in record["summary"]["divergent_rows"]}
    divergent = {(c["batch_call_index"], c["row"]) for c in record["comparisons"] if not c["generated_ids_identical"]}
    assert listed == divergent


def test_tensors_have_call_shapes(batching):
    record, tensors, _ = batching
    for call in record["calls"]:
        rows = len(call["request_ids"])
        logits = tensors[f"call{call['call_index']}_step_logits"]
        assert logits.shape[0] == rows and logits.shape[1] <= protocol.MAX_NEW_TOKENS
        assert tensors[f"call{call['call_index']}_sequences"].tolist() == call["sequence_ids"]


def test_greedy_batch_calls_emit_no_warnings(batching):
    record = batching[0]
    assert record["config_warnings"] == []
    assert [c["warnings"] for c in record["calls"]] == [[]] * len(record["calls"])


def test_shared_tokenizer_state_is_untouched(batching, tokenizer):
    assert (tokenizer.padding_side, tokenizer.pad_token, len(tokenizer)) == batching[2]


# --- helpers ----------------------------------------------------------------------------------


def test_left_pad_and_positions_rule():
    input_ids, attention_mask = left_pad([[7, 8, 9], [5]], pad_token_id=0)
    assert input_ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions_by_rule(attention_mask).tolist() == [[0, 1, 2], [1, 1, 0]]


def test_truncate_after_eos():
    assert truncate_after_eos([4, 0, 0, 0], eos_token_id=0) == [4, 0]
    assert truncate_after_eos([4, 5], eos_token_id=0) == [4, 5]


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2]) is None
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_too_many_prompts_exceed_the_call_budget(tokenizer):
    prompts = {f"X{i}": "a" for i in range(protocol.BATCHING_MAX_CALLS)}
    with pytest.raises(ValueError, match="BATCHING_MAX_CALLS"):
        run_batching(None, tokenizer, prompts)
