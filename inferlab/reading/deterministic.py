"""What a run computed that does not depend on the clock, as plain data: the outputs another honest run of the
same specimen and software must reproduce.

deterministic_outputs(view) reads them from a run's records and tensors (through the one reader, RunView):
the prompts' token ids, every generation trial's ids (a greedy trial's with its per-step top two raw logits and
ids, inferlab.measure.near_tie), the timing trials' ids (with theirs), the matched-prefix argmaxes, margins and top two, the raw first-step logits (their hashes, and the top ids and values from the saved tensors), and the
batching rows. An instructor's reference and a grader's replay compare these, never the timings.

Greedy ids, the cache comparison and raw logits depend on the specimen and the arithmetic only. Seeded
sampling ids depend on the random generator too, so they are marked `sampled` and carry the torch version
that drew them: they are comparable only where that version matches. Only what a trial completed is listed;
a failed or missing trial is named in `absent` with why, never filled in.
"""

from __future__ import annotations

from typing import Any, Optional

from inferlab import protocol
from inferlab.measure import near_tie

OUTPUTS_SCHEMA = 2  # 2: greedy trials' per-step top two, prefixes' top two
TOP_K = 20  # how many of the largest raw first-step logits are kept per prompt and condition


def _ok(record: Optional[dict]) -> bool:
    return isinstance(record, dict) and record.get("status", "ok") == "ok" \
        and isinstance(record.get("generated_ids"), list)


def _generation(view) -> tuple[dict, dict]:
    """{trial_id: outputs} of the trials that completed, and {trial_id: why absent} of the others."""
    by_trial = {}
    for record in view.kind("generation"):
        trial_id = record.get("trial_id")
        if isinstance(trial_id, str) and trial_id not in by_trial:
            by_trial[trial_id] = record
    found, absent = {}, {}
    for trial in protocol.generation_trials():
        record = by_trial.get(trial.test_id)
        if not _ok(record):
            absent[trial.test_id] = "no record" if record is None else f"status {record.get('status')!r}"
            continue
        found[trial.test_id] = {
            "prompt_id": trial.prompt_id, "condition": trial.condition, "seed": trial.seed,
            "repetition": trial.repetition, "is_rerun": trial.is_rerun,
            "sampled": bool(protocol.CONDITIONS[trial.condition].do_sample),
            "ids": list(record["generated_ids"]), "stop_reason": record.get("stop_reason"),
            "first_step_logits_sha256": record.get("first_step_logits_sha256"),
            "first_step_argmax": record.get("first_step_logits_argmax"),
            **_steps(record),
        }
    return found, absent


def _steps(record: dict) -> dict:
    """A greedy trial's per-step top two raw logits and ids (inferlab.measure.near_tie), when it recorded them whole."""
    found = {}
    if near_tie.steps_of(record) is not None:
        found[near_tie.STEP_VALUES_FIELD] = record[near_tie.STEP_VALUES_FIELD]
        if record.get(near_tie.STEP_IDS_FIELD) is not None:
            found[near_tie.STEP_IDS_FIELD] = record[near_tie.STEP_IDS_FIELD]
    return found


def _timing(view) -> tuple[dict, dict]:
    """{schedule_id: outputs} of the timing trials that completed (their ids, not their times), and the absent."""
    by_index = {}
    for record in view.kind("timing_trial"):
        index = record.get("schedule_index")
        if isinstance(index, int) and index not in by_index:
            by_index[index] = record
    found, absent = {}, {}
    for planned in protocol.timing_schedule():
        record = by_index.get(planned.schedule_index)
        if not _ok(record):
            absent[planned.test_id] = "no record" if record is None else f"status {record.get('status')!r}"
            continue
        found[planned.test_id] = {"prompt_id": planned.prompt_id, "use_cache": planned.use_cache,
                                  "warmup": planned.warmup, "ids": list(record["generated_ids"]), **_steps(record)}
    return found, absent


def _cache(view) -> Optional[dict]:
    """The matched-prefix comparison's fixed continuation and, per prefix, the argmaxes and the top-two margin."""
    summary = view.first("cache_summary")
    comparisons = view.kind("cache_comparison")
    if not comparisons and not (summary and summary.get("available")):
        return None
    return {
        "continuation": (summary or {}).get("continuation"),
        "prefixes": [{"prefix_length": r.get("prefix_length"), "next_target_id": r.get("next_target_id"),
                      "argmax_cached": r.get("argmax_cached"), "argmax_uncached": r.get("argmax_uncached"),
                      "top2_margin_uncached": r.get("top2_margin_uncached"), "max_abs_diff": r.get("max_abs_diff"),
                      "bitwise_equal": r.get("bitwise_equal"), **_uncached_top(view, r)} for r in comparisons],
    }


def _uncached_top(view, record: dict) -> dict:
    """A prefix's two largest uncached logits with their ids ({top2_uncached: {ids, values}}), from its saved tensor
    when it matches its record's SHA-256; nothing otherwise."""
    tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
    reference = tensors.get("uncached")
    array = view.verified_tensor(reference) if isinstance(reference, dict) else None
    return {} if array is None else {"top2_uncached": top_logits(array, 2)}


def top_logits(array, k: int = TOP_K) -> dict:
    """The k largest entries of a vocabulary vector, largest first (ties by the lower id): ids and values."""
    import numpy

    values = numpy.asarray(array, dtype=numpy.float64).reshape(-1)  # (vocab,)
    order = numpy.lexsort((numpy.arange(values.size), -values))[:k]
    return {"ids": [int(i) for i in order], "values": [float(values[i]) for i in order]}


def _first_step(view) -> tuple[dict, dict]:
    """Per 'prompt/condition' whose raw first-step logits were saved: their hash and top ids and values, read
    from the tensor only when it matches its record's SHA-256; a tensor that does not is named in absent."""
    found, absent = {}, {}
    for record in view.kind("generation"):
        reference = record.get("first_step_logits")
        if not isinstance(reference, dict) or not _ok(record):
            continue
        key = f"{record.get('prompt_id')}/{record.get('condition')}"
        if key in found or key in absent:
            continue
        array = view.verified_tensor(reference)
        if array is None:
            absent[key] = f"{reference.get('file')}[{reference.get('key')}] missing or not as its record says"
            continue
        found[key] = first_step_entry(record.get("trial_id"), reference.get("sha256"), array)
    return found, absent


def first_step_entry(trial_id: Optional[str], sha256: Optional[str], array) -> dict:
    """What the outputs hold of one prompt and condition's raw first-step logits (vocab,): the trial that saved
    them, their hash, their shape and their TOP_K largest ids and values."""
    return {"trial_id": trial_id, "sha256": sha256, "shape": list(array.shape),
            **{f"top_{name}": value for name, value in top_logits(array).items()}}


def _batching(view) -> dict:
    """Per batching call: the requests in row order and the raw ids each row generated."""
    calls = {}
    for record in view.kind("batching"):
        if record.get("record_type") == "call" and isinstance(record.get("call_index"), int):
            calls[str(record["call_index"])] = {"call_type": record.get("call_type"),
                                                "request_ids": record.get("request_ids"),
                                                "generated_ids_raw": record.get("generated_ids_raw")}
    return calls


def _inputs(view) -> dict:
    """{prompt_id: token ids} as the run tokenized them."""
    return {r.get("prompt_id"): r.get("token_ids") for r in view.kind("input") if isinstance(r.get("token_ids"), list)}


def _weights_sha256(view) -> Optional[str]:
    for record in view.kind("artifact_file"):
        if record.get("name") == "model.safetensors":
            return record.get("sha256")
    return None


TENSOR_OWNERS = ("trial_id", "schedule_id", "prefix_length", "call_index")  # what names a record's tensor


def tensor_owner(record: dict) -> str:
    """The record as a tensor label names it: its kind and what owns its tensors (TENSOR_OWNERS),
    'generation P1-G-rep1', 'cache_comparison 7'."""
    owner = next((str(record[field]) for field in TENSOR_OWNERS if record.get(field) is not None), None)
    return " ".join(str(part) for part in (record.get("kind"), owner) if part is not None)


def tensor_label(record: dict, name: str) -> str:
    """The label of the tensor a record holds in its field `name` (or in its `tensors`): its owner (tensor_owner)
    and the field, 'generation P1-G-rep1 first_step_logits', 'cache_comparison 7 cached'."""
    return f"{tensor_owner(record)} {name}"


def saved_tensors(view) -> dict:
    """{label (tensor_label): {file, key, sha256}} of every tensor the run's records reference, as the records hash
    it."""
    found = {}
    for record in view.records:
        nested = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
        for name, value in [*record.items(), *nested.items()]:
            if isinstance(value, dict) and {"file", "key", "sha256"} <= set(value):
                found.setdefault(tensor_label(record, name), {k: value[k] for k in ("file", "key", "sha256")})
    return found


def deterministic_outputs(view) -> dict:
    """Everything the run computed that a second honest run must reproduce, with where it came from."""
    generation, generation_absent = _generation(view)
    timing, timing_absent = _timing(view)
    first_step, first_step_absent = _first_step(view)
    distributions = view.manifest.get("distributions") if isinstance(view.manifest.get("distributions"), dict) else {}
    specimen = view.specimen_spec()
    return {
        "schema": OUTPUTS_SCHEMA,
        "specimen": {"name": specimen.get("name"), "repo_id": specimen.get("repo_id"),
                     "revision": specimen.get("revision"), "synthetic": view.synthetic,
                     "weights_sha256": _weights_sha256(view)},
        "torch_version": distributions.get("torch"),
        "transformers_version": distributions.get("transformers"),
        "prompts": _inputs(view),
        "generation": generation,
        "timing": timing,
        "cache": _cache(view),
        "first_step": first_step,
        "batching": _batching(view),
        "tensors": saved_tensors(view),
        "absent": {"generation": generation_absent, "timing": timing_absent, "first_step": first_step_absent},
    }


def sampled_trials(outputs: dict) -> list[str]:
    """The trial ids whose ids came from the random generator (comparable only under the same torch version)."""
    return [trial_id for trial_id, trial in outputs.get("generation", {}).items() if trial.get("sampled")]


def describe(value: Any) -> str:
    """A short text of an output for a difference line: lists longer than 12 are cut with their length."""
    if isinstance(value, list) and len(value) > 12:
        return f"{value[:12]}... ({len(value)} items)"
    return repr(value)
