"""The model under the protocol's execution controls (load_options, set_threads; applied here and nowhere else):
loaded from a verified copy, inspected, every forward watched (ForwardWatch: one Python call per forward, inside
timed regions too, identical for both cache paths), and every warning a model call raises captured for its record.
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
from typing import Iterator, Optional

import torch
from transformers.utils import logging as hf_logging

from inferlab import protocol
from inferlab.measure import memory
from inferlab.specimen import WEIGHT_FILE, SpecimenError, SpecimenSpec, require_verified

MODEL_CLASS = "GPTNeoXForCausalLM"
TOKENIZER_CLASS = "GPTNeoXTokenizerFast"


def set_threads(intra: int = protocol.INTRA_OP_THREADS, inter: int = protocol.INTER_OP_THREADS) -> dict:
    """Set torch's CPU thread counts before any compute: {requested, effective, matches, errors}. torch takes the
    inter-op count only once per process, before parallel work: a refusal is recorded beside the effective value."""
    errors = []
    torch.set_num_threads(intra)
    try:
        torch.set_num_interop_threads(inter)
    except RuntimeError as error:
        errors.append(f"set_num_interop_threads({inter}): {error}")
    requested = {"intra_op": intra, "inter_op": inter}
    effective = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    return {"requested": requested, "effective": effective, "matches": requested == effective, "errors": errors}


def load_options() -> dict:
    """The keyword arguments of from_pretrained, as used and as recorded (dtype named by string)."""
    return {"local_files_only": True, "use_safetensors": True, "trust_remote_code": False,
            "dtype": protocol.TORCH_DTYPE, "attn_implementation": protocol.ATTN_IMPLEMENTATION, "device_map": None}


# from_pretrained's own words when a weight was not loaded from the checkpoint as it is (4.57.1)
WEIGHT_MESSAGE_MARKERS = ("newly initialized", "were not used when initializing",
                          "not initialized from the model checkpoint")
LOADING_INFO_MEANING = {
    "missing_keys": "parameters the checkpoint lacks, so they were newly initialised",
    "unexpected_keys": "checkpoint tensors the model has no place for, so they were not used",
    "mismatched_keys": "tensors whose shape differs from the model's, so they were newly initialised",
    "error_msgs": "errors while loading the state dict",
}
LOADED_FROM = (
    "a private copy of the verified files: each was copied out of the specimen folder and hashed again as it "
    "was copied, the hashes had to equal the verified ones, and from_pretrained read only the copy (removed "
    "after loading), so no file could change between verification and loading"
)


def load_problems(loading_info: dict, log_messages: list[dict]) -> list[str]:
    """Why a load did not give the checkpoint's weights exactly: one line per non-empty loading_info list and per log
    message about weights left out or newly initialised. Empty for a faithful load."""
    problems = [f"{key}: {LOADING_INFO_MEANING.get(key, key)}: {values}"
                for key, values in loading_info.items() if values]
    problems += [f"log {entry['logger']} {entry['level']}: {entry['message'].splitlines()[0]}"
                 for entry in log_messages if any(marker in entry["message"] for marker in WEIGHT_MESSAGE_MARKERS)]
    return problems


@contextlib.contextmanager
def verified_copy(directory: Path, verification: dict):
    """A private temporary folder holding exactly the verified files, hashed again while copied; yields its path.
    from_pretrained, like verification, reads by path: a file swapped in between would be loaded unverified."""
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


class _ListHandler(logging.Handler):
    """Appends each log record at `level` or above to `sink`, as `entry(record)` gives it."""

    def __init__(self, level: int, sink: list, entry):
        super().__init__(level=level)
        self.sink, self.entry = sink, entry

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(self.entry(record))


def load_specimen(directory, spec: SpecimenSpec) -> dict:
    """Verify directory against spec (SpecimenError before touching the model), then load a private verified copy:
    {model, tokenizer, verification, model_load (JSON-ready)}. A load with problems is returned, not raised: the
    caller fails a check with it."""
    from transformers import GPTNeoXForCausalLM, GPTNeoXTokenizerFast

    verification = require_verified(directory, spec)
    directory = str(Path(directory))
    options = load_options()
    log_messages, library_logger = [], logging.getLogger("transformers")
    handler = _ListHandler(logging.NOTSET, log_messages, lambda r: {"logger": r.name, "level": r.levelname,
                                                                     "message": r.getMessage()})
    library_logger.addHandler(handler)
    copy_start = time.perf_counter_ns()
    try:
        with verified_copy(Path(directory), verification) as private, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_start = time.perf_counter_ns()
            model, loading_info = GPTNeoXForCausalLM.from_pretrained(
                private, output_loading_info=True, **{**options, "dtype": getattr(torch, options["dtype"])})
            model.eval()
            tokenizer = GPTNeoXTokenizerFast.from_pretrained(private, local_files_only=True)
            load_end = time.perf_counter_ns()
    finally:
        library_logger.removeHandler(handler)
    loading_info = {key: [str(item) for item in values] for key, values in (loading_info or {}).items()}
    model_load = {
        "directory": directory, "loaded_from": LOADED_FROM, "verified_copy_s": (load_start - copy_start) / 1e9,
        "model_class": type(model).__name__,
        "options": {**options, "model_class": MODEL_CLASS, "tokenizer_class": TOKENIZER_CLASS},
        "training": model.training,
        "warnings": [{"category": w.category.__name__, "message": str(w.message), "filename": w.filename,
                      "lineno": w.lineno} for w in caught],
        "log_messages": log_messages,
        "loading_info": loading_info, "load_problems": load_problems(loading_info, log_messages),
        "load_start_ns": load_start, "load_end_ns": load_end, "elapsed_s": (load_end - load_start) / 1e9,
        "tokenizer": {"class": type(tokenizer).__name__, "is_fast": tokenizer.is_fast, "vocab_size": len(tokenizer),
                      "special_tokens_map": dict(tokenizer.special_tokens_map),
                      "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id},
    }
    return {"model": model, "tokenizer": tokenizer, "verification": verification, "model_load": model_load}


def architecture_differences(config, expected: Optional[dict]) -> list[str]:
    """One line per config field whose loaded value differs from the spec's pinned architecture."""
    missing, found = object(), []
    for name, value in (expected or {}).items():
        actual = getattr(config, name, missing)
        same = actual == value if not isinstance(value, float) else (
            isinstance(actual, (int, float)) and math.isclose(actual, value, rel_tol=1e-9))
        if actual is missing or not same:
            shown = "absent" if actual is missing else repr(actual)
            found.append(f"config.{name}: expected {value!r} (the specimen's pinned architecture), actual {shown}")
    return found


def inspect_model(model, directory, expected_architecture: Optional[dict] = None) -> dict:
    """The model_inspection record: class, config, parameters, unique storage bytes, checkpoint bytes.

    violations lists every departure from the controls (device, dtype, training mode, attention implementation) and
    from the specimen's pinned architecture; violation_summary says the same in a few lines (parameters grouped by
    what is wrong), so a caller can fail a check with evidence instead of a crash.
    """
    expected_dtype = getattr(torch, protocol.TORCH_DTYPE)
    parameters, violations, off_controls = [], [], {}  # off_controls: (what, actual) -> parameter names
    for name, parameter in model.named_parameters():
        parameters.append({"name": name, "shape": list(parameter.shape), "numel": parameter.numel(),
                           "device": str(parameter.device), "dtype": str(parameter.dtype).removeprefix("torch.")})
        checks = ((parameter.device.type != "cpu", "device expected cpu", parameter.device),
                  (parameter.dtype != expected_dtype, f"dtype expected {expected_dtype}", parameter.dtype))
        for wrong, what, actual in checks:
            if wrong:
                violations.append(f"{name}: {what}, actual {actual}")
                off_controls.setdefault((what, str(actual)), []).append(name)
    summary = [f"{what}, actual {actual} for {len(names)} of {len(parameters)} parameters (first: {names[0]})"
               for (what, actual), names in off_controls.items()]
    attn = getattr(model.config, "_attn_implementation", None)
    rest = ([f"attn_implementation: expected {protocol.ATTN_IMPLEMENTATION}, actual {attn}"]
            if attn != protocol.ATTN_IMPLEMENTATION else [])
    rest += ["model.training: expected False (eval mode), actual True"] if model.training else []
    rest += architecture_differences(model.config, expected_architecture)
    storage = memory.parameter_storage(model)
    checkpoint = Path(directory) / WEIGHT_FILE
    return {
        "class": type(model).__name__, "config": model.config.to_dict(),
        "parameter_count": sum(p["numel"] for p in parameters), "parameters": parameters,
        "unique_parameter_storage_bytes": storage["unique_bytes"], "unique_parameters": storage["unique_tensor_count"],
        "checkpoint_file": str(checkpoint), "checkpoint_file_bytes": checkpoint.stat().st_size,
        "training": model.training, "attn_implementation": attn, "expected_architecture": expected_architecture,
        "violations": violations + rest, "violation_summary": summary + rest,
    }


# --- every forward watched ------------------------------------------------------------------------------------------

WATCH_HOW = ("a forward pre-hook on the model, registered when the session loaded it, read "
             "torch.is_inference_mode_enabled() and model.training at the start of every forward")
KEPT_VIOLATIONS = 20  # per window; the count says how many there were in all


class ForwardWatch:
    """Counts the model's forwards, and keeps each that ran outside inference mode or in training mode."""

    def __init__(self, model: torch.nn.Module):
        self.forwards, self.violations = 0, []
        self._handle = model.register_forward_pre_hook(self._observe)

    def _observe(self, module: torch.nn.Module, args) -> None:
        self.forwards += 1
        inference, training = torch.is_inference_mode_enabled(), module.training
        if not inference or training:
            self.violations.append({"forward": self.forwards, "inference_mode": inference, "training": training,
                                    "grad_enabled": torch.is_grad_enabled()})

    def window(self) -> "ForwardWindow":
        """A window that sees the forwards from now on."""
        return ForwardWindow(self, self.forwards, len(self.violations))

    def remove(self) -> None:
        """Stop watching (the hook is removed)."""
        self._handle.remove()


class ForwardWindow:
    """The forwards a watch saw since the window was opened."""

    def __init__(self, watch: ForwardWatch, first_forward: int, first_violation: int):
        self.watch, self.first_forward, self.first_violation = watch, first_forward, first_violation

    def summary(self) -> dict:
        """A record's `forward_mode` field: {forwards, all_inference_mode, none_training, violation_count,
        violations, how}."""
        violations = self.watch.violations[self.first_violation:]
        return {"forwards": self.watch.forwards - self.first_forward,
                "all_inference_mode": all(v["inference_mode"] for v in violations),
                "none_training": not any(v["training"] for v in violations), "violation_count": len(violations),
                "violations": violations[:KEPT_VIOLATIONS], "how": WATCH_HOW}


def violation_message(summary: Optional[dict]) -> Optional[str]:
    """What a failing check says of a window's violations, or None when every forward kept the controls."""
    if not summary or not summary.get("violation_count"):
        return None
    first = summary["violations"][0]
    return (f"{summary['violation_count']} of {summary['forwards']} forwards broke the controls (expected "
            f"torch.inference_mode() on and model.training False); the first, forward {first['forward']} of the "
            f"session: inference_mode {first['inference_mode']}, training {first['training']}")


# --- every warning of a model call -----------------------------------------------------------------------------------

# transformers' root logger does not propagate and torch logs under its own name: each gets a handler of its own
LIBRARY_LOGGERS = ("transformers", "torch")


@contextlib.contextmanager
def capture_messages(loggers: tuple = LIBRARY_LOGGERS) -> Iterator[list[str]]:
    """Python warnings and the libraries' log records (WARNING and above) in one list of strings, around a whole
    model call (entered before and left after it, so a timed region's own code is never inside the capture).

    A logger quieter than WARNING is lowered to it for the block, so a global verbosity cannot hide a warning, and
    transformers' warning_once memory is cleared, so each block reports its own. The list is complete when the block
    exits, also by an exception (a trial timeout), so a failed trial's record keeps what was said.
    """
    messages: list[str] = []
    hf_logging.warning_once.cache_clear()
    installed = []
    for name in loggers:
        logger = logging.getLogger(name)
        handler = _ListHandler(logging.WARNING, messages,
                               lambda r, library=name: f"{library} logger {r.name} {r.levelname}: {r.getMessage()}")
        installed.append((logger, handler, logger.level))
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield messages
            finally:
                messages.extend(f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught)
    finally:
        for logger, handler, level in installed:
            logger.removeHandler(handler)
            logger.setLevel(level)
