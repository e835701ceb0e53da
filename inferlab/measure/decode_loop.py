"""Part 5: the instrumented greedy decode loop, nothing else inside its timed region, and its check against generate().

Fixed-length profiling: exactly `new_tokens` greedy selections; a selected EOS is kept and the loop goes on
(protocol.TIMING_STOPPING_RULE). Cache on feeds one new token per step into the cache the previous forward returned;
cache off feeds the whole sequence each step with use_cache=False. Both paths use the same buffers, forward
arguments, logits_to_keep and selection code.

Boundaries (time.perf_counter_ns, monotonic): t_start just before the prefill forward; t_prefill_done when it has
returned the next-token logits (CPU: no device sync needed); t_1..t_n right after each argmax selection. Buffers are
prepared before t_start; lists are made after t_n. The thread's usage (inferlab.measure.usage) is read at the ends
of the spans only, never between tokens: before t_start, after t_prefill_done (the one read inside loop_s, before
the first selection) and after t_n.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

import torch
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from inferlab import protocol
from inferlab.measure import usage
from inferlab.measure.stats import completed, first_divergence, post_first_interval_s


@dataclass
class LoopResult:
    """One run of the instrumented loop; times are absolute perf_counter_ns values."""

    use_cache: bool
    prompt_length: int
    new_tokens: int
    generated_ids: list[int]
    t_start_ns: int
    t_prefill_done_ns: int
    token_times_ns: list[int]
    eos_positions: list[int]
    last_logits_shape: list[int]
    prefill_logits_shape: list[int]  # the prefill's: the one forward whose length logits_to_keep shortens
    cpu_readings: dict  # {start, prefill_done, end}: usage.READING_FIELDS each
    collector_enabled_in_spans: bool  # gc.isenabled() as the timed block began
    gc_events: list  # [generation, start_ns, stop_ns] of each collection in the block
    cache: Any = field(default=None, repr=False)  # the final cache (cache on), for inspection after timing

    def to_record(self) -> dict:
        """The timing_trial fields particular to this trial: ids, shapes, the stamps and the times derived from them
        (prefill_s: t_start to the next-token logits; ttft_s: to t_1; loop_s: to t_n; the mean post-first interval
        from the integer stamps), the raw usage readings and what the declared rule derives from them
        (usage.trial_evidence). What every trial shares is declared once, in declaration(). The cache is left out."""
        start, times, eos = self.t_start_ns, self.token_times_ns, self.eos_positions
        return {
            "use_cache": self.use_cache, "prompt_length": self.prompt_length, "output_length": len(self.generated_ids),
            "generated_ids": list(self.generated_ids), "t_start_ns": start, "t_prefill_done_ns": self.t_prefill_done_ns,
            "token_times_ns": list(times), "token_times_s": [(t - start) / 1e9 for t in times],
            "prefill_s": (self.t_prefill_done_ns - start) / 1e9, "ttft_s": (times[0] - start) / 1e9,
            "loop_s": (times[-1] - start) / 1e9, "mean_post_first_interval_s": post_first_interval_s(times),
            "eos_positions": list(eos), "eos_selected": bool(eos),
            "continued_past_eos": bool(eos) and eos[0] < self.new_tokens - 1,
            "last_logits_shape": list(self.last_logits_shape), "prefill_logits_shape": list(self.prefill_logits_shape),
            "cpu_readings": {point: list(values) for point, values in self.cpu_readings.items()},
            "collector_enabled_in_spans": self.collector_enabled_in_spans,
            "gc_events": [list(event) for event in self.gc_events],
            **usage.trial_evidence(self.cpu_readings, start, self.t_prefill_done_ns, times[-1],
                                   gc_events=self.gc_events),
        }


def declaration(collector_policy: str) -> dict:
    """What every timing trial's record shares, declared once before the first trial (the timing_machine record):
    the clock, the workload and its stopping rule, the order and scope of cpu_readings and where each comes from,
    the collector policy and its gc_events fields, and the outputs the loop never asks for."""
    return {"clock": "time.perf_counter_ns (monotonic)", "new_tokens": protocol.TIMING_NEW_TOKENS,
            "logits_to_keep": protocol.LOGITS_TO_KEEP, "stopping_rule": protocol.TIMING_STOPPING_RULE,
            "cpu_reading_fields": list(usage.READING_FIELDS), "cpu_reading_scope": dict(usage.READING_SCOPE),
            "cpu_usage_sources": usage.usage_sources(), "collector": usage.declaration(collector_policy),
            "outputs_not_asked_for": ["attentions", "hidden_states", "scores"]}


@dataclass
class _Buffers:
    """Everything the loop slices, allocated once before t_start."""

    tokens: torch.Tensor  # (1, T + n) prompt ids, then the selected ids written in place
    mask: torch.Tensor  # (1, T + n) the 2-D attention mask, sliced as it grows
    positions: torch.Tensor  # (1, T + n) position_ids = mask.cumsum - 1 (generate's rule)
    cache_positions: torch.Tensor  # (T + n,) the slot of every token
    prompt_length: int


def _prepare(input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int) -> _Buffers:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"decode loop: input_ids must have shape (1, T), got {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"decode loop: attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    if new_tokens < 1:
        raise ValueError(f"decode loop: new_tokens must be >= 1, got {new_tokens}")
    prompt_length = input_ids.shape[1]
    total = prompt_length + new_tokens
    tokens = torch.zeros((1, total), dtype=torch.long, device=input_ids.device)
    tokens[:, :prompt_length] = input_ids
    mask = torch.ones((1, total), dtype=torch.long, device=input_ids.device)
    mask[:, :prompt_length] = attention_mask
    positions = mask.cumsum(-1) - 1
    positions.masked_fill_(mask == 0, 1)  # as generate() does for padded slots
    cache_positions = torch.arange(total, dtype=torch.long, device=input_ids.device)
    return _Buffers(tokens, mask, positions, cache_positions, prompt_length)


def _forward(model, buffers: _Buffers, start: int, end: int, cache, use_cache: bool, logits_to_keep: int):
    """One forward over tokens[start:end] with the mask up to `end`; shared by the timed and bare loops."""
    return model(
        input_ids=buffers.tokens[:, start:end],  # (1, end - start)
        attention_mask=buffers.mask[:, :end],  # (1, end)
        position_ids=buffers.positions[:, start:end],  # (1, end - start)
        cache_position=buffers.cache_positions[start:end],  # (end - start,)
        past_key_values=cache, use_cache=use_cache, logits_to_keep=logits_to_keep,
        output_attentions=False, output_hidden_states=False,
    )


@torch.inference_mode()
def run_greedy_loop(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                    use_cache: bool, new_tokens: int = protocol.TIMING_NEW_TOKENS,
                    logits_to_keep: int = protocol.LOGITS_TO_KEEP, eos_token_id: Union[int, Iterable[int], None] = None,
                    collector_policy: str = usage.DEFAULT_POLICY) -> LoopResult:
    """Exactly `new_tokens` greedy selections with timestamps; an EOS is recorded in eos_positions, never a stop.

    The timed block (the usage readings and every stamp) runs under collector_policy (usage.TimedBlock): by default
    with the collector off, switched back on after t_n; nothing is collected before it.
    """
    buffers = _prepare(input_ids, attention_mask, new_tokens)
    tokens, prompt_length = buffers.tokens, buffers.prompt_length
    times = [0] * new_tokens
    clock = time.perf_counter_ns
    usage_at_start, usage_at_end = usage.usage_reader()
    cache = DynamicCache(config=model.config) if use_cache else None  # a fresh cache for every trial

    with usage.TimedBlock(collector_policy) as block, usage.CollectionWatch() as watch:
        # inline, no call between a stamp and its CPU reading: a returned tuple there could start a collection
        usage_start = usage_at_start()
        t_start = clock()
        # 1) prefill: the whole prompt, one forward
        out = _forward(model, buffers, 0, prompt_length, cache, use_cache, logits_to_keep)
        t_prefill_done = clock()
        usage_prefill = usage_at_end()
        # 2) the first selection (not a forward)
        prefill = out.logits  # (1, keep, vocab), a reference (no copy): its shape is read after t_n
        tokens[0, prompt_length] = out.logits[0, -1].argmax()
        times[0] = clock()
        # 3) the remaining selections, one forward each
        for i in range(1, new_tokens):
            end = prompt_length + i
            if use_cache:
                out = _forward(model, buffers, end - 1, end, out.past_key_values, True, logits_to_keep)
            else:
                out = _forward(model, buffers, 0, end, None, False, logits_to_keep)
            tokens[0, end] = out.logits[0, -1].argmax()
            times[i] = clock()
        usage_end = usage_at_end()

    generated = tokens[0, prompt_length:].tolist()
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return LoopResult(
        use_cache=use_cache, prompt_length=prompt_length, new_tokens=new_tokens, generated_ids=generated,
        t_start_ns=t_start, t_prefill_done_ns=t_prefill_done, token_times_ns=times,
        eos_positions=[i for i, token in enumerate(generated) if token in eos],
        last_logits_shape=list(out.logits.shape), prefill_logits_shape=list(prefill.shape),
        cpu_readings={"start": usage_start, "prefill_done": usage_prefill, "end": usage_end},
        collector_enabled_in_spans=block.enabled_inside, gc_events=watch.events,
        cache=out.past_key_values if use_cache else None,
    )


@torch.inference_mode()
def bare_greedy_loop(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                     use_cache: bool, new_tokens: int = protocol.TIMING_NEW_TOKENS,
                     logits_to_keep: int = protocol.LOGITS_TO_KEEP) -> list[int]:
    """The same forwards and selections as run_greedy_loop without stamps or readings (benchmarks/overhead.py)."""
    buffers = _prepare(input_ids, attention_mask, new_tokens)
    tokens, prompt_length = buffers.tokens, buffers.prompt_length
    cache = DynamicCache(config=model.config) if use_cache else None
    out = _forward(model, buffers, 0, prompt_length, cache, use_cache, logits_to_keep)
    tokens[0, prompt_length] = out.logits[0, -1].argmax()
    for i in range(1, new_tokens):
        end = prompt_length + i
        if use_cache:
            out = _forward(model, buffers, end - 1, end, out.past_key_values, True, logits_to_keep)
        else:
            out = _forward(model, buffers, 0, end, None, False, logits_to_keep)
        tokens[0, end] = out.logits[0, -1].argmax()
    return tokens[0, prompt_length:].tolist()


def logits_to_keep_check(observed_shape: list, logits_to_keep: int, vocab_size: int) -> dict:
    """A forward's observed logits shape against the (1, logits_to_keep, vocab) that logits_to_keep asks for."""
    expected = [1, logits_to_keep, vocab_size]
    return {"logits_to_keep": logits_to_keep, "expected_shape": expected, "observed_shape": list(observed_shape),
            "ok": list(observed_shape) == expected}


def loop_logits_to_keep(prefill_shape: list, last_shape: list, logits_to_keep: int, vocab_size: int) -> dict:
    """A timing trial's prefill and last forward against logits_to_keep, and whether both held. The prefill is the
    forward that tells: a cache-on step feeds one token, so its logits have one position either way."""
    checks = {"prefill": logits_to_keep_check(prefill_shape, logits_to_keep, vocab_size),
              "last": logits_to_keep_check(last_shape, logits_to_keep, vocab_size)}
    return {**checks, "ok": all(check["ok"] for check in checks.values())}


# --- what the loop's own reads cost -----------------------------------------------------------------------------------

USAGE_READS_PER_TRIAL = 3  # before t_start, after t_prefill_done, after t_n
USAGE_READS_INSIDE_LOOP = 1  # the one after t_prefill_done lies inside loop_s and TTFT (not inside prefill_s)
CLOCK_OVERHEAD_READS = 200_000
CLOCK_OVERHEAD_METHOD = (
    "{reads} consecutive calls of time.perf_counter_ns in a plain Python for loop, bracketed by two more reads; "
    "per_read_ns = elapsed_ns / reads. The loop's own iteration is included, so this bounds the cost of one read from "
    "above. No model forward and no timed region is involved. The thread-usage readings (inferlab.measure.usage."
    "usage_reader: CPU time, switches, the thread's and the process's page faults) are timed the same way: "
    "{usage_pairs} start-and-end pairs, usage_per_read_ns = usage_elapsed_ns / usage_reads; and the collection "
    "watch's two callbacks, {usage_pairs} start-and-stop pairs without a collection, watch_per_collection_ns = "
    "watch_elapsed_ns / watch_collections"
)


def clock_reads_per_trial(new_tokens: int = protocol.TIMING_NEW_TOKENS) -> int:
    """Clock reads run_greedy_loop makes in one trial: t_start, t_prefill_done, and one after each selection."""
    return 2 + new_tokens


def clock_overhead(reads: int = CLOCK_OVERHEAD_READS, new_tokens: int = protocol.TIMING_NEW_TOKENS) -> dict:
    """The cost of the loop's own clock reads, usage reads and collection watch, measured alone (no forward): the
    clock_overhead record's fields; per_trial_overhead_ns is per_read_ns times the reads of one trial."""
    clock = time.perf_counter_ns  # the loop's clock, bound the same way
    start = clock()
    for _ in range(reads):
        clock()
    elapsed = clock() - start
    usage_pairs = max(1, reads // 20)  # a usage read is a system call: fewer of them give the same precision
    cost = usage.usage_read_cost(usage_pairs)
    return {"clock": "time.perf_counter_ns", "reads": reads, "elapsed_ns": elapsed, "per_read_ns": elapsed / reads,
            "reads_per_trial": clock_reads_per_trial(new_tokens),
            "per_trial_overhead_ns": elapsed / reads * clock_reads_per_trial(new_tokens), **cost,
            "usage_reads_per_trial": USAGE_READS_PER_TRIAL, "usage_reads_inside_loop": USAGE_READS_INSIDE_LOOP,
            "usage_fields": list(usage.READING_FIELDS), **usage.watch_cost(usage_pairs),
            "method": CLOCK_OVERHEAD_METHOD.format(reads=reads, usage_pairs=usage_pairs)}


PROFILING_DECODING_LABEL = ("tokenizer.decode of the 16 profiling ids (special tokens kept), after the timed loop "
                            "returned")


def decode_profiling_text(tokenizer, generated_ids: list[int]) -> tuple[str, float]:
    """Decode a timing trial's ids outside the timed loop: (text, elapsed_s of the decode call alone)."""
    start = time.perf_counter()
    text = tokenizer.decode(generated_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return text, time.perf_counter() - start


# --- the loop against generate() ------------------------------------------------------------------------------------
# P1's loop is checked by ids against the matrix's first greedy trial of P1, a generate() call the budget already
# holds. P1x8 has no such call and the budget has no room for one (Parts 3 and 5 use all 800 selections), so for it
# what the loop feeds the model at each step is checked against what generate()'s own preparation builds for the same
# ids (transformers 4.57.1: _get_initial_cache_position, prepare_inputs_for_generation,
# _update_model_kwargs_for_generation), with no forward run.

COMPARED = ("input_ids", "attention_mask", "position_ids", "cache_position", "logits_to_keep", "use_cache")
HOW = ("each step's model inputs from decode_loop's own buffers and slices, against those generate()'s preparation "
       "(_get_initial_cache_position, prepare_inputs_for_generation, _update_model_kwargs_for_generation) builds for "
       "the same ids; no forward runs")


def loop_vs_generate(trials: list[dict], generations: list[dict], prompt_id: str = "P1") -> dict:
    """The loop's cache-on ids against the matrix's first greedy generate() trial of the same prompt, through
    generate's EOS stop (no extra generate() call is made)."""
    loop = next((t for t in completed(trials) if t["prompt_id"] == prompt_id and t["use_cache"] and not t["warmup"]),
                None)
    reference = next((g for g in completed(generations) if g["prompt_id"] == prompt_id and g["condition"] == "G"), None)
    if loop is None or reference is None:
        return {"prompt_id": prompt_id, "available": False, "equal": False, "loop_ids": None, "generate_ids": None,
                "first_difference": None, "reason": "missing a measured cache-on trial or an ok greedy trial"}
    generate_ids = reference["generated_ids"]
    loop_ids = loop["generated_ids"][: len(generate_ids)]  # generate stops at EOS; the loop does not
    return {"prompt_id": prompt_id, "available": True, "loop_trial": loop["schedule_id"],
            "generate_trial": reference["trial_id"], "generate_stop_reason": reference["stop_reason"],
            "compared_length": len(generate_ids), "loop_ids": loop_ids, "generate_ids": generate_ids,
            "first_difference": first_divergence(loop_ids, generate_ids), "equal": loop_ids == generate_ids,
            "not_compared": [p for p in {t["prompt_id"] for t in trials} if p != prompt_id],
            "note": ("only prompts of the generation matrix have a generate() reference; no extra generate() call is "
                     "made")}


def _plain(value):
    return value.tolist() if isinstance(value, torch.Tensor) else value


def loop_step_inputs(prompt_ids: list[int], generated_ids: list[int],
                     logits_to_keep: int = protocol.LOGITS_TO_KEEP) -> list[dict]:
    """What run_greedy_loop (cache on) feeds the model at each of its len(generated_ids) forwards."""
    prompt = torch.tensor([prompt_ids], dtype=torch.long)  # (1, T)
    buffers = _prepare(prompt, torch.ones_like(prompt), len(generated_ids))
    buffers.tokens[0, len(prompt_ids):] = torch.tensor(generated_ids, dtype=torch.long)  # as the loop writes them
    steps, length = [], len(prompt_ids)
    for step in range(len(generated_ids)):
        start, end = (0, length) if step == 0 else (length + step - 1, length + step)
        steps.append({"input_ids": buffers.tokens[:, start:end].tolist(),
                      "attention_mask": buffers.mask[:, :end].tolist(),
                      "position_ids": buffers.positions[:, start:end].tolist(),
                      "cache_position": buffers.cache_positions[start:end].tolist(),
                      "logits_to_keep": logits_to_keep, "use_cache": True})
    return steps


@torch.inference_mode()
def generate_step_inputs(model, prompt_ids: list[int], generated_ids: list[int]) -> list[dict]:
    """What generate() (greedy, cache on, a fresh DynamicCache) would feed the model at each step for these ids."""
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)  # (1, T), one id longer each step
    cache = DynamicCache(config=model.config)
    kwargs = {"attention_mask": torch.ones_like(input_ids), "use_cache": True, "past_key_values": cache}
    if model._supports_logits_to_keep():
        kwargs["logits_to_keep"] = 1  # what generate() sets when the model supports it
    kwargs = model._get_initial_cache_position(input_ids.shape[1], input_ids.device, kwargs)
    steps = []
    for token in generated_ids:
        prepared = model.prepare_inputs_for_generation(input_ids, **kwargs)
        steps.append({name: _plain(prepared.get(name)) for name in COMPARED})
        input_ids = torch.cat([input_ids, torch.tensor([[token]], dtype=torch.long)], dim=-1)
        kwargs = model._update_model_kwargs_for_generation(CausalLMOutputWithPast(past_key_values=cache), kwargs)
    return steps


def loop_inputs_match_generate(model, prompt_id: str, prompt_ids: list[int], generated_ids: list[int],
                               trial: Optional[str] = None) -> dict:
    """Both sides step by step: {prompt_id, steps, equal, first_difference (step, field, loop, generate), how}."""
    loop, generate = loop_step_inputs(prompt_ids, generated_ids), generate_step_inputs(model, prompt_ids, generated_ids)
    difference = None
    for step, (ours, theirs) in enumerate(zip(loop, generate)):
        name = next((name for name in COMPARED if ours[name] != theirs[name]), None)
        if name is not None:
            difference = {"step": step, "field": name, "loop": ours[name], "generate": theirs[name]}
            break
    if difference is None and len(loop) != len(generate):
        difference = {"step": min(len(loop), len(generate)), "field": "steps", "loop": len(loop),
                      "generate": len(generate)}
    return {"prompt_id": prompt_id, "trial": trial, "prompt_length": len(prompt_ids), "steps": len(loop),
            "compared": list(COMPARED), "equal": difference is None, "first_difference": difference, "how": HOW}
