"""Consistency of the records that need no tensor and no tokenizer: each generation trial's fields from its ids,
the sampling summaries from their trials, the memory records against their formulas (inferlab.measure.sizes) and each
other, the clock-overhead and bandwidth arithmetic, and the batching calls and rows from their own ids."""

from __future__ import annotations

import statistics
import types
from typing import Optional

from inferlab import protocol
from inferlab.measure import near_tie, sizes, summaries
from inferlab.verify.consistency_shared import Recheck, label, same

FLOAT32_BYTES = 4  # the protocol's dtype (protocol.TORCH_DTYPE): parameters and cache entries are float32


def check(recheck: Recheck) -> None:
    """Every check of this module, in order."""
    for record in recheck.view.kind("input"):
        ids = record.get("token_ids")
        if isinstance(ids, list):
            recheck.expect(record, "length", len(ids), "len(token_ids)")
        if isinstance(record.get("serialized"), str) and isinstance(record.get("source"), str):
            recheck.expect(record, "serialized_matches_source", record["serialized"] == record["source"],
                           "serialized and source")
    for record in recheck.completed("generation"):
        _generation(recheck, record)
    for record in recheck.view.kind("sampling_summary"):
        _recomputed(recheck, record, summaries.sampling_summary, "its generation trials (summaries.sampling_summary)",
                    recheck.before("generation", record), record.get("prompt_id"))
    _memory(recheck)
    _clock_and_bandwidth(recheck)
    _batching(recheck)


def _recomputed(recheck: Recheck, record: dict, function, source: str, *arguments) -> None:
    try:
        expected = function(*arguments)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        recheck.not_checked(label(record), f"cannot be recomputed from the records before it "
                                           f"({type(error).__name__}: {error})")
        return
    recheck.expect_fields(record, expected, source)


def _generation(recheck: Recheck, record: dict) -> None:
    """A completed generation trial: its lengths, sequence, EOS positions and stop reason from its ids, its prompt
    ids as the prompt was tokenized, and (greedy) its first id the argmax of its first-step logits."""
    ids, prompt = record.get("generated_ids"), record.get("prompt_ids")
    if not isinstance(ids, list):
        return
    recheck.expect(record, "generated_length", len(ids), "len(generated_ids)")
    recheck.expect(record, "logit_steps_returned", len(ids), "len(generated_ids) (one logit step per selection)")
    if isinstance(prompt, list):
        recheck.expect(record, "prompt_length", len(prompt), "len(prompt_ids)")
        recheck.expect(record, "sequence_ids", prompt + ids, "prompt_ids + generated_ids")
        tokenized = recheck.inputs().get(record.get("prompt_id"))
        if tokenized is not None and not same(prompt, tokenized):
            recheck.differs(record, "prompt_ids", prompt, tokenized, f"the input record of {record.get('prompt_id')}")
    eos = record.get("eos_token_id")
    if isinstance(eos, int):
        recheck.expect(record, "eos_positions", [i for i, token in enumerate(ids) if token == eos],
                       "generated_ids and eos_token_id")
        config = record.get("generation_config") if isinstance(record.get("generation_config"), dict) else {}
        budget = config.get("max_new_tokens", protocol.MAX_NEW_TOKENS)
        # sampling.STOP_RULE_TEXT: eos when the last id is EOS, max_new_tokens when the budget was used up
        reason = "eos" if ids and ids[-1] == eos else "max_new_tokens" if len(ids) == budget else "unexplained"
        recheck.expect(record, "stop_reason", reason, "generated_ids, eos_token_id and max_new_tokens")
    condition = protocol.CONDITIONS.get(record.get("condition"))
    if condition is not None and not condition.do_sample:
        greedy_steps(recheck, record)
    argmax = record.get("first_step_logits_argmax")
    if condition is not None and not condition.do_sample and ids and isinstance(argmax, int) and ids[0] != argmax:
        recheck.differs(record, "generated_ids[0]", ids[0], argmax,
                        "first_step_logits_argmax (greedy selects the argmax of the raw first-step logits)")


def greedy_steps(recheck: Recheck, record: dict) -> None:
    """A greedy trial's per-step top two (inferlab.measure.near_tie), when it recorded them: a [top, second] pair per
    generated id, top >= second, and the selected id of each step the id the trial generated there."""
    values, ids = record.get(near_tie.STEP_VALUES_FIELD), record.get(near_tie.STEP_IDS_FIELD)
    problem = near_tie.shape_problem(values, ids)
    if problem is not None:
        recheck.checker.problem(f"inconsistent: {label(record)} {problem}")
        return
    generated = record.get("generated_ids")
    if values is None or not isinstance(generated, list):
        return
    if len(values) != len(generated):
        recheck.differs(record, f"len({near_tie.STEP_VALUES_FIELD})", len(values), len(generated),
                        "len(generated_ids) (one pair per greedy step)")
    if ids is not None:
        selected = [pair[0] for pair in ids]
        if not same(selected, generated[:len(selected)]):
            recheck.differs(record, f"{near_tie.STEP_IDS_FIELD}[*][0]", selected, generated,
                            "generated_ids (greedy selects the top of each step)")


# --- memory ------------------------------------------------------------------------------------------


def _config(recheck: Recheck) -> Optional[types.SimpleNamespace]:
    """The loaded model's config as model_inspection recorded it, with every field the size formulas read."""
    inspection = recheck.view.first("model_inspection")
    config = inspection.get("config") if isinstance(inspection, dict) else None
    needed = ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_hidden_layers",
              "tie_word_embeddings")
    if not isinstance(config, dict) or not all(name in config for name in needed):
        return None
    return types.SimpleNamespace(**{name: config[name] for name in needed})


def _memory(recheck: Recheck) -> None:
    """Parameter and cache sizes against their formulas (from the recorded config) and against each other."""
    config = _config(recheck)
    inspection = recheck.view.first("model_inspection") or {}
    records = recheck.view.kind("memory")
    sized = [r for r in records if r.get("measure") in ("parameter_storage", "cache_storage")] + \
        recheck.view.kind("cache_inspection") + [t for t in recheck.completed("timing_trial")
                                                 if isinstance(t.get("cache_after_loop"), dict)]
    if config is None:
        if sized:
            recheck.not_checked("memory records against their formulas",
                                "model_inspection records no config with the sizes the formulas read")
        return
    for record in records:
        measure = record.get("measure")
        if measure == "parameter_storage":
            count = sizes.gpt_neox_parameter_count(config)
            recheck.expect(record, "analytic_parameter_count", count,
                           "the recorded config (sizes.gpt_neox_parameter_count)")
            recheck.expect(record, "analytic_bytes_fp32", count * FLOAT32_BYTES, "the parameter count x 4 bytes")
            recheck.expect(record, "parameter_count", inspection.get("parameter_count"), "model_inspection")
            recheck.expect(record, "unique_bytes", inspection.get("unique_parameter_storage_bytes"), "model_inspection")
        elif measure == "cache_storage":
            _cache_storage(recheck, record, config)
        elif measure == "unmeasured":
            before = recheck.before("memory", record)
            parameters = sum(r.get("unique_bytes") or 0 for r in before if r.get("measure") == "parameter_storage")
            caches = [r.get("unique_bytes") or 0 for r in before if r.get("measure") == "cache_storage"]
            recheck.expect(record, "counted_tensor_bytes", parameters + max(caches, default=0),
                           "the parameter bytes plus the largest cache recorded before it")
    for record in recheck.view.kind("cache_inspection"):
        length = record.get("get_seq_length")
        if isinstance(length, int):
            recheck.expect(record, "expected_bytes", sizes.expected_kv_cache_bytes(config, length),
                           "get_seq_length and the recorded config (sizes.expected_kv_cache_bytes)")
        if isinstance(record.get("layers"), list):
            recheck.expect(record, "layer_count", len(record["layers"]), "len(layers)")
    for trial in recheck.completed("timing_trial"):
        after = trial.get("cache_after_loop")
        if isinstance(after, dict) and isinstance(trial.get("prompt_length"), int):
            length = trial["prompt_length"] + protocol.TIMING_NEW_TOKENS - 1  # the last selection is never fed
            if not same(after.get("logical_length"), length):
                recheck.differs(trial, "cache_after_loop.logical_length", after.get("logical_length"), length,
                                "prompt_length + 15 (the 16th selection is never fed back)")
            if not same(after.get("unique_bytes"), sizes.expected_kv_cache_bytes(config, length)):
                recheck.differs(trial, "cache_after_loop.unique_bytes", after.get("unique_bytes"),
                                sizes.expected_kv_cache_bytes(config, length), "the recorded config and its length")


def _cache_storage(recheck: Recheck, record: dict, config) -> None:
    length = record.get("logical_length")
    if isinstance(length, int):
        recheck.expect(record, "expected_bytes", sizes.expected_kv_cache_bytes(config, length),
                       "logical_length and the recorded config (sizes.expected_kv_cache_bytes)")
    tokenized = recheck.inputs().get(record.get("prompt_id"))
    if tokenized is not None:
        recheck.expect(record, "prompt_length", len(tokenized), f"the input record of {record.get('prompt_id')}")
    source = record.get("source_trial")
    if isinstance(source, str):
        trial = next((t for t in recheck.completed("timing_trial") if t.get("schedule_id") == source), None)
        after = (trial or {}).get("cache_after_loop")
        if isinstance(after, dict):
            for field in ("unique_bytes", "logical_length", "per_layer"):
                if field in after:
                    recheck.expect(record, field, after[field], f"timing_trial {source} cache_after_loop")
    elif tokenized is not None and isinstance(length, int):
        recheck.expect(record, "logical_length", len(tokenized), "the prompt's length (one prefill, nothing fed)")


def _clock_and_bandwidth(recheck: Recheck) -> None:
    """The clock-overhead, weight-read (and an older run's bandwidth) records' arithmetic on what they measured."""
    for record in recheck.view.kind("clock_overhead"):
        reads, elapsed, per_read = record.get("reads"), record.get("elapsed_ns"), record.get("per_read_ns")
        if isinstance(reads, int) and reads > 0 and isinstance(elapsed, int):
            recheck.expect(record, "per_read_ns", elapsed / reads, "elapsed_ns / reads")
        if isinstance(per_read, (int, float)) and isinstance(record.get("reads_per_trial"), int):
            recheck.expect(record, "per_trial_overhead_ns", per_read * record["reads_per_trial"],
                           "per_read_ns x reads_per_trial")
    for record in recheck.view.kind("weight_read"):
        seconds = record.get("seconds")
        if isinstance(seconds, list) and seconds and all(isinstance(s, (int, float)) for s in seconds):
            recheck.expect(record, "passes", len(seconds), "len(seconds)")
            recheck.expect(record, "median_s", statistics.median(seconds), "median(seconds)")
    for record in recheck.view.kind("memory_bandwidth"):  # what older runs recorded instead of weight_read
        copied, seconds = record.get("bytes_per_copy"), record.get("seconds")
        if isinstance(copied, int):
            recheck.expect(record, "bytes_moved_per_copy", 2 * copied,
                           "2 x bytes_per_copy (each copy reads and writes)")
        if isinstance(seconds, list) and seconds and all(isinstance(s, (int, float)) for s in seconds):
            recheck.expect(record, "repeats", len(seconds), "len(seconds)")
            median = statistics.median(seconds)
            if isinstance(copied, int) and median > 0:
                recheck.expect(record, "bytes_per_s_median", 2 * copied / median,
                               "2 x bytes_per_copy / median(seconds)")


# --- batching ----------------------------------------------------------------------------------------


def _batching(recheck: Recheck) -> None:
    """Each call's rows from its requests and ids; each row comparison from its calls; the summary from the rows."""
    records = recheck.view.kind("batching")
    calls = {r.get("call_index"): r for r in records if r.get("record_type") == "call"}
    for call in calls.values():
        _batching_call(recheck, call)
    for summary in (r for r in records if r.get("record_type") == "summary"):
        rows = summary.get("comparisons") if isinstance(summary.get("comparisons"), list) else []
        for row in rows:
            if isinstance(row, dict):
                _batching_row(recheck, summary, row, calls)
        recheck.expect(summary, "generate_calls", len(calls), "the batching call records")
        if not rows:
            continue
        expected = {
            "rows_compared": len(rows),
            "all_row_mappings_verified": all(r.get("unpadded_prompt_matches_singleton") for r in rows),
            "first_step_argmax_all_agree": all(r.get("first_step_argmax_agree") for r in rows),
            "generated_ids_all_identical": all(r.get("generated_ids_identical") for r in rows),
            "divergent_rows": [{"batch_call_index": r.get("batch_call_index"), "row": r.get("row"),
                                "first_divergence": r.get("first_divergence")}
                               for r in rows if not r.get("generated_ids_identical")],
        }
        if all(isinstance(r.get("first_step_max_abs_diff"), (int, float)) for r in rows):
            expected["first_step_max_abs_diff"] = max(r["first_step_max_abs_diff"] for r in rows)
        if calls and all("prefill_positions_match_rule" in c for c in calls.values()):
            expected["all_prefill_positions_match_rule"] = all(c["prefill_positions_match_rule"]
                                                               for c in calls.values())
        recheck.expect_fields(summary, expected, "its row comparisons and calls")


def _batching_call(recheck: Recheck, call: dict) -> None:
    requests, mask = call.get("request_ids"), call.get("attention_mask")
    if isinstance(requests, list):
        recheck.expect(call, "row_to_request", {str(row): request for row, request in enumerate(requests)},
                       "request_ids (row i holds request i)")
        recheck.expect(call, "call_type", "single" if len(requests) == 1 else "batch", "len(request_ids)")
    if isinstance(mask, list) and all(isinstance(row, list) for row in mask):
        # batching.positions_by_rule: cumsum(mask) - 1, with 1 where the mask is 0
        by_rule = [[(sum(row[:i + 1]) - 1) if bit else 1 for i, bit in enumerate(row)] for row in mask]
        recheck.expect(call, "prefill_position_ids_by_rule", by_rule, "attention_mask (the position rule)")
        if "prefill_position_ids_observed" in call:
            recheck.expect(call, "prefill_positions_match_rule", same(call["prefill_position_ids_observed"], by_rule),
                           "prefill_position_ids_observed against the rule")
    sequences, inputs = call.get("sequence_ids"), call.get("input_ids")
    if isinstance(sequences, list) and isinstance(inputs, list) and inputs and isinstance(inputs[0], list):
        width = len(inputs[0])
        recheck.expect(call, "generated_ids_raw", [row[width:] for row in sequences if isinstance(row, list)],
                       "sequence_ids after the padded prompt's width")


def _batching_row(recheck: Recheck, summary: dict, row: dict, calls: dict) -> None:
    """One batch row against its singleton, from the two calls' records (its first-step logits: the tensors)."""
    batch, single = calls.get(row.get("batch_call_index")), calls.get(row.get("singleton_call_index"))
    where = f"comparisons[batch call {row.get('batch_call_index')} row {row.get('row')}]"
    index = row.get("row")
    if not isinstance(batch, dict) or not isinstance(single, dict) or not isinstance(index, int):
        return
    expected = {}
    requests = batch.get("request_ids")
    if isinstance(requests, list) and index < len(requests):
        expected["request_id"] = requests[index]
    mask, inputs = batch.get("attention_mask"), batch.get("input_ids")
    if isinstance(mask, list) and isinstance(inputs, list) and index < len(mask) and index < len(inputs):
        expected["padding_columns"] = sum(1 for bit in mask[index] if not bit)
        unpadded = [token for token, bit in zip(inputs[index], mask[index]) if bit]
        single_inputs = single.get("input_ids")
        if isinstance(single_inputs, list) and single_inputs:
            expected["unpadded_prompt_matches_singleton"] = unpadded == single_inputs[0]
    batch_ids, single_ids = row.get("generated_ids_batch"), row.get("generated_ids_single")
    if isinstance(batch_ids, list) and isinstance(single_ids, list):
        divergence = summaries.first_divergence(batch_ids, single_ids)
        expected["first_divergence"] = divergence
        expected["generated_ids_identical"] = divergence is None
        raw = batch.get("generated_ids_raw")
        if isinstance(raw, list) and index < len(raw) and raw[index][:len(batch_ids)] != batch_ids:
            recheck.differs(summary, f"{where}.generated_ids_batch", batch_ids, raw[index][:len(batch_ids)],
                            f"batching call {row.get('batch_call_index')} generated_ids_raw row {index}")
    if "first_step_argmax_batch" in row and "first_step_argmax_single" in row:
        expected["first_step_argmax_agree"] = row["first_step_argmax_batch"] == row["first_step_argmax_single"]
    per_step = row.get("per_step_max_abs_diff")
    if isinstance(per_step, list) and per_step:
        expected["first_step_max_abs_diff"] = per_step[0]
    for field, value in expected.items():
        if field in row and not same(row[field], value):
            recheck.differs(summary, f"{where}.{field}", row[field], value, "the batching calls' records")
