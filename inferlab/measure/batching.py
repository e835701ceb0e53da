"""Optional extension: the two prompts singly and as a left-padded two-row batch, in both orders.

Four greedy generate() calls in total (each prompt alone, then [P1, P2] and [P2, P1]), within
protocol.BATCHING_MAX_CALLS. No warmup call is made: this is a correctness comparison, not a
throughput benchmark, so there is no timing to protect from first-call effects.

Position ids are not passed; in transformers 4.57.1 GenerationMixin.prepare_inputs_for_generation
(GPTNeoXForCausalLM does not override it) derives them from the 2D attention mask on every step:
``position_ids = attention_mask.long().cumsum(-1) - 1`` then ``masked_fill_(attention_mask == 0, 1)``,
sliced to the new tokens once a cache exists. Left padding therefore leaves each row's real tokens
at positions 0..T_row-1, as in the singleton run. The prefill positions the model actually received
are captured with a forward pre-hook and compared with that rule.
"""

from __future__ import annotations


import torch

from inferlab import protocol
from inferlab.measure.cache_check import top2_margin
from inferlab.measure.inputs import choose_pad_token, encode_prompt
from inferlab.measure.loading import capture_messages
from inferlab.measure.sampling import build_generation_config, processors_for, timed_generate
from inferlab.measure.stats import first_divergence

BATCH_CONDITION = "G"
PADDING_SIDE = "left"
POSITION_RULE = (
    "transformers 4.57.1 GenerationMixin.prepare_inputs_for_generation: position_ids = "
    "attention_mask.long().cumsum(-1) - 1, masked_fill_(attention_mask == 0, 1); during decoding the mask "
    "grows by one column of ones per step and the positions are sliced to the new token"
)
NUMERIC_EXPLANATION = (
    "A batch row and its singleton run the same weights on the same unpadded token ids at the same positions, "
    "so they differ only by floating-point rounding. Left padding makes the padded row's tensors longer "
    "(B x T_max instead of 1 x T): the matmuls have different shapes, so CPU kernels may block and sum in a "
    "different order; masked key positions receive the dtype minimum and get exactly zero softmax weight, but "
    "they still lengthen the softmax and matmul reductions. Such reduction-order differences are small relative "
    "to the logits; they can change a selected token only where the top-two margin is comparably small, after "
    "which the continuations legitimately diverge. A difference is therefore not evidence that a row was mapped "
    "to the wrong request; the mapping is checked separately by comparing each row's unpadded prompt ids."
)


def left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists by hand with an existing pad id; returns (input_ids (B, T_max), attention_mask (B, T_max)).

    Done here rather than through the tokenizer so the shared tokenizer's padding state is never touched.
    """
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)  # (B, T_max)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T_max)
    for row, ids in enumerate(rows):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask


def positions_by_rule(attention_mask: torch.Tensor) -> torch.Tensor:
    """Prefill position ids by the 4.57.1 rule in POSITION_RULE; (B, T) -> (B, T)."""
    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)
    return position_ids


def truncate_after_eos(ids: list[int], eos_token_id: int) -> list[int]:
    """Ids up to and including the first EOS.

    After a row selects EOS, generate() writes pad ids into it while other rows continue; since
    every later id of that row is such a pad, cutting at the first EOS is exact even when pad == EOS.
    """
    return ids[: ids.index(eos_token_id) + 1] if eos_token_id in ids else list(ids)


@torch.inference_mode()
def _generate_call(model, call_index, request_ids, rows, generation_config, pad_token_id) -> tuple[dict, dict]:
    """One recorded generate() call over left-padded rows; returns (call record, tensors)."""
    input_ids, attention_mask = left_pad(rows, pad_token_id)  # (B, T_max) each
    base_model = getattr(model, model.base_model_prefix)
    observed_positions: list[torch.Tensor] = []

    def keep_prefill_positions(module, args, kwargs):
        # Only the first forward is the prefill; later ones carry one new position per row.
        if not observed_positions and kwargs.get("position_ids") is not None:
            observed_positions.append(kwargs["position_ids"].detach().clone())

    hook = base_model.register_forward_pre_hook(keep_prefill_positions, with_kwargs=True)
    try:
        with capture_messages() as messages:
            output, elapsed_s = timed_generate(model, input_ids, attention_mask, generation_config)
    finally:
        hook.remove()

    width = input_ids.shape[1]
    sequences = output.sequences.detach().clone()  # (B, T_max + n)
    step_logits = torch.stack([step.detach().float() for step in output.logits], dim=1)  # (B, n, vocab)
    expected_positions = positions_by_rule(attention_mask)  # (B, T_max)
    observed = observed_positions[0] if observed_positions else None
    record = {
        "call_index": call_index,
        "call_type": "single" if len(rows) == 1 else "batch",
        "request_ids": list(request_ids),
        "row_to_request": {str(row): request for row, request in enumerate(request_ids)},
        "input_ids": input_ids.tolist(),
        "attention_mask": attention_mask.tolist(),
        "padding_side": PADDING_SIDE,
        "pad_token_id": pad_token_id,
        "position_ids_rule": POSITION_RULE,
        "prefill_position_ids_by_rule": expected_positions.tolist(),
        "prefill_position_ids_observed": observed.tolist() if observed is not None else None,
        "prefill_positions_match_rule": bool(observed is not None and torch.equal(observed, expected_positions)),
        "sequence_ids": sequences.tolist(),
        "generated_ids_raw": sequences[:, width:].tolist(),
        "warnings": list(messages),
        "elapsed_s": elapsed_s,
    }
    return record, {"sequences": sequences, "step_logits": step_logits}


def _compare_row(batch_call, batch_tensors, row, single_call, single_tensors, eos_token_id) -> dict:
    """One batch row against the singleton run of the same request."""
    request = batch_call["request_ids"][row]
    mask = torch.tensor(batch_call["attention_mask"][row], dtype=torch.bool)
    unpadded_prompt = torch.tensor(batch_call["input_ids"][row])[mask].tolist()
    single_prompt = single_call["input_ids"][0]
    batch_ids = truncate_after_eos(batch_call["generated_ids_raw"][row], eos_token_id)
    single_ids = truncate_after_eos(single_call["generated_ids_raw"][0], eos_token_id)
    divergence = first_divergence(batch_ids, single_ids)

    batch_logits = batch_tensors["step_logits"][row]  # (n_batch, vocab)
    single_logits = single_tensors["step_logits"][0]  # (n_single, vocab)
    # Step k's logits are comparable while the ids fed before step k agree: up to the divergence, inclusive.
    comparable = min(len(batch_ids), len(single_ids))
    if divergence is not None:
        comparable = min(comparable, divergence + 1)
    per_step = [float((batch_logits[k] - single_logits[k]).abs().max()) for k in range(comparable)]
    first_batch, first_single = batch_logits[0], single_logits[0]  # (vocab,)
    return {
        "batch_call_index": batch_call["call_index"],
        "row": row,
        "request_id": request,
        "singleton_call_index": single_call["call_index"],
        "unpadded_prompt_matches_singleton": unpadded_prompt == single_prompt,
        "padding_columns": int((~mask).sum()),
        "first_step_max_abs_diff": per_step[0] if per_step else float((first_batch - first_single).abs().max()),
        "first_step_argmax_batch": int(first_batch.argmax()),
        "first_step_argmax_single": int(first_single.argmax()),
        "first_step_argmax_agree": bool(first_batch.argmax() == first_single.argmax()),
        "first_step_top2_margin_single": top2_margin(first_single),
        "first_step_top2_margin_batch": top2_margin(first_batch),
        "per_step_max_abs_diff": per_step,
        "generated_ids_batch": batch_ids,
        "generated_ids_single": single_ids,
        "generated_ids_identical": divergence is None,
        "first_divergence": divergence,
    }


def run_batching(model, tokenizer, prompts: dict[str, str]) -> tuple[dict, dict[str, torch.Tensor]]:
    """Singletons, then the batch in prompt order and reversed; returns (record, tensors).

    record: {"calls": [...], "comparisons": [...], "summary": {...}, ...}; tensors maps
    "call{i}_sequences" (B, T_max + n) and "call{i}_step_logits" (B, n, vocab) for every call.
    """
    request_ids = list(prompts)
    call_plan = [[r] for r in request_ids] + [request_ids, list(reversed(request_ids))]
    if len(request_ids) < 2 or len(call_plan) > protocol.BATCHING_MAX_CALLS:
        raise ValueError(
            f"run_batching: {len(request_ids)} prompts need {len(call_plan)} calls; expected at least 2 prompts "
            f"and at most protocol.BATCHING_MAX_CALLS={protocol.BATCHING_MAX_CALLS} calls"
        )
    pad_token_id, pad_reason = choose_pad_token(tokenizer)
    eos_token_id = tokenizer.eos_token_id
    condition = protocol.CONDITIONS[BATCH_CONDITION]
    with capture_messages() as config_warnings:
        generation_config = build_generation_config(condition, eos_token_id, pad_token_id, tokenizer.bos_token_id)
    token_ids = {r: encode_prompt(tokenizer, r, prompts[r])[0]["token_ids"] for r in request_ids}

    calls, tensors, call_tensors = [], {}, []
    for call_index, members in enumerate(call_plan):
        record, produced = _generate_call(
            model, call_index, members, [token_ids[r] for r in members], generation_config, pad_token_id
        )
        calls.append(record)
        call_tensors.append(produced)
        tensors[f"call{call_index}_sequences"] = produced["sequences"]
        tensors[f"call{call_index}_step_logits"] = produced["step_logits"]

    singleton_of = {c["request_ids"][0]: c["call_index"] for c in calls if c["call_type"] == "single"}
    comparisons = []
    for call in calls:
        if call["call_type"] != "batch":
            continue
        for row, request in enumerate(call["request_ids"]):
            single_index = singleton_of[request]
            comparisons.append(
                _compare_row(
                    call, call_tensors[call["call_index"]], row,
                    calls[single_index], call_tensors[single_index], eos_token_id,
                )
            )

    summary = {
        "generate_calls": len(calls),
        "max_calls_allowed": protocol.BATCHING_MAX_CALLS,
        "warmup_calls": 0,
        "rows_compared": len(comparisons),
        "all_row_mappings_verified": all(c["unpadded_prompt_matches_singleton"] for c in comparisons),
        "all_prefill_positions_match_rule": all(c["prefill_positions_match_rule"] for c in calls),
        "first_step_max_abs_diff": max(c["first_step_max_abs_diff"] for c in comparisons),
        "first_step_argmax_all_agree": all(c["first_step_argmax_agree"] for c in comparisons),
        "generated_ids_all_identical": all(c["generated_ids_identical"] for c in comparisons),
        "divergent_rows": [
            {"batch_call_index": c["batch_call_index"], "row": c["row"], "first_divergence": c["first_divergence"]}
            for c in comparisons
            if not c["generated_ids_identical"]
        ],
        "explanation": NUMERIC_EXPLANATION,
        # Every message of the extension in one list: the config's, then each call's in call order.
        "warnings": list(config_warnings) + [message for call in calls for message in call["warnings"]],
    }
    record = {
        "condition": BATCH_CONDITION,
        "generation_config": generation_config.to_dict(),
        "config_warnings": list(config_warnings),
        "processors": processors_for(model, generation_config, max(len(ids) for ids in token_ids.values())),
        "pad_token_id": pad_token_id,
        "pad_choice": pad_reason,
        "pad_use_in_batch": (
            "the pad id fills the left-padding columns of the shorter row, whose attention_mask is 0, so no real "
            "token attends to them; after a row selects EOS, generate() appends this id to it"
        ),
        "padding_side": PADDING_SIDE,
        "padding_method": "manual left padding with the chosen existing pad id; tokenizer state not modified",
        "eos_token_id": eos_token_id,
        "prompt_token_ids": token_ids,
        "position_ids_rule": POSITION_RULE,
        "post_eos_rule": "generated ids are cut after the first EOS; generate() fills finished rows with pad_token_id",
        "calls": calls,
        "comparisons": comparisons,
        "summary": summary,
    }
    return record, tensors
