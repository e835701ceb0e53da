"""Replay: every deterministic computation a run recorded, done again on the grader's own verified copy of the
specimen, and the run compared with what it gives.

What is redone: the prompts' token ids, the 26 generation trials (greedy, and seeded sampling with every random
generator reset as the experiment resets it), the raw first-step logits and each trial's processed first-step
scores, the matched-prefix comparison, the timing trials' ids (one loop per prompt and cache setting: the 6
trials of a combination are the same computation) and the batching calls. What they give is held as trusted
outputs, in the shape of inferlab.reading.deterministic.deterministic_outputs (the recomputed tensors in memory, by
the label of the run's tensor each stands for), and the run is compared with them by the one comparison of a
claimed run with trusted outputs, inferlab.recheck.trusted.compare_trusted, as a reference and the course's run
are: the replay has no comparison of its own. Its rule is bit for bit when the run's conditions are this
process's (inferlab.recheck.agreement: the same torch, CPU, kernel settings and threads), else the protocol's
declared tolerance, |a-b| <= atol + rtol*|b| with b the replayed value, the differing conditions said.

The computations are written here with plain transformers calls (from_pretrained under the protocol's controls,
model.generate, and the model's forward), never through inferlab.measure.sampling, decode_loop, cache_check or batching:
a fault in the experiment's own code path cannot agree with itself. The specimen is acquired and verified by
inferlab.specimen (a stand-in is built or reused in the project cache; --artifacts DIR is verified against the
pins). Nothing is written into the run. The work is bounded by the protocol's own counts (26 + 4 generate calls,
2 + 2m + 4 x 16 forwards) and stops at the protocol's session limit.
"""

from __future__ import annotations

import importlib.metadata
import random
import time
from pathlib import Path
from typing import Optional

import numpy

from inferlab import protocol
from inferlab.measure import near_tie
from inferlab.reading.deterministic import deterministic_outputs, first_step_entry, tensor_label, top_logits
from inferlab.reading.runview import RunView, not_a_run_reason, tensor_sha256
from inferlab.recheck.agreement import Allowance, allowance, conditions, this_process
from inferlab.recheck.trusted import Comparison, cache_reference_trial, compare_trusted

LIMIT_S = protocol.SESSION_LIMIT_S  # a replay is bounded like the experiment's session
NOT_COUNTED = ("sampled_not_compared", "near_tie_divergences")  # counts in Comparison.compared that compare nothing


class ReplayError(Exception):
    """The replay cannot start: not a run, an unknown specimen, or a copy that fails verification."""


class Arrays:
    """The replay's recomputed tensors, handed to the comparison as a trusted run's files are: by the label of the
    run's tensor each stands for."""

    def __init__(self):
        self.by_label: dict = {}

    def add(self, label: str, array) -> dict:
        """Keep an array (float32 numpy) under a label; its reference, as a record's: {file, key, sha256}."""
        self.by_label[label] = array
        return {"file": "the replay", "key": label, "sha256": tensor_sha256(array)}

    def verified_tensor(self, reference: dict):
        """The array kept under the reference's key (None when none was replayed)."""
        return self.by_label.get(reference.get("key"))


def agrees(result: Comparison) -> bool:
    """Whether the run agrees with the replay: no contradiction, and something compared."""
    return not result.contradictions and any(n for k, n in result.compared.items() if k not in NOT_COUNTED)


def replayed_step(logits) -> tuple[int, "near_tie.Step"]:
    """The greedy selection of one step's raw logits (vocab,) and its top two, in numpy: (id, Step)."""
    values = numpy.asarray(logits, dtype=numpy.float32).reshape(-1)  # (vocab,)
    selected = int(numpy.argmax(values))
    others = values.copy()
    others[selected] = -numpy.inf
    runner_up = int(numpy.argmax(others))
    return selected, near_tie.Step(float(values[selected]), float(others[runner_up]), runner_up)


def step_fields(selections: list) -> dict:
    """Greedy steps [(id, Step)] as a record holds them (near_tie.STEP_VALUES_FIELD and STEP_IDS_FIELD)."""
    return {near_tie.STEP_VALUES_FIELD: [[step.top, step.second] for _, step in selections],
            near_tie.STEP_IDS_FIELD: [[selected, step.runner_up] for selected, step in selections]}


def _greedy_config(tokens: dict, **overrides):
    """The protocol's complete greedy GenerationConfig, from scratch (nothing from the checkpoint is merged)."""
    from transformers import GenerationConfig

    return GenerationConfig(**protocol.GENERATION_FIXED, **protocol.CONDITIONS["G"].generate_kwargs(), **tokens,
                            **overrides)


class Replay:
    """The grader's model and tokenizer, the run's view, and the outputs replayed so far (`replayed`, in the shape
    of deterministic_outputs, with their arrays)."""

    def __init__(self, view: RunView, model, tokenizer, started: float, pins: Optional[dict] = None,
                 here: Optional[dict] = None):
        self.view = view
        tolerance = protocol.CACHE_TOLERANCE  # exact where the run's conditions are this process's
        self.rule = allowance(conditions(view.manifest), conditions(here or this_process()), tolerance.atol,
                              tolerance.rtol, ("the run", "the replay"))
        self.outputs = deterministic_outputs(view)
        self.model = model
        self.tokenizer = tokenizer
        self.started = started
        self.pins = pins  # the grader's copy's (copy_pins), compared with the run's too when given
        eos = tokenizer.eos_token_id
        # The pad id is the checkpoint's own, else its EOS id: the vocabulary is never extended.
        self.tokens = {"eos_token_id": eos, "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                       else eos, "bos_token_id": tokenizer.bos_token_id}
        self.replayed = {"torch_version": importlib.metadata.version("torch"),
                         "transformers_version": importlib.metadata.version("transformers"),
                         "prompts": {}, "generation": {}, "timing": {}, "cache": None, "first_step": {},
                         "batching": {}, "tensors": {}}
        self.arrays = Arrays()
        self.first_scores: dict = {}  # trial id -> its replayed first-step processed scores (vocab,)
        self.unreplayed: list[str] = []  # what could not be replayed: each a contradiction of the run

    def keep(self, label: str, array) -> None:
        """A replayed tensor, standing for the run's tensor of that label."""
        self.replayed["tensors"][label] = self.arrays.add(label, array)

    # --- the bound ------------------------------------------------------------------------------------

    def within_limit(self) -> bool:
        """False (and said once, as a contradiction) once the replay has run for the protocol's session limit."""
        if time.monotonic() - self.started <= LIMIT_S:
            return True
        stopped = f"stopped: the replay ran past the protocol's session limit of {LIMIT_S} s"
        if stopped not in self.unreplayed:
            self.unreplayed.append(stopped)
        return False

    # --- the computations -----------------------------------------------------------------------------

    def inputs(self) -> None:
        """The prompts tokenized without special tokens, as the protocol tokenizes them."""
        for prompt_id, text in {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}.items():
            ids = self.tokenizer(text, add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]
            self.replayed["prompts"][prompt_id] = [int(i) for i in ids]

    def prompt_tensor(self, prompt_id: str):
        """A prompt's replayed ids as a batch of one."""
        import torch

        return torch.tensor([self.replayed["prompts"][prompt_id]], dtype=torch.long)  # (1, T)

    def generation(self) -> None:
        """The 26 trials: model.generate with the protocol's config, each sampling trial after every generator
        the experiment seeds (torch, Python's random, NumPy's) is reset with its seed."""
        import torch
        from transformers import GenerationConfig

        for trial in protocol.generation_trials():
            if not self.within_limit():
                return
            condition = protocol.CONDITIONS[trial.condition]
            # every step's raw logits and processed scores, as the experiment asks for them
            config = GenerationConfig(**protocol.GENERATION_FIXED, **condition.generate_kwargs(), **self.tokens,
                                      output_logits=True, output_scores=True, return_dict_in_generate=True)
            input_ids = self.prompt_tensor(trial.prompt_id)  # (1, T)
            if condition.do_sample:
                torch.manual_seed(trial.seed)
                random.seed(trial.seed)
                numpy.random.seed(trial.seed)
            output = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                         generation_config=config, use_model_defaults=False)
            ids = output.sequences[0, input_ids.shape[1]:].tolist()  # sequences (1, T + n)
            self.first_scores[trial.test_id] = output.scores[0][0].float().numpy()  # (vocab,)
            entry = {"prompt_id": trial.prompt_id, "sampled": bool(condition.do_sample), "ids": ids}
            if not condition.do_sample:  # the raw logits of each step (n x (1, vocab)): its top two
                entry.update(step_fields([replayed_step(step[0].float().numpy()) for step in output.logits[:len(ids)]]))
            self.replayed["generation"][trial.test_id] = entry

    def first_step(self) -> None:
        """The raw first-step logits of each prompt (one plain forward over the prompt), standing for every saved
        tensor of that prompt: selection acts after the forward, so every condition saved the same vector. And each
        trial's processed scores from its replayed generate()'s first step."""
        keeps = protocol.first_step_trial_ids()
        saved = [r for r in self.view.kind("generation")
                 if r.get("trial_id") in keeps and r.get("status", "ok") == "ok"]
        for prompt_id in protocol.PROMPTS:
            mine = [r for r in saved if r.get("prompt_id") == prompt_id]
            if not mine or not self.within_limit():
                continue
            logits = self.model(input_ids=self.prompt_tensor(prompt_id), logits_to_keep=protocol.LOGITS_TO_KEEP
                                ).logits[0, -1].float().numpy()  # (vocab,), the last position's head as the run's
            for record in mine:
                self.keep(tensor_label(record, "first_step_logits"), logits)
                self.replayed["first_step"].setdefault(f"{prompt_id}/{record.get('condition')}", first_step_entry(
                    record.get("trial_id"), tensor_sha256(logits), logits))
                if record.get("trial_id") in self.first_scores:
                    self.keep(tensor_label(record, "first_step_scores"), self.first_scores[record["trial_id"]])

    def matched_prefix(self) -> None:
        """Prompt plus the first k ids of the run's continuation (the replayed reference trial's, where the run's
        is not a list of as many ids), k = 0..m-1: the last position's logits without a cache (a full forward) and
        with one (a prefill, then one fed id at a time)."""
        import torch
        from transformers import DynamicCache

        comparisons = self.view.kind("cache_comparison")
        reference = self.replayed["generation"].get(cache_reference_trial())
        if not self.outputs.get("cache") or not comparisons or reference is None:
            return
        replayed = reference["ids"][:protocol.CACHE_MAX_TARGET_TOKENS]
        # The run's own continuation is what its prefixes were fed (whether it is the replay's is compared apart).
        recorded = self.outputs["cache"].get("continuation")
        continuation = recorded if isinstance(recorded, list) and all(
            isinstance(i, int) for i in recorded) and len(recorded) == len(replayed) else replayed
        prompt = self.replayed["prompts"][protocol.CACHE_REFERENCE_TRIAL[0]]
        past, prefixes = DynamicCache(config=self.model.config), []
        for k, record in enumerate(comparisons[:len(continuation)]):
            if not self.within_limit():
                break
            prefix = prompt + continuation[:k]
            uncached = self.model(input_ids=torch.tensor([prefix]), use_cache=False,
                                  logits_to_keep=protocol.LOGITS_TO_KEEP).logits[0, -1]  # (vocab,)
            fed = prefix if k == 0 else continuation[k - 1:k]
            output = self.model(input_ids=torch.tensor([fed]), past_key_values=past, use_cache=True,
                                logits_to_keep=protocol.LOGITS_TO_KEEP)
            past = output.past_key_values
            cached = output.logits[0, -1]  # (vocab,)
            top = torch.topk(uncached.double(), 2).values
            prefixes.append({"prefix_length": len(prefix), "argmax_uncached": int(uncached.argmax()),
                             "argmax_cached": int(cached.argmax()), "top2_margin_uncached": float(top[0] - top[1]),
                             "top2_uncached": top_logits(uncached.float().numpy(), 2)})
            for name, mine in (("uncached", uncached), ("cached", cached)):
                self.keep(tensor_label(record, name), mine.float().numpy())
        self.replayed["cache"] = {"continuation": replayed, "fed": list(continuation), "prefixes": prefixes}

    def timing(self) -> None:
        """Each (prompt, cache on or off) of the timing schedule: exactly 16 greedy selections, EOS not a stop,
        one forward each (cache on: one new id into the cache; cache off: the whole sequence again), standing for
        every trial of that combination."""
        import torch
        from transformers import DynamicCache

        combinations = list(dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()))
        for prompt_id, use_cache in combinations:
            if not self.within_limit():
                break
            sequence = list(self.replayed["prompts"][prompt_id])
            past = DynamicCache(config=self.model.config) if use_cache else None
            fed, selections = sequence, []
            for _ in range(protocol.TIMING_NEW_TOKENS):
                output = self.model(input_ids=torch.tensor([fed]), past_key_values=past, use_cache=use_cache,
                                    logits_to_keep=protocol.LOGITS_TO_KEEP)
                past = output.past_key_values if use_cache else None
                selections.append(replayed_step(output.logits[0, -1].float().numpy()))  # (vocab,)
                sequence.append(selections[-1][0])
                fed = sequence[-1:] if use_cache else sequence
            for trial in protocol.timing_schedule():
                if (trial.prompt_id, trial.use_cache) == (prompt_id, use_cache):
                    self.replayed["timing"][trial.test_id] = {"prompt_id": prompt_id, "use_cache": use_cache,
                                                              "ids": [i for i, _ in selections],
                                                              **step_fields(selections)}

    def batching(self) -> None:
        """Each recorded batching call: its requests' prompts left-padded with the pad id, one greedy
        model.generate, its raw ids per row and its first step's logits."""
        import torch

        config = _greedy_config(self.tokens, output_logits=True, return_dict_in_generate=True)
        pad = self.tokens["pad_token_id"]
        for call in (r for r in self.view.kind("batching") if r.get("record_type") == "call"):
            requests = call.get("request_ids")
            if not isinstance(requests, list) or not all(r in self.replayed["prompts"] for r in requests):
                self.unreplayed.append(f"batching call {call.get('call_index')}: requests {requests!r} are not the "
                                       "protocol's, so it cannot be replayed")
                continue
            if not self.within_limit():
                break
            rows = [self.replayed["prompts"][r] for r in requests]
            width = max(map(len, rows))
            input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (B, T_max), left-padded
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # (B, T_max)
            output = self.model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config,
                                         use_model_defaults=False)
            self.replayed["batching"][str(call.get("call_index"))] = {
                "request_ids": requests, "generated_ids_raw": output.sequences[:, width:].tolist()}
            self.keep(tensor_label(call, "first_step_logits"), output.logits[0].float().numpy())  # (B, vocab)

    def compare(self) -> Comparison:
        """The run against what has been replayed so far, by the one comparison (compare_trusted), the replay the
        trusted side; what could not be replayed is a contradiction too."""
        trusted = {"outputs": self.replayed, **({"specimen": self.pins} if self.pins is not None else {})}
        result = compare_trusted(self.view, trusted, self.rule, self.arrays, theirs="the replay")
        result.contradictions += self.unreplayed
        return result

    def run(self) -> Comparison:
        """Every computation, in the protocol's order, then the comparison."""
        import torch

        with torch.inference_mode():
            for computation in (self.inputs, self.generation, self.first_step, self.matched_prefix, self.timing,
                                self.batching):
                computation()
        return self.compare()


# --- the grader's copy ---------------------------------------------------------------------------------


def grader_spec(view: RunView, specimen: Optional[str]):
    """The spec the grader's copy is verified against: --specimen NAME's, else this checkout's spec of the run's
    specimen, else the pins the run recorded (a specimen this checkout does not know); with a line saying which."""
    import dataclasses

    from inferlab.specimen import SpecimenError, SpecimenSpec, load_spec, spec_problems

    recorded = view.specimen_spec()
    name = specimen or recorded.get("name")
    try:
        if specimen is not None:  # whether it can be built here, acquire says once it is known to be the run's
            return load_spec(specimen), f"--specimen {specimen} (this checkout's artifacts/{specimen}.json)"
        return load_spec(name), f"this checkout's artifacts/{name}.json (the run's specimen)"
    except SpecimenError as error:
        if specimen is not None:
            raise ReplayError(str(error)) from error
    fields = {f.name for f in dataclasses.fields(SpecimenSpec)}
    try:
        spec = SpecimenSpec(**{key: (tuple(value) if isinstance(value, list) and key in ("files", "optional_files")
                                     else value) for key, value in recorded.items() if key in fields})
    except TypeError as error:
        raise ReplayError(f"the run's specimen {name!r} is not in this checkout, and the run's record of its pins "
                          f"is incomplete ({error})") from error
    problems = spec_problems(spec)
    if problems:
        raise ReplayError(f"the run's specimen {name!r} is not in this checkout, and its recorded pins are not a "
                          f"valid spec: {'; '.join(problems)}")
    return spec, f"the pins the run recorded for {name!r} (this checkout has no artifacts/{name}.json)"


def copy_pins(spec, verification: dict) -> dict:
    """The grader's copy as trusted pins (inferlab.recheck.trusted.pins' shape): its spec's name and revision, and
    every allowlisted file's size and SHA-256 as the copy's verification found them (None, None where absent)."""
    files = {row["name"]: {"size": row.get("size"), "sha256": row.get("sha256")}
             for row in verification.get("files", []) if isinstance(row.get("name"), str)}
    return {"name": spec.name, "revision": spec.revision, "files": dict(sorted(files.items()))}


def refuse_another_specimen(view: RunView, spec, how: str) -> None:
    """ReplayError (nothing loaded) when the specimen the grader gives is not the run's, by name or revision."""
    recorded = view.specimen_spec()
    theirs = (recorded.get("name"), recorded.get("revision"))
    if theirs != (spec.name, spec.revision):
        raise ReplayError(f"the run's specimen is {theirs[0]!r} (revision {theirs[1]}), and the copy to replay it on "
                          f"is {spec.name!r} (revision {spec.revision}; {how}): a replay needs the run's own "
                          f"specimen, so nothing was loaded")


def load_model(directory: Path, verification: dict):
    """The model and tokenizer from the verified copy, under the protocol's controls, with plain transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inferlab.measure.loading import verified_copy

    torch.set_num_threads(protocol.INTRA_OP_THREADS)
    try:
        torch.set_num_interop_threads(protocol.INTER_OP_THREADS)
    except RuntimeError:  # already set in this process (only once is allowed); the intra-op count decides here
        pass
    with verified_copy(directory, verification) as private:  # each file re-hashed as it is copied, then loaded
        model = AutoModelForCausalLM.from_pretrained(
            private, dtype=getattr(torch, protocol.TORCH_DTYPE), attn_implementation=protocol.ATTN_IMPLEMENTATION,
            trust_remote_code=False, use_safetensors=True, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(private, local_files_only=True, trust_remote_code=False)
    return model.eval(), tokenizer


def replayed_on(view: RunView, model, tokenizer, spec, verification: dict, how: str, started: float) -> dict:
    """The run replayed on a loaded copy and compared with it: {made, specimen, comparison, agree, rule,
    elapsed_s}."""
    replay = Replay(view, model, tokenizer, started, copy_pins(spec, verification))
    result = replay.run()
    result.notes.insert(0, f"specimen: the grader's copy verified against {how}")
    return {"made": True, "specimen": spec.name, "comparison": result, "agree": agrees(result), "rule": replay.rule,
            "elapsed_s": time.monotonic() - started}


def replay_run(run_dir, *, specimen: Optional[str] = None, artifacts: Optional[str] = None,
               offline: bool = False) -> dict:
    """Replay a run on the grader's copy: {made, specimen, comparison, agree, rule, elapsed_s, acquisition,
    directory}. The copy's pins are compared first: only when they are the run's is the model loaded.

    Raises ReplayError when it cannot start (not a run, an unknown specimen, a copy that fails verification)."""
    from inferlab.specimen import SpecimenError, acquire

    started = time.monotonic()
    reason = not_a_run_reason(Path(run_dir))
    if reason:
        raise ReplayError(reason)
    view = RunView.read(Path(run_dir))
    spec, how = grader_spec(view, specimen)
    refuse_another_specimen(view, spec, how)  # before anything is acquired or loaded
    try:
        acquired = acquire(spec, artifacts_dir=artifacts, offline=offline)
    except SpecimenError as error:
        raise ReplayError(f"the grader's copy could not be acquired and verified: {error}") from error
    where = {"acquisition": acquired["acquisition"], "directory": acquired["directory"]}
    pinned = compare_trusted(view, {"specimen": copy_pins(spec, acquired["verification"])}, Allowance(0.0, 0.0),
                             theirs="the grader's copy")
    if not pinned.contradictions:  # the copy's files are the ones the run recorded: only then is the model loaded
        model, tokenizer = load_model(Path(acquired["directory"]), acquired["verification"])
        return {**replayed_on(view, model, tokenizer, spec, acquired["verification"], how, started), **where}
    pinned.notes += [f"specimen: the grader's copy verified against {how}", "nothing else was replayed and no model "
                     "was loaded: the grader's copy is not the files the run recorded"]
    return {"made": True, "specimen": spec.name, "comparison": pinned, "agree": False, "rule": None,
            "elapsed_s": time.monotonic() - started, **where}
