"""inferlab.measure.batching on the tiny model: the prompts singly and as a left-padded two-row batch in both orders."""

from __future__ import annotations

import math

import pytest
import torch

from inferlab import protocol
from inferlab.measure.batching import left_pad, positions_by_rule, run_batching, truncate_after_eos
from inferlab.measure.stats import first_divergence
from inferlab.specimen.build import tiny_gpt_neox
from tiny_specimen import tiny_tokenizer

ORDER = list(protocol.PROMPTS)


@pytest.fixture(scope="module")
def batching(tokenizer):
    state = (tokenizer.padding_side, tokenizer.pad_token, len(tokenizer))
    record, tensors = run_batching(tiny_gpt_neox(vocab_size=len(tokenizer)), tokenizer, dict(protocol.PROMPTS))
    return record, tensors, state


def test_four_calls_singletons_then_both_orders_no_warmup_no_warning_and_the_tokenizer_untouched(batching, tokenizer):
    record, tensors, state = batching
    assert len({len(ids) for ids in record["prompt_token_ids"].values()}) == 2, "padding would not be exercised"
    assert [c["request_ids"] for c in record["calls"]] == [[ORDER[0]], [ORDER[1]], ORDER, ORDER[::-1]]
    assert record["summary"]["generate_calls"] == 4 <= protocol.BATCHING_MAX_CALLS
    assert record["summary"]["warmup_calls"] == 0 and record["processors"] == []  # greedy: nothing acts on the logits
    assert record["config_warnings"] == [] and all(c["warnings"] == [] for c in record["calls"])
    for call in record["calls"]:
        logits = tensors[f"call{call['call_index']}_step_logits"]  # (B, n, vocab)
        assert logits.shape[0] == len(call["request_ids"]) and logits.shape[1] <= protocol.MAX_NEW_TOKENS
        assert tensors[f"call{call['call_index']}_sequences"].tolist() == call["sequence_ids"]
    assert (tokenizer.padding_side, tokenizer.pad_token, len(tokenizer)) == state


def test_rows_are_left_padded_with_the_existing_pad_id_positions_follow_the_mask_and_each_maps_to_its_request(
        batching):
    record = batching[0]
    call = record["calls"][2]
    [row] = [row for row, mask in enumerate(call["attention_mask"]) if 0 in mask]
    pad_columns = call["attention_mask"][row].index(1)
    assert call["attention_mask"][row] == [0] * pad_columns + [1] * (len(call["attention_mask"][row]) - pad_columns)
    assert call["input_ids"][row][:pad_columns] == [record["pad_token_id"]] * pad_columns
    assert record["pad_token_id"] < len(tiny_tokenizer()) and record["summary"]["all_prefill_positions_match_rule"]
    for call in record["calls"]:
        for positions, mask in zip(call["prefill_position_ids_observed"], call["attention_mask"]):
            real = [p for p, m in zip(positions, mask) if m == 1]
            assert real == list(range(len(real)))
    input_ids, attention_mask = left_pad([[7, 8, 9], [5]], pad_token_id=0)
    assert (input_ids.tolist(), attention_mask.tolist()) == ([[7, 8, 9], [0, 0, 5]], [[1, 1, 1], [0, 0, 1]])
    assert positions_by_rule(attention_mask).tolist() == [[0, 1, 2], [1, 1, 0]]
    for call_index in (2, 3):  # the batch in order, then reversed: each row is its request's unpadded prompt
        call = record["calls"][call_index]
        for row, request in call["row_to_request"].items():
            mask = torch.tensor(call["attention_mask"][int(row)], dtype=torch.bool)
            assert torch.tensor(call["input_ids"][int(row)])[mask].tolist() == record["prompt_token_ids"][request]
        compared = [c for c in record["comparisons"] if c["batch_call_index"] == call_index]
        assert [c["request_id"] for c in compared] == call["request_ids"]
        assert all(c["unpadded_prompt_matches_singleton"] for c in compared)


def test_differences_are_measured_not_assumed_zero_and_divergences_listed(batching):
    record, tensors, _ = batching
    for c in record["comparisons"]:
        assert math.isfinite(c["first_step_max_abs_diff"]) and c["first_step_top2_margin_single"] >= 0.0
        batch = tensors[f"call{c['batch_call_index']}_step_logits"][c["row"], 0]
        single = tensors[f"call{c['singleton_call_index']}_step_logits"][0, 0]
        assert c["first_step_max_abs_diff"] == float((batch - single).abs().max()) and c["per_step_max_abs_diff"]
        assert c["first_divergence"] == first_divergence(c["generated_ids_batch"], c["generated_ids_single"])
    assert {(d["batch_call_index"], d["row"]) for d in record["summary"]["divergent_rows"]} == {
        (c["batch_call_index"], c["row"]) for c in record["comparisons"] if not c["generated_ids_identical"]}
    assert truncate_after_eos([4, 0, 0, 0], eos_token_id=0) == [4, 0] and truncate_after_eos([4, 5], 0) == [4, 5]


def test_too_many_prompts_exceed_the_call_budget(tokenizer):
    with pytest.raises(ValueError, match="BATCHING_MAX_CALLS"):
        run_batching(None, tokenizer, {f"X{i}": "a" for i in range(protocol.BATCHING_MAX_CALLS)})
