"""Part 6: memory accounting that says what it measured and what it did not.

Tensor payloads (parameters, the KV cache) are counted by unique storage, so tied weights and views count once, and
set beside what the config alone predicts. Process figures carry their tool, units, platform and meaning (a current
value or a lifetime high-water mark). Neither is a "total memory": UNMEASURED_CATEGORIES names what is left out.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import torch

PROC_STATUS = Path("/proc/self/status")

# What neither the tensor accounting nor a single RSS reading isolates.
UNMEASURED_CATEGORIES = {
    "activations": "temporary hidden states and attention scores inside a forward; freed before we can inspect them",
    "logits": "the per-step (1, 1, vocab) logit tensors and any copies; transient, not held by the cache",
    "workspace": "scratch buffers BLAS/attention kernels allocate during a call; invisible to tensor accounting",
    "allocator_retention": "memory the allocator keeps after tensors are freed; shows up in RSS, not in any tensor",
    "runtime_libraries": "code and data of Python, torch, BLAS and tokenizers mapped into the process",
    "loading_copies": ("transient copies made while reading and converting the checkpoint; only a peak RSS may "
                       "show them"),
}
CURRENT = "current"
# Linux can reset VmHWM (writing 5 to /proc/self/clear_refs); this run never does, and freeing objects never lowers it
LIFETIME_PEAK = "lifetime peak (freeing objects does not lower it)"


# --- what the config alone predicts ----------------------------------------------------------------------------------


def expected_kv_cache_bytes(config: Any, tokens: int, dtype_bytes: int = 4, batch_size: int = 1) -> int:
    """2 (keys and values) x layers x heads x head_dim x tokens x batch x bytes per element."""
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * tokens * batch_size * dtype_bytes


def gpt_neox_parameter_count(config: Any) -> int:
    """Parameters of a GPTNeoXForCausalLM from its config: per layer two LayerNorms, the fused QKV and output
    projections and the two MLP projections, all with biases; the input embedding, the final LayerNorm, and the
    output embedding unless it is tied to the input one."""
    hidden, intermediate, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    per_layer = (2 * 2 * hidden  # input and post-attention LayerNorms
                 + hidden * 3 * hidden + 3 * hidden  # query_key_value
                 + hidden * hidden + hidden  # attention output dense
                 + hidden * intermediate + intermediate  # dense_h_to_4h
                 + intermediate * hidden + hidden)  # dense_4h_to_h
    embeddings = vocab * hidden * (1 if config.tie_word_embeddings else 2)
    return embeddings + config.num_hidden_layers * per_layer + 2 * hidden  # + the final LayerNorm


# --- tensor payloads, each storage once ------------------------------------------------------------------------------


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors`, each storage counted once (views and ties dedup)."""
    # a zero-byte storage may report data_ptr 0; it adds nothing either way
    storages = {(str(t.device), t.untyped_storage().data_ptr()): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def parameter_storage(model: torch.nn.Module) -> dict:
    """Parameter payload of `model`: unique storage bytes and element count, and the naive per-name sum that counts
    tied weights twice."""
    named = list(model.named_parameters(remove_duplicate=False))
    unique = list({id(p): p for _, p in named}.values())
    return {"unique_bytes": unique_storage_bytes(unique), "parameter_count": sum(p.numel() for p in unique),
            "naive_bytes": sum(p.numel() * p.element_size() for _, p in named), "named_tensor_count": len(named),
            "unique_tensor_count": len(unique), "buffer_unique_bytes": unique_storage_bytes(model.buffers()),
            "dtypes": sorted({str(p.dtype) for p in unique}), "devices": sorted({str(p.device) for p in unique})}


def cache_layer_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a transformers Cache; TypeError for an unknown cache layout."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"cache of type {type(cache).__name__} has no .layers; expected a transformers 4.57 Cache "
                        f"(DynamicCache)")
    return [(layer.keys, layer.values) for layer in layers]


def cache_storage(cache: Any) -> dict:
    """The observed KV-cache payload: unique bytes over all layers, bytes and logical length per layer."""
    pairs = cache_layer_tensors(cache)
    per_layer = [{"layer": index, "key_bytes": unique_storage_bytes([keys]),
                  "value_bytes": unique_storage_bytes([values]),
                  "logical_length": int(keys.shape[-2])}  # keys are (B, heads, T, head_dim)
                 for index, (keys, values) in enumerate(pairs)]
    lengths = sorted({entry["logical_length"] for entry in per_layer})
    return {"unique_bytes": unique_storage_bytes(t for pair in pairs for t in pair), "per_layer": per_layer,
            "logical_length": lengths[0] if len(lengths) == 1 else lengths}


# --- the process ---------------------------------------------------------------------------------------------------


def _entry(value: int, tool: str, units: str, meaning: str, source_field: str) -> dict:
    return {"bytes": value, "tool": tool, "source_field": source_field, "units_reported": units, "meaning": meaning,
            "platform": sys.platform}


def _read_proc_status(path: Path) -> dict:
    """VmRSS and VmHWM in bytes (/proc's "kB" is KiB)."""
    fields = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            number, unit = rest.split()
            if unit != "kB":
                raise ValueError(f"{path}: {name} in unexpected unit {unit!r}, expected 'kB'")
            fields[name] = int(number) * 1024
    return fields


def process_memory() -> dict:
    """Current RSS and lifetime peak RSS of this process, each labelled with tool, units, platform and meaning."""
    result: dict = {"platform": sys.platform, "machine": platform.machine(), "current_rss": None, "peak_rss": None}
    if PROC_STATUS.exists():
        fields = _read_proc_status(PROC_STATUS)
        if "VmRSS" in fields:
            result["current_rss"] = _entry(fields["VmRSS"], str(PROC_STATUS), "kB (KiB)", CURRENT, "VmRSS")
        if "VmHWM" in fields:
            result["peak_rss"] = _entry(fields["VmHWM"], str(PROC_STATUS), "kB (KiB)", LIFETIME_PEAK, "VmHWM")
    if result["peak_rss"] is None:
        import resource  # POSIX only; imported here so the module loads everywhere

        raw = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        value, units = (raw, "bytes") if sys.platform == "darwin" else (raw * 1024, "KiB")
        result["peak_rss"] = _entry(value, "resource.getrusage(RUSAGE_SELF)", units, LIFETIME_PEAK, "ru_maxrss")
    result["note"] = ("process-wide figures; a peak is a lifetime high-water mark and a rise across trials does not "
                      "isolate the cache increment of any one trial")
    return result


# --- reading a decode step's weights once ----------------------------------------------------------------------------

WEIGHT_READ_PASSES = 5
WEIGHT_READ_METHOD = (
    "one pass = Tensor.sum() of each weight tensor a decode step reads, so every element is read once; "
    "{passes} timed passes after one untimed warmup pass, time.perf_counter_ns around each whole pass; in the "
    "session's own thread setting, under torch.inference_mode(), outside every timed region, with no model forward"
)


def decode_step_weights(model: torch.nn.Module) -> tuple[list[torch.Tensor], dict]:
    """The parameter tensors one decode step reads whole, each storage once, and what was left out: a step reads
    only the fed tokens' rows of the input embedding (unless a tied output projection reads it whole)."""
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight.untyped_storage().data_ptr() == embedding.untyped_storage().data_ptr()
    seen, tensors, left_out = set(), [], []
    for name, parameter in model.named_parameters():
        if parameter.untyped_storage().data_ptr() in seen:
            continue
        seen.add(parameter.untyped_storage().data_ptr())
        if parameter is embedding and not tied:
            left_out.append({"name": name, "bytes": parameter.numel() * parameter.element_size(),
                             "why": "the input embedding: a step reads only the rows of the tokens it is fed"})
        else:
            tensors.append(parameter.detach())
    return tensors, {"tensor_count": len(tensors), "bytes": unique_storage_bytes(tensors), "left_out": left_out}


@torch.inference_mode()
def weight_read_time(model: torch.nn.Module, passes: int = WEIGHT_READ_PASSES, caches: dict = None) -> dict:
    """How long one pass reading the decode step's own weights takes (the weight_read record), with no forward and
    the thread setting as the session set it. caches: this machine's (host.machine.cache_sizes()); the record says
    whether the weights fit in its largest level, or "unknown"."""
    tensors, read = decode_step_weights(model)

    def one_pass() -> int:
        start = time.perf_counter_ns()
        for tensor in tensors:
            tensor.sum()  # reads every element once; the scalar is discarded
        return time.perf_counter_ns() - start

    warmup_ns = one_pass()
    seconds = [one_pass() / 1e9 for _ in range(passes)]
    largest = (caches or {}).get("largest_bytes")
    return {
        "method": WEIGHT_READ_METHOD.format(passes=passes),
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}, **read,
        "passes": passes, "seconds": seconds, "median_s": statistics.median(seconds), "warmup_s": warmup_ns / 1e9,
        "caches": caches,
        "fits_in_largest_cache": "unknown" if not isinstance(largest, int) else read["bytes"] <= largest,
        "note": ("When the weights fit in a cache level, a pass that follows another may be served from that cache "
                 "rather than from main memory; this is a time for these reads on this machine, not a bound on "
                 "a decode step"),
    }
