"""Memory accounting that says what it measured: unique tensor storage, KV-cache bytes, process RSS.

Tensor payloads (parameters, cache) are counted by unique storage, so tied weights and views are
counted once. Process figures come with their tool, units, platform and meaning (current value or
lifetime high-water mark). Neither is a "total memory" figure; UNMEASURED_CATEGORIES lists what is
left out.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any, Iterable

import torch

# Re-exported: sizes from a config alone live where readers without torch (verify) can use them too.
from inferlab.sizes import expected_kv_cache_bytes, gpt_neox_parameter_count  # noqa: F401

PROC_STATUS = Path("/proc/self/status")

# What neither the tensor accounting nor a single RSS reading isolates (Part 6).
UNMEASURED_CATEGORIES = {
    "activations": "temporary hidden states and attention scores inside a forward; freed before we can inspect them",
    "logits": "the per-step (1, 1, vocab) logit tensors and any copies; transient, not held by the cache",
    "workspace": "scratch buffers BLAS/attention kernels allocate during a call; invisible to tensor accounting",
    "allocator_retention": "memory the allocator keeps after tensors are freed; shows up in RSS, not in any tensor",
    "runtime_libraries": "code and data of Python, torch, BLAS and tokenizers mapped into the process",
    "loading_copies": "transient copies made while reading and converting the checkpoint; only a peak RSS may show them",
}

CURRENT = "current"
LIFETIME_PEAK = "lifetime peak (cannot be reset)"


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors`, each storage counted once (views and ties dedup)."""
    seen: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        # A zero-byte storage may report data_ptr 0; it adds nothing either way.
        seen[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def parameter_storage(model: torch.nn.Module) -> dict:
    """Parameter payload of `model`: unique storage bytes, unique element count, and the naive per-name sum."""
    named = list(model.named_parameters(remove_duplicate=False))
    unique_params = {id(p): p for _, p in named}.values()
    buffers = list(model.buffers())
    return {
        "unique_bytes": unique_storage_bytes(unique_params),
        "parameter_count": sum(p.numel() for p in unique_params),
        # The sum over every registered name counts tied weights twice: the error unique storage avoids.
        "naive_bytes": sum(p.numel() * p.element_size() for _, p in named),
        "named_tensor_count": len(named),
        "unique_tensor_count": len(unique_params),
        "buffer_unique_bytes": unique_storage_bytes(buffers),
        "dtypes": sorted({str(p.dtype) for p in unique_params}),
        "devices": sorted({str(p.device) for p in unique_params}),
        "what": "tensor payload of parameters only; not process memory",
    }


def cache_layer_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a transformers Cache; raises TypeError for an unknown cache layout."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(
            f"cache of type {type(cache).__name__} has no .layers; expected a transformers 4.57 Cache (DynamicCache)"
        )
    pairs = []
    for index, layer in enumerate(layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise TypeError(f"cache layer {index} ({type(layer).__name__}) holds no key/value tensors yet")
        pairs.append((keys, values))
    return pairs


def cache_storage(cache: Any) -> dict:
    """Observed KV-cache payload: unique bytes over all layers, bytes and logical length per layer."""
    pairs = cache_layer_tensors(cache)
    per_layer = []
    for index, (keys, values) in enumerate(pairs):
        per_layer.append(
            {
                "layer": index,
                "key_bytes": unique_storage_bytes([keys]),
                "value_bytes": unique_storage_bytes([values]),
                # Keys are (B, heads, T, head_dim): the sequence dimension is -2.
                "logical_length": int(keys.shape[-2]),
            }
        )
    lengths = {entry["logical_length"] for entry in per_layer}
    return {
        "unique_bytes": unique_storage_bytes(t for pair in pairs for t in pair),
        "per_layer": per_layer,
        "logical_length": lengths.pop() if len(lengths) == 1 else sorted(lengths),
        "what": "tensor payload of cached keys and values only; not process memory",
    }


def _entry(value: int, tool: str, units: str, meaning: str, source_field: str) -> dict:
    return {
        "bytes": value,
        "tool": tool,
        "source_field": source_field,
        "units_reported": units,
        "meaning": meaning,
        "platform": sys.platform,
    }


def _read_proc_status(path: Path) -> dict:
    fields = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            number, unit = rest.split()
            if unit != "kB":
                raise ValueError(f"{path}: {name} in unexpected unit {unit!r}, expected 'kB'")
            # /proc's "kB" is KiB (1024 bytes).
            fields[name] = int(number) * 1024
    return fields


def process_memory() -> dict:
    """Current RSS and lifetime peak RSS of this process, each labelled with tool, units, platform and meaning."""
    result: dict = {"platform": sys.platform, "machine": platform.machine(), "current_rss": None, "peak_rss": None}
    if PROC_STATUS.exists():
        fields = _read_proc_status(PROC_STATUS)
        tool = str(PROC_STATUS)
        if "VmRSS" in fields:
            result["current_rss"] = _entry(fields["VmRSS"], tool, "kB (KiB)", CURRENT, "VmRSS")
        if "VmHWM" in fields:
            result["peak_rss"] = _entry(fields["VmHWM"], tool, "kB (KiB)", LIFETIME_PEAK, "VmHWM")
    if result["peak_rss"] is None:
        import resource  # POSIX only; imported here so the module loads everywhere

        raw = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is KiB on Linux but bytes on macOS.
        if sys.platform == "darwin":
            value, units = raw, "bytes"
        else:
            value, units = raw * 1024, "KiB"
        result["peak_rss"] = _entry(value, "resource.getrusage(RUSAGE_SELF)", units, LIFETIME_PEAK, "ru_maxrss")
    result["note"] = (
        "process-wide figures; a peak is a lifetime high-water mark and a rise across trials "
        "does not isolate the cache increment of any one trial"
    )
    return result


@torch.inference_mode()
def prefill_cache(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """One prefill forward into a fresh DynamicCache, for weighing the cache; returns the cache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True,
                logits_to_keep=1)  # input_ids (1, T)
    return out.past_key_values


BANDWIDTH_BYTES_PER_COPY = 128 * 1024 * 1024  # far beyond the KV cache (< 1 MB here) and any CPU cache level
BANDWIDTH_REPEATS = 5
BANDWIDTH_METHOD = (
    "torch Tensor.copy_ of a {size:g} MiB float32 tensor into a preallocated one, on 1 intra-op thread, "
    "{repeats} timed copies after one untimed warmup copy (it touches the destination's pages first); "
    "time.perf_counter_ns around each copy. Each copy reads and writes bytes_per_copy, so "
    "bytes_per_s_median = 2 x bytes_per_copy / median seconds (the STREAM 'copy' convention)"
)


def memory_bandwidth(bytes_per_copy: int = BANDWIDTH_BYTES_PER_COPY, repeats: int = BANDWIDTH_REPEATS) -> dict:
    """One thread's memory bandwidth from copying a large tensor: the memory_bandwidth record's fields.

    No model is involved. torch's intra-op thread count is set to 1 for the copies and restored after.
    """
    import statistics
    import time

    if bytes_per_copy < 4 or repeats < 1:
        raise ValueError(f"memory_bandwidth: expected bytes_per_copy >= 4 and repeats >= 1, "
                         f"got {bytes_per_copy} and {repeats}")
    elements = bytes_per_copy // 4
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        source = torch.ones(elements, dtype=torch.float32)  # (elements,)
        target = torch.empty_like(source)
        start = time.perf_counter_ns()
        target.copy_(source)  # warmup
        warmup_s = (time.perf_counter_ns() - start) / 1e9
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter_ns()
            target.copy_(source)
            seconds.append((time.perf_counter_ns() - start) / 1e9)
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous_threads)
    copied = elements * 4
    median = statistics.median(seconds)
    return {
        "method": BANDWIDTH_METHOD.format(size=copied / 2**20, repeats=repeats),
        "threads": threads,
        "bytes_per_copy": copied,
        "bytes_moved_per_copy": 2 * copied,
        "repeats": repeats,
        "seconds": seconds,
        "warmup_seconds": warmup_s,
        "bytes_per_s_median": 2 * copied / median if median > 0 else None,
        "note": ("a machine property measured outside every timed region with no model forward; a decode step "
                 "must read at least its parameters and cache, so bytes read / this rate is a floor for this "
                 "machine, not a prediction"),
    }
