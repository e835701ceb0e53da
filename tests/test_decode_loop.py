"""inferlab.measure.decode_loop on the tiny model: selections, stamps and times, forwards, logits_to_keep, the usage
reads, what its own reads cost, and its check against generate() (by ids for P1, by inputs for P1x8)."""

from __future__ import annotations

import json

import pytest
import torch

from inferlab import protocol
from inferlab.measure import decode_loop, usage
from inferlab.measure.cache_check import compare_vectors
from inferlab.measure.decode_loop import bare_greedy_loop, run_greedy_loop
from inferlab.measure.sampling import greedy_generation_config
from inferlab.specimen.build import tiny_gpt_neox
from tiny_specimen import tiny_tokenizer

from test_cache_check import ignoring_logits_to_keep

N = protocol.TIMING_NEW_TOKENS
PROMPT = [5, 17, 33, 2, 9, 40, 11]
EOS = 0
BOTH = pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])


@pytest.fixture(scope="module")
def prompt():
    ids = torch.tensor([PROMPT], dtype=torch.long)  # (1, T)
    return ids, torch.ones_like(ids)


@pytest.fixture(scope="module")
def runs(model, prompt):
    return {cache: run_greedy_loop(model, *prompt, use_cache=cache, eos_token_id=EOS) for cache in (True, False)}


def fed(model, call) -> list[dict]:
    """What the model received at each forward while call() ran, as decode_loop.COMPARED names it."""
    seen = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append({name: decode_loop._plain(kwargs.get(name))
                                                  for name in decode_loop.COMPARED}), with_kwargs=True)
    try:
        call()
    finally:
        handle.remove()
    return seen


@BOTH
def test_exactly_n_selections_with_increasing_stamps_and_times_by_their_definitions(runs, use_cache):
    record = runs[use_cache].to_record()
    start, times = record["t_start_ns"], record["token_times_ns"]
    boundaries = [start, record["t_prefill_done_ns"], *times]
    assert len(record["generated_ids"]) == len(times) == record["output_length"] == N
    assert all(b > a for a, b in zip(boundaries, boundaries[1:])), boundaries
    assert (record["prefill_s"], record["ttft_s"], record["loop_s"]) == (
        (boundaries[1] - start) / 1e9, (times[0] - start) / 1e9, record["token_times_s"][-1])
    assert record["mean_post_first_interval_s"] == (times[-1] - times[0]) / (N - 1) / 1e9  # from the integer stamps
    assert json.loads(json.dumps(record)) == record
    assert decode_loop.declaration(usage.DEFAULT_POLICY)["stopping_rule"] == protocol.TIMING_STOPPING_RULE


@BOTH
def test_one_prefill_then_one_forward_per_selection_and_a_cache_of_the_fed_length(model, prompt, use_cache):
    results = []
    steps = fed(model, lambda: results.append(run_greedy_loop(model, *prompt, use_cache=use_cache)))
    T = len(PROMPT)
    fed_lengths = [1] * (N - 1) if use_cache else list(range(T + 1, T + N))
    assert [len(step["input_ids"][0]) for step in steps] == [T] + fed_lengths
    cache = results[0].cache  # the last selected token is never fed, so the cache holds prompt + N - 1 tokens
    assert cache.get_seq_length() == T + N - 1 if use_cache else cache is None


@BOTH
def test_the_forward_honours_logits_to_keep_and_the_loop_checks_it_on_the_prefill_where_it_tells(runs, model, prompt,
                                                                                                monkeypatch, use_cache):
    vocab = model.config.vocab_size
    with torch.inference_mode():  # the interface fact the loop relies on: the last position only, as in full
        kept, full = [model(input_ids=prompt[0], attention_mask=prompt[1], use_cache=use_cache,
                            logits_to_keep=keep).logits for keep in (1, 0)]
    assert list(kept.shape) == [1, 1, vocab]
    assert compare_vectors(kept[0, -1], full[0, -1], protocol.CACHE_TOLERANCE)["passed"]
    honest = runs[use_cache]
    assert decode_loop.loop_logits_to_keep(honest.prefill_logits_shape, honest.last_logits_shape, 1, vocab)["ok"]
    result = run_greedy_loop(ignoring_logits_to_keep(monkeypatch), *prompt, use_cache=use_cache)
    if use_cache:  # the last forward alone could not tell: it fed one token
        assert result.last_logits_shape == [1, 1, vocab]
    kept = decode_loop.loop_logits_to_keep(result.prefill_logits_shape, result.last_logits_shape, 1, vocab)
    assert not kept["ok"] and kept["prefill"]["observed_shape"] == [1, len(PROMPT), vocab]


@pytest.mark.parametrize("ids, mask", [(torch.tensor([PROMPT, PROMPT]), torch.ones((2, 7), dtype=torch.long)),
                                       (torch.tensor([PROMPT]), torch.ones((1, 3), dtype=torch.long))],
                         ids=["batch_of_two", "mask_shape_mismatch"])
def test_rejects_inputs_it_does_not_support(model, ids, mask):
    with pytest.raises(ValueError, match="decode loop"):
        run_greedy_loop(model, ids, mask, use_cache=True)


@BOTH
def test_the_usage_is_read_at_the_span_ends_only_and_the_clock_as_often_as_it_says(model, prompt, monkeypatch,
                                                                                    use_cache):
    events = []
    real_clock = decode_loop.time.perf_counter_ns
    real_start, real_end = usage.usage_reader()
    monkeypatch.setattr(decode_loop.time, "perf_counter_ns", lambda: events.append("clock") or real_clock())
    monkeypatch.setattr(decode_loop.usage, "usage_reader", lambda: (lambda: events.append("usage") or real_start(),
                                                                    lambda: events.append("usage") or real_end()))
    result = run_greedy_loop(model, *prompt, use_cache=use_cache)
    assert events == ["usage", "clock", "clock", "usage"] + ["clock"] * N + ["usage"]
    assert events.count("clock") == decode_loop.clock_reads_per_trial(N)
    assert events.count("usage") == decode_loop.USAGE_READS_PER_TRIAL
    record = result.to_record()
    assert set(record["cpu_readings"]) == set(usage.READING_POINTS)
    assert {k: record[k] for k in ("cpu_evidence", "contended")} == {
        k: usage.recorded_evidence(record)[k] for k in ("cpu_evidence", "contended")}
    loop = record["cpu_evidence"]["loop"]
    assert loop["wall_ns"] == result.token_times_ns[-1] - result.t_start_ns  # exactly the span of loop_s
    if loop["cpu_ns"] is not None:
        assert 0 < loop["cpu_ns"] <= loop["wall_ns"] + 200_000


def test_the_clock_overhead_is_measured_alone_and_counts_the_reads_it_claims(model, monkeypatch):
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    reads = []
    real_clock = decode_loop.time.perf_counter_ns
    monkeypatch.setattr(decode_loop.time, "perf_counter_ns", lambda: reads.append(1) or real_clock())
    try:
        overhead = decode_loop.clock_overhead(reads=2_000)
    finally:
        hook.remove()
    assert calls == [] and len(reads) == 2_000 + 2  # no forward; the reads bracketed by a start and an end read
    assert overhead["per_read_ns"] == overhead["elapsed_ns"] / 2_000 and overhead["reads_per_trial"] == 18
    assert overhead["per_trial_overhead_ns"] == pytest.approx(overhead["per_read_ns"] * 18)
    assert overhead["usage_reads"] == 2 * (2_000 // 20) and overhead["usage_per_read_ns"] > 0
    assert (overhead["usage_reads_per_trial"], overhead["usage_reads_inside_loop"]) == (3, 1)
    assert overhead["watch_collections"] == 100


def test_profiling_text_is_decoded_with_special_tokens_kept():
    tokenizer = tiny_tokenizer()
    ids = tokenizer("A small boat", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    text, elapsed_s = decode_loop.decode_profiling_text(tokenizer, ids)
    assert text == "A small boat" + tokenizer.eos_token and elapsed_s >= 0


def generate_trial(model, prompt, eos: int) -> dict:
    """A real greedy generate() call, as the matrix's greedy trial records it."""
    output = model.generate(input_ids=prompt[0], attention_mask=prompt[1], use_model_defaults=False,
                            generation_config=greedy_generation_config(N, eos, eos))
    ids = output[0, len(PROMPT):].tolist()
    return {"prompt_id": "P1", "condition": "G", "status": "ok", "trial_id": "P1-G-rep1", "generated_ids": ids,
            "stop_reason": "eos" if ids[-1] == eos else "max_new_tokens"}


def loop_trial(model, prompt, eos: int) -> dict:
    return {**run_greedy_loop(model, *prompt, use_cache=True, eos_token_id=eos).to_record(), "prompt_id": "P1",
            "status": "ok", "warmup": False, "schedule_id": "P1-cache_on-rep1"}


def test_the_loop_cache_on_or_off_and_bare_selects_as_greedy_generate_does_through_its_eos_stop(model, prompt, runs):
    assert runs[True].generated_ids == runs[False].generated_ids
    assert all(bare_greedy_loop(model, *prompt, use_cache=c) == runs[c].generated_ids for c in (True, False))
    trial = loop_trial(model, prompt, EOS)
    check = decode_loop.loop_vs_generate([trial], [generate_trial(model, prompt, EOS)])
    assert check["equal"] and check["compared_length"] == len(check["generate_ids"]) > 0, check
    eos = runs[True].generated_ids[0]  # declared EOS: generate() stops at its first selection; the loop goes on
    eos_trial = loop_trial(model, prompt, eos)
    assert eos_trial["output_length"] == N and eos_trial["eos_positions"][0] == 0
    assert eos_trial["eos_positions"] == [i for i, token in enumerate(eos_trial["generated_ids"]) if token == eos]
    assert eos_trial["eos_selected"] and eos_trial["continued_past_eos"]
    stopped = decode_loop.loop_vs_generate([eos_trial], [generate_trial(model, prompt, eos)])
    assert stopped["generate_ids"] == [eos] and stopped["compared_length"] == 1 and stopped["equal"]
    wrong = generate_trial(model, prompt, EOS)
    wrong["generated_ids"] = [(wrong["generated_ids"][0] + 1) % model.config.vocab_size] + wrong["generated_ids"][1:]
    differs = decode_loop.loop_vs_generate([trial], [wrong])
    assert not differs["equal"] and differs["first_difference"] == 0


def test_the_inputs_check_holds_what_both_really_feed_runs_no_forward_on_a_long_prompt_and_catches_a_shift(
        model, prompt, monkeypatch):
    output = []
    seen = fed(model, lambda: output.append(model.generate(input_ids=prompt[0], attention_mask=prompt[1],
                                                           generation_config=greedy_generation_config(N, None, 0),
                                                           use_model_defaults=False)))
    generated = output[0][0, len(PROMPT):].tolist()
    assert len(generated) == N and seen == decode_loop.generate_step_inputs(model, PROMPT, generated)
    loop = []
    assert fed(model, lambda: loop.append(run_greedy_loop(model, *prompt, use_cache=True))) == \
        decode_loop.loop_step_inputs(PROMPT, loop[0].generated_ids)
    long_prompt = (PROMPT + [1]) * 8
    ids = torch.tensor([long_prompt])
    generated = run_greedy_loop(model, ids, torch.ones_like(ids), use_cache=True).generated_ids
    found = []
    assert fed(model, lambda: found.append(decode_loop.loop_inputs_match_generate(model, "P1x8", long_prompt, generated,
                                                                                  "P1x8-cache_on-rep1"))) == []
    assert found[0]["equal"] and found[0]["steps"] == N and found[0]["first_difference"] is None
    real_prepare = decode_loop._prepare

    def shifted(*args):
        buffers = real_prepare(*args)
        buffers.positions += 1  # positions from 1, not from 0 as generate() builds them
        return buffers

    monkeypatch.setattr(decode_loop, "_prepare", shifted)
    caught = decode_loop.loop_inputs_match_generate(model, "P1x8", PROMPT, [3] * N)
    assert not caught["equal"] and caught["first_difference"] == {
        "step": 0, "field": "position_ids", "loop": [list(range(1, 8))], "generate": [list(range(7))]}


@pytest.mark.slow
@pytest.mark.process
def test_a_real_run_checks_every_timing_prompts_loop_against_generate(standin_run):
    """P1 by ids; P1x8 (no generate() call in the budget) by its inputs, with no forward; the report says both."""
    from shared_runs import records

    check = next(r for r in records(standin_run) if r["kind"] == "loop_vs_generate")
    assert check["equal"] and check["prompt_id"] == "P1" and list(check["inputs_vs_generate"]) == ["P1x8"]
    p1x8 = check["inputs_vs_generate"]["P1x8"]
    assert p1x8["equal"] and p1x8["steps"] == N and p1x8["trial"] == "P1x8-cache_on-rep1"
    assert check["forward_mode"]["forwards"] == 0
    report = (standin_run / "report.md").read_text(encoding="utf-8")
    assert "- The loop's inputs for P1x8 (P1x8-cache_on-rep1) against those `generate()`'s own preparation" in report
