"""The optional extension: the two prompts singly and as a left-padded two-row batch, in both orders.

Four greedy generate() calls (each prompt alone, then [P1, P2] and [P2, P1]), within protocol.BATCHING_MAX_CALLS,
and no warmup: a correctness comparison, not a throughput benchmark. Position ids are not passed: in transformers
4.57.1 prepare_inputs_for_generation derives them from the 2-D mask on every step (POSITION_RULE), so left padding
leaves each row's real tokens at positions 0..T_row-1, as alone. The prefill positions the model received are
captured with a forward pre-hook and compared with that rule.
"""

from __future__ import annotations

import torch

from inferlab import protocol
from inferlab.measure.inputs import choose_pad_token, encode_prompt
from inferlab.measure.loading import capture_messages
from inferlab.measure.sampling import build_generation_config, describe, observe_builders, timed_generate
from inferlab.measure.stats import first_divergence

BATCH_CONDITION = "G"
PADDING_SIDE = "left"
POSITION_RULE = (
    "transformers 4.57.1 GenerationMixin.prepare_inputs_for_generation: position_ids = "
    "attention_mask.long().cumsum(-1) - 1, masked_fill_(attention_mask == 0, 1); during decoding the mask "
    "grows by one column of ones per step and the positions are sliced to the new token"
)


def left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists by hand with an existing pad id (the shared tokenizer's padding state is never touched):
    (input_ids (B, T_max), attention_mask (B, T_max))."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)  # (B, T_max)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T_max)
    for row, ids in enumerate(rows):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask


def positions_by_rule(attention_mask: torch.Tensor) -> torch.Tensor:
    """Prefill position ids by POSITION_RULE: (B, T) -> (B, T)."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill_(attention_mask == 0, 1)


def truncate_after_eos(ids: list[int], eos_token_id: int) -> list[int]:
    """Ids up to and including the first EOS: after it generate() writes pad ids into a finished row while others go
    on, so the cut is exact even when pad == EOS."""
    return ids[: ids.index(eos_token_id) + 1] if eos_token_id in ids else list(ids)


@torch.inference_mode()
def _generate_call(model, call_index, request_ids, rows, generation_config, pad_token_id) -> tuple[dict, dict]:
    """One recorded generate() call over left-padded rows: (call record, its tensors)."""
    input_ids, attention_mask = left_pad(rows, pad_token_id)  # (B, T_max) each
    observed: list[torch.Tensor] = []

    def keep_prefill_positions(module, args, kwargs):  # only the first forward is the prefill
        if not observed and kwargs.get("position_ids") is not None:
            observed.append(kwargs["position_ids"].detach().clone())

    hook = getattr(model, model.base_model_prefix).register_forward_pre_hook(keep_prefill_positions, with_kwargs=True)
    try:
        with capture_messages() as messages:
            output, elapsed_s = timed_generate(model, input_ids, attention_mask, generation_config)
    finally:
        hook.remove()
    sequences = output.sequences.detach().clone()  # (B, T_max + n)
    step_logits = torch.stack([step.detach().float() for step in output.logits], dim=1)  # (B, n, vocab)
    expected = positions_by_rule(attention_mask)  # (B, T_max)
    seen = observed[0] if observed else None
    record = {
        "call_index": call_index, "call_type": "single" if len(rows) == 1 else "batch",
        "request_ids": list(request_ids), "row_to_request": {str(row): r for row, r in enumerate(request_ids)},
        "input_ids": input_ids.tolist(), "attention_mask": attention_mask.tolist(), "padding_side": PADDING_SIDE,
        "pad_token_id": pad_token_id, "prefill_position_ids_by_rule": expected.tolist(),
        "prefill_position_ids_observed": seen.tolist() if seen is not None else None,
        "prefill_positions_match_rule": bool(seen is not None and torch.equal(seen, expected)),
        "sequence_ids": sequences.tolist(), "generated_ids_raw": sequences[:, input_ids.shape[1]:].tolist(),
        "warnings": list(messages), "elapsed_s": elapsed_s,
    }
    return record, {"sequences": sequences, "step_logits": step_logits}


def _top2_margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits.double(), 2).values  # (2,)
    return float(top[0] - top[1])


def _compare_row(batch_call, batch_tensors, row, single_call, single_tensors, eos_token_id) -> dict:
    """One batch row against the singleton run of the same request."""
    mask = torch.tensor(batch_call["attention_mask"][row], dtype=torch.bool)
    batch_ids = truncate_after_eos(batch_call["generated_ids_raw"][row], eos_token_id)
    single_ids = truncate_after_eos(single_call["generated_ids_raw"][0], eos_token_id)
    divergence = first_divergence(batch_ids, single_ids)
    batch_logits, single_logits = batch_tensors["step_logits"][row], single_tensors["step_logits"][0]  # (n, vocab)
    # step k's logits are comparable while the ids fed before it agree: up to the divergence, inclusive
    comparable = min(len(batch_ids), len(single_ids), len(batch_ids) if divergence is None else divergence + 1)
    per_step = [float((batch_logits[k] - single_logits[k]).abs().max()) for k in range(comparable)]
    first_batch, first_single = batch_logits[0], single_logits[0]  # (vocab,)
    return {
        "batch_call_index": batch_call["call_index"], "row": row, "request_id": batch_call["request_ids"][row],
        "singleton_call_index": single_call["call_index"],
        "unpadded_prompt_matches_singleton": torch.tensor(batch_call["input_ids"][row])[mask].tolist()
        == single_call["input_ids"][0],
        "padding_columns": int((~mask).sum()),
        "first_step_max_abs_diff": per_step[0] if per_step else float((first_batch - first_single).abs().max()),
        "first_step_argmax_batch": int(first_batch.argmax()), "first_step_argmax_single": int(first_single.argmax()),
        "first_step_argmax_agree": bool(first_batch.argmax() == first_single.argmax()),
        "first_step_top2_margin_single": _top2_margin(first_single),
        "first_step_top2_margin_batch": _top2_margin(first_batch),
        "per_step_max_abs_diff": per_step, "generated_ids_batch": batch_ids, "generated_ids_single": single_ids,
        "generated_ids_identical": divergence is None, "first_divergence": divergence,
    }


def run_batching(model, tokenizer, prompts: dict[str, str]) -> tuple[dict, dict[str, torch.Tensor]]:
    """The singletons, then the batch in prompt order and reversed: (record, tensors), with "call{i}_sequences"
    (B, T_max + n) and "call{i}_step_logits" (B, n, vocab) for every call."""
    request_ids = list(prompts)
    call_plan = [[r] for r in request_ids] + [request_ids, list(reversed(request_ids))]
    if len(request_ids) < 2 or len(call_plan) > protocol.BATCHING_MAX_CALLS:
        raise ValueError(f"run_batching: {len(request_ids)} prompts need {len(call_plan)} calls; expected at least 2 "
                         f"prompts and at most protocol.BATCHING_MAX_CALLS={protocol.BATCHING_MAX_CALLS} calls")
    pad_token_id, pad_reason = choose_pad_token(tokenizer)
    eos_token_id = tokenizer.eos_token_id
    with capture_messages() as config_warnings:
        config = build_generation_config(protocol.CONDITIONS[BATCH_CONDITION], eos_token_id, pad_token_id,
                                         tokenizer.bos_token_id)
    token_ids = {r: encode_prompt(tokenizer, r, prompts[r])[0]["token_ids"] for r in request_ids}
    calls, produced = [], []
    with observe_builders(model) as built:  # what acted on the logits, as generate() built it
        for index, members in enumerate(call_plan):
            record, tensors = _generate_call(model, index, members, [token_ids[r] for r in members], config,
                                             pad_token_id)
            calls.append(record)
            produced.append(tensors)
    single = {c["request_ids"][0]: c["call_index"] for c in calls if c["call_type"] == "single"}
    comparisons = [_compare_row(call, produced[call["call_index"]], row, calls[single[request]],
                                produced[single[request]], eos_token_id)
                   for call in calls if call["call_type"] == "batch" for row, request in enumerate(call["request_ids"])]
    summary = {
        "generate_calls": len(calls), "max_calls_allowed": protocol.BATCHING_MAX_CALLS, "warmup_calls": 0,
        "rows_compared": len(comparisons),
        "all_row_mappings_verified": all(c["unpadded_prompt_matches_singleton"] for c in comparisons),
        "all_prefill_positions_match_rule": all(c["prefill_positions_match_rule"] for c in calls),
        "first_step_max_abs_diff": max(c["first_step_max_abs_diff"] for c in comparisons),
        "first_step_argmax_all_agree": all(c["first_step_argmax_agree"] for c in comparisons),
        "generated_ids_all_identical": all(c["generated_ids_identical"] for c in comparisons),
        "divergent_rows": [{"batch_call_index": c["batch_call_index"], "row": c["row"],
                            "first_divergence": c["first_divergence"]}
                           for c in comparisons if not c["generated_ids_identical"]],
        # every message of the extension in one list: the config's, then each call's in call order
        "warnings": list(config_warnings) + [message for call in calls for message in call["warnings"]],
    }
    record = {
        "condition": BATCH_CONDITION, "generation_config": config.to_dict(), "config_warnings": list(config_warnings),
        "processors": describe(built["processors"]), "pad_token_id": pad_token_id, "pad_choice": pad_reason,
        "pad_use_in_batch": ("the pad id fills the left-padding columns of the shorter row, whose attention_mask is 0, "
                             "so no real token attends to them; after a row selects EOS, generate() appends this id "
                             "to it"),
        "padding_side": PADDING_SIDE,
        "padding_method": "manual left padding with the chosen existing pad id; tokenizer state not modified",
        "eos_token_id": eos_token_id, "prompt_token_ids": token_ids, "position_ids_rule": POSITION_RULE,
        "post_eos_rule": "generated ids are cut after the first EOS; generate() fills finished rows with pad_token_id",
        "calls": calls, "comparisons": comparisons, "summary": summary,
    }
    tensors = {f"call{i}_{name}": t[name] for i, t in enumerate(produced) for name in ("sequences", "step_logits")}
    return record, tensors
