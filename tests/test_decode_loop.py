"""The instrumented greedy loop: same selections with and without cache, ordered timestamps, generate() parity."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from inferlab import protocol
from inferlab.measure import contention
from inferlab.measure import decode_loop
from inferlab.measure.cache_check import compare_vectors
from inferlab.measure.decode_loop import (
    bare_greedy_loop,
    loop_matches_generate,
    run_greedy_loop,
)
from inferlab.specimen.build import tiny_gpt_neox

N = protocol.TIMING_NEW_TOKENS
PROMPT = [5, 17, 33, 2, 9, 40, 11]
EOS = 0


@pytest.fixture(scope="module")
def model():
    return tiny_gpt_neox(seed=0)


@pytest.fixture(scope="module")
def prompt():
    ids = torch.tensor([PROMPT], dtype=torch.long)  # (1, T)
    return ids, torch.ones_like(ids)


@pytest.fixture(scope="module")
def runs(model, prompt):
    ids, mask = prompt
    return {
        use_cache: run_greedy_loop(model, ids, mask, use_cache=use_cache, eos_token_id=EOS) for use_cache in (True, False)
    }


def test_cache_on_and_off_select_the_same_ids(runs):
    assert runs[True].generated_ids == runs[False].generated_ids


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_exactly_n_selections_with_increasing_times(runs, use_cache):
    result = runs[use_cache]
    assert len(result.generated_ids) == N and len(result.token_times_ns) == N
    boundaries = [result.t_start_ns, result.t_prefill_done_ns, *result.token_times_ns]
    assert all(b > a for a, b in zip(boundaries, boundaries[1:])), boundaries


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_derived_times_follow_their_definitions(runs, use_cache):
    result = runs[use_cache]
    assert result.ttft_s == (result.token_times_ns[0] - result.t_start_ns) / 1e9
    assert result.loop_s == result.token_times_s[-1]
    assert 0 < result.prefill_s < result.ttft_s < result.loop_s
    assert result.mean_post_first_interval_s == pytest.approx(
        (result.token_times_ns[-1] - result.token_times_ns[0]) / (N - 1) / 1e9
    )


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_both_paths_request_only_the_last_position(runs, model, use_cache):
    assert runs[use_cache].last_logits_shape == [1, 1, model.config.vocab_size]


@torch.inference_mode()
def test_installed_forward_honours_logits_to_keep(model, prompt):
    """The interface fact the loop relies on: logits_to_keep=1 returns only the last position, and its values
    are the full computation's last position (the run checks the shape on every forward it makes)."""
    ids, mask = prompt
    kept = model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=protocol.LOGITS_TO_KEEP).logits
    full = model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=0).logits  # (1, T, vocab)
    assert list(kept.shape) == [1, protocol.LOGITS_TO_KEEP, model.config.vocab_size]
    assert compare_vectors(kept[0, -1], full[0, -1], protocol.CACHE_TOLERANCE)["passed"]


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_clock_reads_per_trial_counts_every_read_of_the_loop(model, prompt, monkeypatch, use_cache):
    reads = []
    real_clock = decode_loop.time.perf_counter_ns

    def counting_clock():
        reads.append(1)
        return real_clock()

    monkeypatch.setattr(decode_loop.time, "perf_counter_ns", counting_clock)
    run_greedy_loop(model, *prompt, use_cache=use_cache)
    assert len(reads) == decode_loop.clock_reads_per_trial(N)


def test_clock_overhead_is_the_clock_alone_scaled_to_one_trial(model):
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        overhead = decode_loop.clock_overhead(reads=5_000)
    finally:
        hook.remove()
    assert calls == [], "measuring the clock must not run the model"
    assert overhead["clock"] == "time.perf_counter_ns" and overhead["reads"] == 5_000 and overhead["elapsed_ns"] > 0
    assert overhead["per_read_ns"] == overhead["elapsed_ns"] / 5_000
    assert overhead["reads_per_trial"] == decode_loop.clock_reads_per_trial(protocol.TIMING_NEW_TOKENS) == 18
    assert overhead["per_trial_overhead_ns"] == pytest.approx(overhead["per_read_ns"] * 18)


def test_clock_overhead_counts_the_reads_it_claims(monkeypatch):
    reads = []
    real_clock = decode_loop.time.perf_counter_ns
    monkeypatch.setattr(decode_loop.time, "perf_counter_ns", lambda: reads.append(1) or real_clock())
    decode_loop.clock_overhead(reads=1_000)
    assert len(reads) == 1_000 + 2  # the reads themselves, bracketed by a start and an end read


def test_profiling_text_is_decoded_with_special_tokens_kept():
    from inferlab.specimen.build import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    ids = tokenizer("A small boat", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    text, elapsed_s = decode_loop.decode_profiling_text(tokenizer, ids)
    assert text == "A small boat" + tokenizer.eos_token and elapsed_s >= 0


def test_cache_on_keeps_a_cache_of_the_fed_length(runs):
    cache = runs[True].cache
    assert isinstance(cache, DynamicCache)
    # The last selected token is never fed, so the cache holds prompt + N - 1 tokens.
    assert cache.get_seq_length() == len(PROMPT) + N - 1
    assert runs[False].cache is None


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_one_prefill_and_n_minus_1_forwards_of_the_right_width(model, prompt, use_cache):
    widths = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        run_greedy_loop(model, *prompt, use_cache=use_cache)
    finally:
        hook.remove()
    T = len(PROMPT)
    expected = [T] + ([1] * (N - 1) if use_cache else list(range(T + 1, T + N)))
    assert widths == expected


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_bare_loop_makes_the_same_selections(runs, model, prompt, use_cache):
    assert bare_greedy_loop(model, *prompt, use_cache=use_cache) == runs[use_cache].generated_ids


def test_loop_matches_generate(model, prompt):
    comparison = loop_matches_generate(model, *prompt, eos_token_id=EOS, pad_token_id=EOS)
    assert comparison["equal"], comparison
    assert comparison["compared_length"] == len(comparison["loop_ids_through_first_eos"])


def test_selected_eos_does_not_stop_the_loop(model, prompt, runs):
    # Declare the model's own first greedy choice to be EOS: the loop must record it and carry on.
    eos = runs[True].generated_ids[0]
    result = run_greedy_loop(model, *prompt, use_cache=True, eos_token_id=eos)
    assert len(result.generated_ids) == N
    assert result.eos_positions == [i for i, token in enumerate(result.generated_ids) if token == eos]
    assert result.eos_positions[0] == 0
    assert result.to_record()["eos_selected"] is True


def test_generate_comparison_stops_at_eos(model, prompt, runs):
    eos = runs[True].generated_ids[0]
    comparison = loop_matches_generate(model, *prompt, eos_token_id=eos, pad_token_id=eos)
    assert comparison["generate_ids"] == [eos]
    assert comparison["compared_length"] == 1 and comparison["equal"]


def test_generate_comparison_detects_a_difference(model, prompt, runs, monkeypatch):
    # If generate() selected differently (here: forced to a wrong first token), the comparison must say so.
    wrong = (runs[True].generated_ids[0] + 1) % model.config.vocab_size
    real_generate = model.generate

    def fake_generate(input_ids, **kwargs):
        output = real_generate(input_ids=input_ids, **kwargs)
        output[0, input_ids.shape[1]] = wrong
        return output

    monkeypatch.setattr(model, "generate", fake_generate)
    comparison = loop_matches_generate(model, *prompt, eos_token_id=EOS, pad_token_id=EOS)
    assert not comparison["equal"] and comparison["first_difference"] == 0


def test_record_is_json_ready(runs):
    import json

    record = runs[True].to_record()
    assert json.loads(json.dumps(record)) == record
    assert record["stopping_rule"] == protocol.TIMING_STOPPING_RULE


@pytest.mark.parametrize(
    "ids, mask",
    [
        (torch.tensor([PROMPT, PROMPT]), torch.ones((2, len(PROMPT)), dtype=torch.long)),
        (torch.tensor([PROMPT]), torch.ones((1, 3), dtype=torch.long)),
    ],
    ids=["batch_of_two", "mask_shape_mismatch"],
)
def test_rejects_inputs_it_does_not_support(model, ids, mask):
    with pytest.raises(ValueError, match="decode loop"):
        run_greedy_loop(model, ids, mask, use_cache=True)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_thread_usage_is_read_at_the_span_ends_only_never_between_tokens(model, prompt, monkeypatch, use_cache):
    """The usage reads around the clock reads: one before t_start, one right after t_prefill_done, one after t_n."""
    events = []
    real_clock = decode_loop.time.perf_counter_ns
    real_start, real_end = contention.usage_reader()

    def clock():
        events.append("clock")
        return real_clock()

    def reader():
        def start():
            events.append("usage")
            return real_start()

        def end():
            events.append("usage")
            return real_end()

        return start, end

    monkeypatch.setattr(decode_loop.time, "perf_counter_ns", clock)
    monkeypatch.setattr(decode_loop.contention, "usage_reader", reader)
    result = run_greedy_loop(model, *prompt, use_cache=use_cache)
    assert events == ["usage", "clock", "clock", "usage"] + ["clock"] * N + ["usage"]
    assert events.count("usage") == decode_loop.USAGE_READS_PER_TRIAL
    record = result.to_record()
    assert set(record["cpu_readings"]) == set(contention.READING_POINTS)
    assert record["cpu_evidence"] == contention.recorded_evidence(record)["cpu_evidence"]
    assert record["contended"] == contention.recorded_evidence(record)["contended"]
    loop = record["cpu_evidence"]["loop"]
    assert loop["wall_ns"] == result.token_times_ns[-1] - result.t_start_ns  # exactly the span of loop_s
    if loop["cpu_ns"] is not None:
        assert 0 < loop["cpu_ns"] <= loop["wall_ns"] + 200_000


def test_clock_overhead_measures_the_usage_reads_too():
    overhead = decode_loop.clock_overhead(reads=2_000)
    assert overhead["usage_reads"] == 2 * (2_000 // 20) and overhead["usage_per_read_ns"] > 0
    assert overhead["usage_reads_per_trial"] == 3 and overhead["usage_reads_inside_loop"] == 1
    assert overhead["usage_inside_loop_ns"] == overhead["usage_per_read_ns"]
    assert overhead["usage_sources"] == contention.usage_sources()
