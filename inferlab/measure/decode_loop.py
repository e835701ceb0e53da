"""Part 5: the instrumented greedy decode loop, and nothing else inside its timed region.

Fixed-length profiling: exactly `new_tokens` greedy selections; a selected EOS is kept and the loop
continues (protocol.TIMING_STOPPING_RULE). Cache on feeds one new token per step into the cache the
previous forward returned; cache off feeds the whole sequence each step with use_cache=False. Both
paths use the identical buffers, forward arguments, logits_to_keep and selection code.

Boundaries (time.perf_counter_ns, monotonic): t_start just before the prefill forward; t_prefill_done
when the prefill forward has returned its next-token logits (CPU: no device sync needed);
t_1..t_n right after each argmax selection. Input buffers are prepared before t_start (like
tokenization); converting results to lists happens after t_n.

The thread's own usage (CPU time, voluntary and involuntary context switches: inferlab.measure.contention) is read at
the ends of the spans only, never between tokens: just before t_start, just after t_prefill_done (the one read
inside loop_s, before the first selection) and just after t_n.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

import torch
from transformers import DynamicCache, GenerationConfig

from inferlab import protocol
from inferlab.measure import collector, contention
from inferlab.measure.sampling import build_generation_config
from inferlab.measure.summaries import first_divergence, post_first_interval_s

EosIds = Union[int, Iterable[int], None]


@dataclass
class LoopResult:
    """One run of the instrumented loop; times are absolute perf_counter_ns values."""

    use_cache: bool
    prompt_length: int
    new_tokens: int
    logits_to_keep: int
    generated_ids: list[int]
    t_start_ns: int
    t_prefill_done_ns: int
    token_times_ns: list[int]
    eos_token_ids: list[int]
    eos_positions: list[int]
    last_logits_shape: list[int]
    prefill_logits_shape: list[int]  # the prefill forward's: the one forward whose length logits_to_keep shortens
    cpu_readings: dict = field(default_factory=dict)  # {start, prefill_done, end}: contention.READING_FIELDS each
    collector_policy: str = collector.DEFAULT_POLICY
    collector_enabled_in_spans: Optional[bool] = None  # gc.isenabled() as the timed block began
    gc_events: list = field(default_factory=list)  # [generation, start_ns, stop_ns] of each collection in the block
    cache: Any = field(default=None, repr=False)  # final cache (cache on), for inspection after timing

    @property
    def token_times_s(self) -> list[float]:
        """t_1..t_n in seconds since t_start."""
        return [(t - self.t_start_ns) / 1e9 for t in self.token_times_ns]

    @property
    def prefill_s(self) -> float:
        """Prompt prefill forward: t_start to next-token logits available."""
        return (self.t_prefill_done_ns - self.t_start_ns) / 1e9

    @property
    def ttft_s(self) -> float:
        """Local time to first selected token: prefill plus the first selection (t_1 - t_start)."""
        return (self.token_times_ns[0] - self.t_start_ns) / 1e9

    @property
    def loop_s(self) -> float:
        """Full generation loop: t_n - t_start."""
        return (self.token_times_ns[-1] - self.t_start_ns) / 1e9

    @property
    def mean_post_first_interval_s(self) -> Optional[float]:
        """(t_n - t_1) / (n - 1): the mean interval after the first token; None when n == 1."""
        return post_first_interval_s(self.token_times_ns)

    def to_record(self) -> dict:
        """JSON-ready fields (the cache object is left out)."""
        return {
            "use_cache": self.use_cache,
            "prompt_length": self.prompt_length,
            "new_tokens": self.new_tokens,
            "output_length": len(self.generated_ids),
            "logits_to_keep": self.logits_to_keep,
            "generated_ids": list(self.generated_ids),
            "t_start_ns": self.t_start_ns,
            "t_prefill_done_ns": self.t_prefill_done_ns,
            "token_times_ns": list(self.token_times_ns),
            "token_times_s": self.token_times_s,
            "prefill_s": self.prefill_s,
            "ttft_s": self.ttft_s,
            "loop_s": self.loop_s,
            "mean_post_first_interval_s": self.mean_post_first_interval_s,
            "eos_token_ids": list(self.eos_token_ids),
            "eos_positions": list(self.eos_positions),
            "eos_selected": bool(self.eos_positions),
            "continued_past_eos": bool(self.eos_positions) and self.eos_positions[0] < self.new_tokens - 1,
            "eos_note": (
                f"EOS selected at position {self.eos_positions[0]}; the fixed-length profiling loop went on to "
                f"{self.new_tokens} selections, so the ids after it are not a response"
                if self.eos_positions else "no EOS selected"
            ),
            "last_logits_shape": list(self.last_logits_shape),
            "prefill_logits_shape": list(self.prefill_logits_shape),
            "clock": "time.perf_counter_ns (monotonic)",
            "stopping_rule": protocol.TIMING_STOPPING_RULE,
            **self.contention_fields(),
        }

    def contention_fields(self) -> dict:
        """The raw usage readings and what the declared rule derives from them (contention.trial_evidence)."""
        return {
            "cpu_readings": {point: list(values) for point, values in self.cpu_readings.items()},
            "cpu_reading_fields": list(contention.READING_FIELDS),
            "cpu_reading_scope": dict(contention.READING_SCOPE),
            "cpu_usage_sources": contention.usage_sources(),
            "collector": {"policy": self.collector_policy, "enabled_in_spans": self.collector_enabled_in_spans},
            "gc_events": [list(event) for event in self.gc_events],
            "gc_event_fields": list(collector.EVENT_FIELDS),
            **contention.trial_evidence(self.cpu_readings, self.t_start_ns, self.t_prefill_done_ns,
                                        self.token_times_ns[-1], gc_events=self.gc_events),
        }


@dataclass
class _Buffers:
    """Everything the loop slices, allocated once before t_start."""

    tokens: torch.Tensor  # (1, T + n) prompt ids, then selected ids written in place
    mask: torch.Tensor  # (1, T + n) the 2-D attention mask, sliced as it grows
    positions: torch.Tensor  # (1, T + n) position_ids = mask.cumsum - 1 (generate's rule)
    cache_positions: torch.Tensor  # (T + n,) slot index of every token
    prompt_length: int


def _eos_list(eos_token_id: EosIds) -> list[int]:
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    return [int(t) for t in eos_token_id]


def _prepare(input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int) -> _Buffers:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"decode loop: input_ids must have shape (1, T), got {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"decode loop: attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}"
        )
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
        past_key_values=cache,
        use_cache=use_cache,
        logits_to_keep=logits_to_keep,
        output_attentions=False,
        output_hidden_states=False,
    )


@torch.inference_mode()
def run_greedy_loop(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    use_cache: bool,
    new_tokens: int = protocol.TIMING_NEW_TOKENS,
    logits_to_keep: int = protocol.LOGITS_TO_KEEP,
    eos_token_id: EosIds = None,
    collector_policy: str = collector.DEFAULT_POLICY,
) -> LoopResult:
    """Exactly `new_tokens` greedy selections with timestamps; EOS is recorded in eos_positions, never a stop.

    The timed block (the usage readings and every stamp) runs under collector_policy (inferlab.measure.collector):
    by default with the collector off, switched back on after t_n; nothing is collected before it.
    """
    buffers = _prepare(input_ids, attention_mask, new_tokens)
    tokens, prompt_length = buffers.tokens, buffers.prompt_length
    times = [0] * new_tokens
    clock = time.perf_counter_ns
    usage_at_start, usage_at_end = contention.usage_reader()
    cache = DynamicCache(config=model.config) if use_cache else None  # fresh cache for every trial

    with collector.TimedBlock(collector_policy) as block, collector.CollectionWatch() as watch:
        # inline, no call between a stamp and its CPU reading: a returned tuple there could start a collection
        usage_start = usage_at_start()
        t_start = clock()
        # 1) prefill: the whole prompt, one forward (its logits' shape is read after t_n)
        out = _forward(model, buffers, 0, prompt_length, cache, use_cache, logits_to_keep)
        t_prefill_done = clock()
        usage_prefill = usage_at_end()
        # 2) first selection (not a forward)
        prefill = out.logits  # (1, keep, vocab), a reference: no copy
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
    eos = _eos_list(eos_token_id)
    return LoopResult(
        use_cache=use_cache,
        prompt_length=prompt_length,
        new_tokens=new_tokens,
        logits_to_keep=logits_to_keep,
        generated_ids=generated,
        t_start_ns=t_start,
        t_prefill_done_ns=t_prefill_done,
        token_times_ns=times,
        eos_token_ids=eos,
        eos_positions=[i for i, token in enumerate(generated) if token in eos],
        last_logits_shape=list(out.logits.shape),
        prefill_logits_shape=list(prefill.shape),
        cpu_readings={"start": usage_start, "prefill_done": usage_prefill, "end": usage_end},
        collector_policy=collector_policy,
        collector_enabled_in_spans=block.enabled_inside,
        gc_events=watch.events,
        cache=out.past_key_values if use_cache else None,
    )


@torch.inference_mode()
def bare_greedy_loop(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    use_cache: bool,
    new_tokens: int = protocol.TIMING_NEW_TOKENS,
    logits_to_keep: int = protocol.LOGITS_TO_KEEP,
) -> list[int]:
    """The same forwards and selections as run_greedy_loop without any timestamps; for measuring their cost."""
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


def clock_reads_per_trial(new_tokens: int = protocol.TIMING_NEW_TOKENS) -> int:
    """Clock reads run_greedy_loop makes in one trial: t_start, t_prefill_done, and one after each selection."""
    return 2 + new_tokens


USAGE_READS_PER_TRIAL = 3  # before t_start, after t_prefill_done, after t_n
USAGE_READS_INSIDE_LOOP = 1  # the one after t_prefill_done lies inside loop_s and TTFT (not inside prefill_s)


CLOCK_OVERHEAD_READS = 200_000
CLOCK_OVERHEAD_METHOD = (
    "{reads} consecutive calls of time.perf_counter_ns in a plain Python for loop, bracketed by two more "
    "reads; per_read_ns = elapsed_ns / reads. The loop's own iteration is included, so this bounds the cost "
    "of one read from above. No model forward and no timed region is involved. The thread-usage readings "
    "(inferlab.measure.contention.usage_reader: CPU time, switches, the thread's and the process's page faults) are "
    "timed the same way: {usage_pairs} start-and-end pairs, usage_per_read_ns = usage_elapsed_ns / usage_reads; and "
    "the collection watch's two callbacks, {usage_pairs} start-and-stop pairs without a collection, "
    "watch_per_collection_ns = watch_elapsed_ns / watch_collections"
)


def clock_overhead(reads: int = CLOCK_OVERHEAD_READS, new_tokens: int = protocol.TIMING_NEW_TOKENS) -> dict:
    """The cost of the loop's own timestamps, from the clock alone: the clock_overhead record's fields.

    per_trial_overhead_ns is per_read_ns times the reads one timing trial makes (clock_reads_per_trial).
    """
    if reads < 1:
        raise ValueError(f"clock_overhead: reads must be >= 1, got {reads}")
    clock = time.perf_counter_ns  # the loop's clock, bound the same way
    start = clock()
    for _ in range(reads):
        clock()
    elapsed = clock() - start
    per_read = elapsed / reads
    reads_per_trial = clock_reads_per_trial(new_tokens)
    usage_pairs = max(1, reads // 20)  # a usage read is a system call: fewer of them give the same precision
    usage = contention.usage_read_cost(usage_pairs)
    return {
        "clock": "time.perf_counter_ns",
        "reads": reads,
        "elapsed_ns": elapsed,
        "per_read_ns": per_read,
        "reads_per_trial": reads_per_trial,
        "per_trial_overhead_ns": per_read * reads_per_trial,
        **usage,
        "usage_sources": contention.usage_sources(),
        "usage_reads_per_trial": USAGE_READS_PER_TRIAL,
        "usage_reads_inside_loop": USAGE_READS_INSIDE_LOOP,
        "usage_inside_loop_ns": usage["usage_per_read_ns"] * USAGE_READS_INSIDE_LOOP,
        "usage_fields": list(contention.READING_FIELDS),
        **collector.watch_cost(usage_pairs),
        "method": CLOCK_OVERHEAD_METHOD.format(reads=reads, usage_pairs=usage_pairs),
    }


PROFILING_DECODING_LABEL = (
    "tokenizer.decode of the 16 profiling ids (special tokens kept), after the timed loop returned"
)


def decode_profiling_text(tokenizer, generated_ids: list[int]) -> tuple[str, float]:
    """Decode a timing trial's ids outside the timed loop: (text, elapsed_s of the decode call alone)."""
    start = time.perf_counter()
    text = tokenizer.decode(generated_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return text, time.perf_counter() - start


def greedy_generation_config(new_tokens: int, eos_token_id: EosIds, pad_token_id: Optional[int], **extra) -> GenerationConfig:
    """The matrix's complete greedy GenerationConfig (sampling.build_generation_config) for new_tokens ids.

    Plain sequences are returned (no per-step logits or scores); transformers 4.57.1 still copies each step's last
    logits in _sample either way (generation/utils.py, the `.to(copy=True, ...)` line).
    """
    config = build_generation_config(protocol.CONDITIONS["G"], eos_token_id, pad_token_id)
    config.update(max_new_tokens=new_tokens, output_logits=False, output_scores=False,
                  return_dict_in_generate=False, **extra)
    config.validate()
    return config


@torch.inference_mode()
def loop_matches_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    eos_token_id: int,
    pad_token_id: Optional[int],
    new_tokens: int = protocol.TIMING_NEW_TOKENS,
) -> dict:
    """Check the loop's cache-on selections against greedy generate(), up to and including generate's EOS stop."""
    loop = run_greedy_loop(model, input_ids, attention_mask, use_cache=True, new_tokens=new_tokens, eos_token_id=eos_token_id)
    config = greedy_generation_config(new_tokens, eos_token_id, pad_token_id)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, generation_config=config, use_model_defaults=False
    )  # (1, T + generated)
    generate_ids = output[0, input_ids.shape[1] :].tolist()
    # generate() stops at the first EOS; the loop does not, so compare through that EOS only.
    loop_ids = loop.generated_ids
    stop = loop.eos_positions[0] + 1 if loop.eos_positions else len(loop_ids)
    expected_ids = loop_ids[:stop]
    difference = first_divergence(expected_ids, generate_ids)
    return {
        "loop_ids": loop_ids,
        "loop_ids_through_first_eos": expected_ids,
        "generate_ids": generate_ids,
        "compared_length": min(len(expected_ids), len(generate_ids)),
        "equal": difference is None,
        "first_difference": difference,
        "eos_token_id": eos_token_id,
        "generation_config": config.to_dict(),
    }
