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
from inferlab.measure.sizes import expected_kv_cache_bytes, gpt_neox_parameter_count  # noqa: F401

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
# Linux can reset VmHWM (writing 5 to /proc/self/clear_refs); this run never does, and freeing objects never lowers it
LIFETIME_PEAK = "lifetime peak (freeing objects does not lower it)"


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


WEIGHT_READ_PASSES = 5
WEIGHT_READ_METHOD = (
    "one pass = Tensor.sum() of each weight tensor a decode step reads, so every element is read once; "
    "{passes} timed passes after one untimed warmup pass, time.perf_counter_ns around each whole pass; in the "
    "session's own thread setting, under torch.inference_mode(), outside every timed region, with no model forward"
)


def decode_step_weights(model: torch.nn.Module) -> tuple[list[torch.Tensor], dict]:
    """The parameter tensors one decode step reads whole, each storage once, and what was left out.

    A step reads every parameter but the input embedding, of which it reads only the rows of the tokens fed
    (one row, with the cache); a tied output projection reads the embedding whole, so it then stays in.
    Returns (tensors, {tensor_count, bytes, left_out: [{name, bytes, why}]}).
    """
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight.untyped_storage().data_ptr() == embedding.untyped_storage().data_ptr()
    seen, tensors, left_out = set(), [], []
    for name, parameter in model.named_parameters():
        key = parameter.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        if parameter is embedding and not tied:
            left_out.append({"name": name, "bytes": parameter.numel() * parameter.element_size(),
                             "why": "the input embedding: a step reads only the rows of the tokens it is fed"})
            continue
        tensors.append(parameter.detach())
    return tensors, {"tensor_count": len(tensors), "bytes": unique_storage_bytes(tensors), "left_out": left_out}


@torch.inference_mode()
def weight_read_time(model: torch.nn.Module, passes: int = WEIGHT_READ_PASSES, caches: dict = None) -> dict:
    """How long one pass reading the decode step's own weight tensors takes: the weight_read record's fields.

    No forward is made and the thread setting is left as the session set it (recorded). caches is this
    machine's cache description (inferlab.host.machine.cache_sizes()); the record says whether the weights fit in
    its largest level, and says "unknown" when the sizes are not known.
    """
    import statistics
    import time

    if passes < 1:
        raise ValueError(f"weight_read_time: expected passes >= 1, got {passes}")
    tensors, read = decode_step_weights(model)

    def one_pass() -> int:
        start = time.perf_counter_ns()
        for tensor in tensors:
            tensor.sum()  # reads every element once; the scalar is discarded
        return time.perf_counter_ns() - start

    warmup_ns = one_pass()
    seconds = [one_pass() / 1e9 for _ in range(passes)]
    largest = (caches or {}).get("largest_bytes")
    fits = "unknown" if not isinstance(largest, int) else read["bytes"] <= largest
    return {
        "method": WEIGHT_READ_METHOD.format(passes=passes),
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()},
        **read,
        "passes": passes,
        "seconds": seconds,
        "median_s": statistics.median(seconds),
        "warmup_s": warmup_ns / 1e9,
        "caches": caches,
        "fits_in_largest_cache": fits,
        "note": ("When the weights fit in a cache level, a pass that follows another may be served from that cache "
                 "rather than from main memory; this is a time for these reads on this machine, not a bound on "
                 "a decode step"),
    }
