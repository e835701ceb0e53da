"""Controlled loading of a verified specimen directory, and inspection of what was loaded.

The execution controls of the protocol are applied here and nowhere else: built-in
GPTNeoXForCausalLM, fast tokenizer, local files only, safetensors only, no remote code,
float32 parameters on the CPU, eager attention, no automatic device placement, eval mode.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional

import torch

from inferlab import protocol
from inferlab.measure import memory
from inferlab.specimen import WEIGHT_FILE, SpecimenError, SpecimenSpec, require_verified

MODEL_CLASS = "GPTNeoXForCausalLM"
TOKENIZER_CLASS = "GPTNeoXTokenizerFast"


def set_threads(intra: int = protocol.INTRA_OP_THREADS, inter: int = protocol.INTER_OP_THREADS) -> dict:
    """Set torch's CPU thread counts before any compute: {requested, effective, matches, errors}.

    torch accepts the inter-op count only once per process and only before parallel work has
    started; a refusal is recorded as an error beside the effective value, not hidden.
    """
    errors = []
    torch.set_num_threads(intra)
    try:
        torch.set_num_interop_threads(inter)
    except RuntimeError as error:
        errors.append(f"set_num_interop_threads({inter}): {error}")
    requested = {"intra_op": intra, "inter_op": inter}
    effective = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    return {"requested": requested, "effective": effective, "matches": requested == effective, "errors": errors}


class _RecordingHandler(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.NOTSET)
        self.records = []

    def emit(self, record):
        self.records.append({"logger": record.name, "level": record.levelname, "message": record.getMessage()})


def load_options() -> dict:
    """The keyword arguments of from_pretrained, as used and as recorded (dtype named by string)."""
    return {
        "local_files_only": True,
        "use_safetensors": True,
        "trust_remote_code": False,
        "dtype": protocol.TORCH_DTYPE,
        "attn_implementation": protocol.ATTN_IMPLEMENTATION,
        "device_map": None,
    }


# from_pretrained's own words when a weight was not loaded from the checkpoint as it is (4.57.1).
WEIGHT_MESSAGE_MARKERS = ("newly initialized", "were not used when initializing", "not initialized from the model checkpoint")
LOADING_INFO_MEANING = {
    "missing_keys": "parameters the checkpoint lacks, so they were newly initialised",
    "unexpected_keys": "checkpoint tensors the model has no place for, so they were not used",
    "mismatched_keys": "tensors whose shape differs from the model's, so they were newly initialised",
    "error_msgs": "errors while loading the state dict",
}


def load_problems(loading_info: dict, log_messages: list[dict]) -> list[str]:
    """Why a load did not give the checkpoint's weights exactly: one line per non-empty loading_info list
    (missing, unexpected or mismatched keys, errors) and per log message about weights left out or newly
    initialised. Empty for a faithful load."""
    problems = [f"{key}: {LOADING_INFO_MEANING.get(key, key)}: {values}"
                for key, values in loading_info.items() if values]
    problems += [f"log {entry['logger']} {entry['level']}: {entry['message'].splitlines()[0]}"
                 for entry in log_messages if any(marker in entry["message"] for marker in WEIGHT_MESSAGE_MARKERS)]
    return problems


LOADED_FROM = (
    "a private copy of the verified files: each was copied out of the specimen folder and hashed again as it "
    "was copied, the hashes had to equal the verified ones, and from_pretrained read only the copy (removed "
    "after loading), so no file could change between verification and loading"
)


@contextlib.contextmanager
def verified_copy(directory: Path, verification: dict):
    """A private temporary folder holding exactly the verified files, re-hashed while copied; yields its path.

    Verification reads files by path, and so would from_pretrained: a file swapped in between would be
    loaded unverified. Copying once, hashing the copy's bytes and loading only the copy closes that gap.
    """
    with tempfile.TemporaryDirectory(prefix="inferlab-verified-") as private:
        for row in verification["files"]:
            if not row.get("present"):
                continue
            digest = hashlib.sha256()
            with open(Path(directory) / row["name"], "rb") as source, open(Path(private) / row["name"], "wb") as copy:
                for chunk in iter(lambda: source.read(1 << 20), b""):
                    digest.update(chunk)
                    copy.write(chunk)
            if digest.hexdigest() != row["sha256"]:
                raise SpecimenError(
                    f"{row['name']} in {directory}: changed after it was verified: verified sha256 {row['sha256']}, "
                    f"read again for loading {digest.hexdigest()}; nothing was loaded. Is another program writing "
                    f"this folder?")
        yield Path(private)


def load_specimen(directory, spec: SpecimenSpec) -> dict:
    """Verify directory against spec, then load it: {model, tokenizer, verification, model_load}.

    Raises SpecimenError (before touching the model) when the directory fails verification.
    model_load is JSON-ready: classes, options, captured warnings and transformers log
    messages, from_pretrained's loading_info (missing, unexpected and mismatched keys) with the
    load_problems found in it, load_start_ns/load_end_ns (perf_counter_ns), elapsed_s and the
    tokenizer's facts. A load with problems is returned, not raised: the caller fails a check with it.
    """
    from transformers import GPTNeoXForCausalLM, GPTNeoXTokenizerFast

    verification = require_verified(directory, spec)
    directory = str(Path(directory))
    options = load_options()
    torch_options = {**options, "dtype": getattr(torch, options["dtype"])}
    handler = _RecordingHandler()
    library_logger = logging.getLogger("transformers")
    library_logger.addHandler(handler)
    copy_start = time.perf_counter_ns()
    try:
        with verified_copy(Path(directory), verification) as private, \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_start = time.perf_counter_ns()
            model, loading_info = GPTNeoXForCausalLM.from_pretrained(private, output_loading_info=True,
                                                                     **torch_options)
            model.eval()
            tokenizer = GPTNeoXTokenizerFast.from_pretrained(private, local_files_only=True)
            load_end = time.perf_counter_ns()
    finally:
        library_logger.removeHandler(handler)
    if not tokenizer.is_fast:
        raise RuntimeError(f"{directory}: expected a fast tokenizer, actual {type(tokenizer).__name__}")
    loading_info = {key: [str(item) for item in values] for key, values in (loading_info or {}).items()}
    model_load = {
        "directory": directory,
        "loaded_from": LOADED_FROM,
        "verified_copy_s": (load_start - copy_start) / 1e9,
        "model_class": type(model).__name__,
        "options": {**options, "model_class": MODEL_CLASS, "tokenizer_class": TOKENIZER_CLASS},
        "eval_called": True,
        "training": model.training,
        "warnings": [
            {"category": w.category.__name__, "message": str(w.message), "filename": w.filename, "lineno": w.lineno}
            for w in caught
        ],
        "log_messages": handler.records,
        "log_level_captured": logging.getLevelName(library_logger.getEffectiveLevel()),
        "loading_info": loading_info,
        "load_problems": load_problems(loading_info, handler.records),
        "load_start_ns": load_start,
        "load_end_ns": load_end,
        "elapsed_s": (load_end - load_start) / 1e9,
        "tokenizer": {
            "class": type(tokenizer).__name__,
            "is_fast": tokenizer.is_fast,
            "vocab_size": len(tokenizer),
            "special_tokens_map": dict(tokenizer.special_tokens_map),
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.bos_token_id,
        },
    }
    return {"model": model, "tokenizer": tokenizer, "verification": verification, "model_load": model_load}


def architecture_differences(config, expected: Optional[dict]) -> list[str]:
    """One line per config field whose loaded value differs from the spec's pinned architecture."""
    missing = object()
    found = []
    for field_name, value in (expected or {}).items():
        actual = getattr(config, field_name, missing)
        same = actual == value if not isinstance(value, float) else (
            isinstance(actual, (int, float)) and math.isclose(actual, value, rel_tol=1e-9))
        if actual is missing or not same:
            shown = "absent" if actual is missing else repr(actual)
            found.append(f"config.{field_name}: expected {value!r} (the specimen's pinned architecture), actual {shown}")
    return found


def inspect_model(model, directory, expected_architecture: Optional[dict] = None) -> dict:
    """The model_inspection record: class, config, parameters, unique storage bytes, checkpoint bytes.

    violations lists every departure from the controls (device, dtype, training mode,
    attention implementation) and from the specimen's pinned architecture (config fields that decide the
    computation), so a caller can fail a check with evidence instead of a crash; violation_summary says
    the same in a few lines (parameters grouped by what is wrong).
    """
    expected_dtype = getattr(torch, protocol.TORCH_DTYPE)
    parameters, violations = [], []
    off_controls: dict = {}  # ("device" | "dtype", actual) -> parameter names, for the summary
    for name, parameter in model.named_parameters():
        parameters.append(
            {
                "name": name,
                "shape": list(parameter.shape),
                "numel": parameter.numel(),
                "device": str(parameter.device),
                "dtype": str(parameter.dtype).removeprefix("torch."),
            }
        )
        if parameter.device.type != "cpu":
            violations.append(f"{name}: device expected cpu, actual {parameter.device}")
            off_controls.setdefault(("device expected cpu", str(parameter.device)), []).append(name)
        if parameter.dtype != expected_dtype:
            violations.append(f"{name}: dtype expected {expected_dtype}, actual {parameter.dtype}")
            off_controls.setdefault((f"dtype expected {expected_dtype}", str(parameter.dtype)), []).append(name)
    summary = [f"{what}, actual {actual} for {len(names)} of {len(parameters)} parameters (first: {names[0]})"
               for (what, actual), names in off_controls.items()]
    attn = getattr(model.config, "_attn_implementation", None)
    if attn != protocol.ATTN_IMPLEMENTATION:
        violations.append(f"attn_implementation: expected {protocol.ATTN_IMPLEMENTATION}, actual {attn}")
        summary.append(violations[-1])
    if model.training:
        violations.append("model.training: expected False (eval mode), actual True")
        summary.append(violations[-1])
    architecture = architecture_differences(model.config, expected_architecture)
    violations += architecture
    summary += architecture
    storage = memory.parameter_storage(model)
    checkpoint = Path(directory) / WEIGHT_FILE
    return {
        "class": type(model).__name__,
        "config": model.config.to_dict(),
        "parameter_count": sum(p["numel"] for p in parameters),
        "parameters": parameters,
        "unique_parameter_storage_bytes": storage["unique_bytes"],
        "unique_parameters": storage["unique_tensor_count"],
        "checkpoint_file": str(checkpoint),
        "checkpoint_file_bytes": checkpoint.stat().st_size,
        "training": model.training,
        "attn_implementation": attn,
        "expected_architecture": expected_architecture,
        "violations": violations,
        "violation_summary": summary,
    }
