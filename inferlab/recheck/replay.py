"""Replay: every deterministic computation a run recorded, done again on the grader's own verified copy of the
specimen, and compared with the records.

What is redone: the prompts' token ids, the 26 generation trials (greedy, and seeded sampling with every random
generator reset as the experiment resets it), the raw first-step logits and each trial's processed first-step
scores, the matched-prefix comparison, the timing trials' ids (one loop per prompt and cache setting: the 6
trials of a combination are the same computation) and the batching calls. Ids must agree exactly; logits bit for
bit when the run's conditions are this process's (inferlab.recheck.agreement: the same torch, CPU, kernel
settings and threads), else within the protocol's declared tolerance, |a-b| <= atol + rtol*|b| with b the replayed
value, the differing conditions said. Seeded sampling ids are compared only where the torch that drew them is the
installed one (another torch may draw other numbers from the same seed); elsewhere they are
listed, not counted. Greedy ids (generation, the matched prefix's continuation, the timing trials) follow the
near-tie rule of inferlab.measure.near_tie, the one a reference uses: a first difference at a near tie of either side is
a note with the step and both margins, and the ids after it are not compared. Every difference is worded by
inferlab.recheck.trusted's lines (exact_line, greedy_lines), as a reference's and the course run's are.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy

from inferlab import protocol
from inferlab.measure import near_tie
from inferlab.reading.deterministic import deterministic_outputs, describe
from inferlab.reading.runview import RunView, not_a_run_reason
from inferlab.recheck.agreement import Allowance, allowance, array_difference, conditions, this_process
from inferlab.recheck.trusted import cache_reference_trial, compare_scores, edge_note, exact_line, greedy_lines

LIMIT_S = protocol.SESSION_LIMIT_S  # a replay is bounded like the experiment's session


class ReplayError(Exception):
    """The replay cannot start: not a run, an unknown specimen, or a copy that fails verification."""


@dataclass
class Part:
    """One computation replayed: how many recorded outputs were compared, each disagreement, and what was not
    compared (with why)."""

    name: str
    compared: int = 0
    differences: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    rule: Allowance = field(default_factory=lambda: Allowance(protocol.CACHE_TOLERANCE.atol,
                                                              protocol.CACHE_TOLERANCE.rtol))

    @property
    def agrees(self) -> bool:
        """Whether every compared output agreed (a part that compared nothing agrees with nothing: False)."""
        return not self.differences and self.compared > 0

    def check(self, what: str, recorded, replayed) -> bool:
        """One exact comparison; a difference names what and both values (trusted.exact_line)."""
        self.compared += 1
        line = exact_line(what, recorded, replayed, ("the run", "the replay"))
        if line:
            self.differences.append(line)
        return line is None

    def greedy(self, what: str, recorded: dict, replayed_ids: list, replayed_steps: list) -> None:
        """Greedy ids by the near-tie rule (inferlab.measure.near_tie), the replay the trusted side and the protocol's
        declared tolerance its allowance, worded as every trusted comparison words it (trusted.greedy_lines)."""
        self.compared += 1
        found = near_tie.compare_greedy(recorded.get("ids") or [], replayed_ids, near_tie.steps_of(recorded),
                                        replayed_steps, self.rule.atol, self.rule.rtol)
        differences, notes = greedy_lines(what, found, recorded.get("ids") or [], replayed_ids,
                                          self.rule.describe("the replayed value"), ("the run", "the replay"))
        self.differences += differences
        self.notes += notes

    def close(self, what: str, recorded, replayed) -> None:
        """One comparison of numbers or arrays by the part's rule (bit for bit, or within the declared tolerance
        with b the replayed value): a difference names the first element that differs, recorded against replayed."""
        self.compared += 1
        if recorded is None:
            self.differences.append(f"{what}: the run's saved tensor is missing or not as its record says")
            return
        found = array_difference(recorded, replayed, self.rule)
        if found:
            self.differences.append(f"{what}: recorded against replayed, {found}")

    def scores(self, what: str, trial_id: str, recorded, replayed: tuple) -> None:
        """A trial's processed first-step scores against the replayed ones (trusted.compare_scores, with the
        replayed raw logits deciding where top-p draws its line)."""
        self.compared += 1
        if recorded is None:
            self.differences.append(f"{what}: the run's saved tensor is missing or not as its record says")
            return
        found, moved = compare_scores(recorded, replayed[0], replayed[1], trial_id, self.rule)
        if found:
            self.differences.append(f"{what}: recorded against replayed, {found}")
        if moved:
            self.notes.append(f"{what}: {edge_note(moved)}")


def replayed_step(logits) -> tuple[int, "near_tie.Step"]:
    """The greedy selection of one step's raw logits (vocab,) and its top two, in numpy: (id, Step)."""
    values = numpy.asarray(logits, dtype=numpy.float32).reshape(-1)  # (vocab,)
    selected = int(numpy.argmax(values))
    others = values.copy()
    others[selected] = -numpy.inf
    runner_up = int(numpy.argmax(others))
    return selected, near_tie.Step(float(values[selected]), float(others[runner_up]), runner_up)


def _greedy_config(tokens: dict, **overrides):
    """The protocol's complete greedy GenerationConfig, from scratch (nothing from the checkpoint is merged)."""
    from transformers import GenerationConfig

    return GenerationConfig(**protocol.GENERATION_FIXED, **protocol.CONDITIONS["G"].generate_kwargs(), **tokens,
                            **overrides)


class Replay:
    """The grader's model and tokenizer, the run's view and outputs, and the parts as they are replayed."""

    def __init__(self, view: RunView, model, tokenizer, started: float, here: Optional[dict] = None):
        self.view = view
        tolerance = protocol.CACHE_TOLERANCE  # exact where the run's conditions are this process's
        self.rule = allowance(conditions(view.manifest), conditions(here or this_process()), tolerance.atol,
                              tolerance.rtol, ("the run", "the replay"))
        self.outputs = deterministic_outputs(view)
        self.model = model
        self.tokenizer = tokenizer
        self.started = started
        self.parts: list[Part] = []
        eos = tokenizer.eos_token_id
        # The pad id is the checkpoint's own, else its EOS id: the vocabulary is never extended.
        self.tokens = {"eos_token_id": eos, "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                       else eos, "bos_token_id": tokenizer.bos_token_id}
        self.prompt_ids: dict[str, list[int]] = {}
        self.greedy: dict[str, list[int]] = {}  # trial id -> the replayed ids of every greedy trial
        self.greedy_steps: dict[str, list] = {}  # trial id -> the replayed top two of each of its steps
        self.first_scores: dict[str, tuple] = {}  # trial id -> its replayed first-step (scores, raw logits)

    def part(self, name: str) -> Part:
        """A part compared by the replay's rule."""
        return Part(name, rule=self.rule)

    # --- the bound ------------------------------------------------------------------------------------

    def within_limit(self, part: Part) -> bool:
        """False (and said in the part) once the replay has run for the protocol's session limit."""
        if time.monotonic() - self.started <= LIMIT_S:
            return True
        part.differences.append(f"stopped: the replay ran past the protocol's session limit of {LIMIT_S} s")
        return False

    def saved(self, reference):
        """A tensor the run saved, only if it matches its record's SHA-256 (else None: a difference)."""
        return self.view.verified_tensor(reference) if isinstance(reference, dict) else None

    # --- the parts ------------------------------------------------------------------------------------

    def inputs(self) -> Part:
        """The prompts tokenized without special tokens, as the protocol tokenizes them."""
        part = self.part("inputs")
        recorded = self.outputs["prompts"]
        for prompt_id, text in {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}.items():
            ids = self.tokenizer(text, add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]
            self.prompt_ids[prompt_id] = [int(i) for i in ids]
            if prompt_id in recorded:
                part.check(f"{prompt_id} token ids", recorded[prompt_id], self.prompt_ids[prompt_id])
            else:
                part.notes.append(f"{prompt_id}: no input record")
        return part

    def prompt_tensor(self, prompt_id: str):
        """A prompt's replayed ids as a batch of one."""
        import torch

        return torch.tensor([self.prompt_ids[prompt_id]], dtype=torch.long)  # (1, T)

    def generation(self) -> tuple[Part, Part]:
        """The 26 trials: model.generate with the protocol's config, each sampling trial after every generator
        the experiment seeds (torch, Python's random, NumPy's) is reset with its seed."""
        import torch
        from transformers import GenerationConfig

        greedy, sampled = self.part("generation (greedy)"), self.part("generation (seeded sampling)")
        recorded, absent = self.outputs["generation"], self.outputs["absent"]["generation"]
        installed = importlib.metadata.version("torch")
        same_torch = installed == self.outputs.get("torch_version")
        if not same_torch:
            sampled.notes.append(f"not counted: the run's torch is {self.outputs.get('torch_version')}, this one "
                                 f"{installed}; the same seed may draw other numbers")
        for trial in protocol.generation_trials():
            condition = protocol.CONDITIONS[trial.condition]
            part = sampled if condition.do_sample else greedy
            if not self.within_limit(part):
                return greedy, sampled
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
            # the first step's processed scores and raw logits, each (vocab,)
            self.first_scores[trial.test_id] = (output.scores[0][0].float().numpy(),
                                                output.logits[0][0].float().numpy())
            if not condition.do_sample:
                self.greedy[trial.test_id] = ids
                # the raw logits of each step (n x (1, vocab)): the step's top two, beside the selected id
                self.greedy_steps[trial.test_id] = [replayed_step(step[0].float().numpy())[1]
                                                    for step in output.logits[:len(ids)]]
            if trial.test_id not in recorded:
                part.notes.append(f"{trial.test_id}: not in the run ({absent.get(trial.test_id, 'no record')})")
            elif condition.do_sample and not same_torch:
                agreed = recorded[trial.test_id]["ids"] == ids
                part.notes.append(f"{trial.test_id}: {'the same ids' if agreed else 'other ids'} (not counted)")
            elif condition.do_sample:
                part.check(f"{trial.test_id} ids", recorded[trial.test_id]["ids"], ids)
            else:
                part.greedy(trial.test_id, recorded[trial.test_id], ids, self.greedy_steps[trial.test_id])
        return greedy, sampled

    def first_step(self) -> Part:
        """The raw first-step logits of each prompt (one plain forward over the prompt) against every saved
        tensor of that prompt: selection acts after the forward, so every condition saved the same vector. And each
        trial's saved processed scores against its replayed generate()'s first scores (trusted.compare_scores)."""
        part = self.part("first-step logits")
        saved = [r for r in self.view.kind("generation") if isinstance(r.get("first_step_logits"), dict)
                 and r.get("status", "ok") == "ok"]
        for prompt_id in protocol.PROMPTS:
            mine = [r for r in saved if r.get("prompt_id") == prompt_id]
            if not mine or not self.within_limit(part):
                continue
            logits = self.model(input_ids=self.prompt_tensor(prompt_id), logits_to_keep=protocol.LOGITS_TO_KEEP
                                ).logits[0, -1].float().numpy()  # (vocab,), the last position's head as the run's
            for record in mine:
                recorded = self.saved(record["first_step_logits"])
                reference = record["first_step_logits"]
                what = (f"{prompt_id}/{record.get('condition')} ({record.get('trial_id')}: "
                        f"{reference.get('file')}[{reference.get('key')}])")
                part.close(f"{what} raw logits", recorded, logits)
                if recorded is not None:
                    part.check(f"{what} argmax", int(numpy.argmax(recorded)), int(numpy.argmax(logits)))
                scores = record.get("first_step_scores")
                if isinstance(scores, dict) and record.get("trial_id") in self.first_scores:
                    part.scores(f"{what} processed scores ({scores.get('file')}[{scores.get('key')}])",
                                record["trial_id"], self.saved(scores), self.first_scores[record["trial_id"]])
        if not saved:
            part.notes.append("the run saved no first-step logits")
        return part

    def matched_prefix(self) -> Part:
        """Prompt plus the first k ids of the replayed reference trial, k = 0..m-1: the last position's logits
        without a cache (a full forward) and with one (a prefill, then one fed id at a time)."""
        import torch
        from transformers import DynamicCache

        part = self.part("matched prefix")
        cache = self.outputs.get("cache")
        comparisons = self.view.kind("cache_comparison")
        prompt_id, reference = protocol.CACHE_REFERENCE_TRIAL[0], cache_reference_trial()
        if not cache or not comparisons or reference not in self.greedy:
            part.notes.append("the run holds no matched-prefix comparison")
            return part
        m = protocol.CACHE_MAX_TARGET_TOKENS
        replayed = self.greedy[reference][:m]
        run_trial = (self.outputs["generation"].get(reference) or {})
        recorded = {"ids": cache.get("continuation"), **{k: (v[:m] if isinstance(v, list) else v) for k, v in
                                                          run_trial.items() if k.startswith("step_top2")}}
        part.greedy("continuation (the reference trial's first ids)", recorded, replayed,
                    self.greedy_steps.get(reference, [])[:m])
        # The run's own continuation is what its prefixes were fed: replayed as it is (a difference is said above).
        recorded_ids = cache.get("continuation")
        continuation = recorded_ids if isinstance(recorded_ids, list) and all(
            isinstance(i, int) for i in recorded_ids) and len(recorded_ids) == len(replayed) else replayed
        prompt = self.prompt_ids[prompt_id]
        past = DynamicCache(config=self.model.config)
        for k, record in enumerate(comparisons[:len(continuation)]):
            if not self.within_limit(part):
                break
            prefix = prompt + continuation[:k]
            uncached = self.model(input_ids=torch.tensor([prefix]), use_cache=False,
                                  logits_to_keep=protocol.LOGITS_TO_KEEP).logits[0, -1]  # (vocab,)
            fed = prefix if k == 0 else continuation[k - 1:k]
            output = self.model(input_ids=torch.tensor([fed]), past_key_values=past, use_cache=True,
                                logits_to_keep=protocol.LOGITS_TO_KEEP)
            past = output.past_key_values
            cached = output.logits[0, -1]  # (vocab,)
            what = f"prefix length {len(prefix)}"
            part.check(f"{what} prefix length", record.get("prefix_length"), len(prefix))
            part.check(f"{what} argmax uncached", record.get("argmax_uncached"), int(uncached.argmax()))
            part.check(f"{what} argmax cached", record.get("argmax_cached"), int(cached.argmax()))
            top = torch.topk(uncached.double(), 2).values
            part.close(f"{what} top-two margin (uncached)", record.get("top2_margin_uncached"), float(top[0] - top[1]))
            tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
            for name, mine in (("uncached", uncached), ("cached", cached)):
                part.close(f"{what} {name} logits", self.saved(tensors.get(name)), mine.float().numpy())
        return part

    def timing(self) -> Part:
        """Each (prompt, cache on or off) of the timing schedule: exactly 16 greedy selections, EOS not a stop,
        one forward each (cache on: one new id into the cache; cache off: the whole sequence again), against the
        ids of every recorded trial of that combination."""
        import torch
        from transformers import DynamicCache

        part = self.part("timing trials' ids")
        recorded, absent = self.outputs["timing"], self.outputs["absent"]["timing"]
        combinations = list(dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()))
        for prompt_id, use_cache in combinations:
            if not self.within_limit(part):
                break
            sequence = list(self.prompt_ids[prompt_id])
            past = DynamicCache(config=self.model.config) if use_cache else None
            fed, steps = sequence, []
            for _ in range(protocol.TIMING_NEW_TOKENS):
                output = self.model(input_ids=torch.tensor([fed]), past_key_values=past, use_cache=use_cache,
                                    logits_to_keep=protocol.LOGITS_TO_KEEP)
                past = output.past_key_values if use_cache else None
                selected, step = replayed_step(output.logits[0, -1].float().numpy())  # (vocab,)
                sequence.append(selected)
                steps.append(step)
                fed = sequence[-1:] if use_cache else sequence
            ids = sequence[len(self.prompt_ids[prompt_id]):]
            for trial in protocol.timing_schedule():
                if (trial.prompt_id, trial.use_cache) != (prompt_id, use_cache):
                    continue
                if trial.test_id in recorded:
                    part.greedy(trial.test_id, recorded[trial.test_id], ids, steps)
                else:
                    part.notes.append(f"{trial.test_id}: not in the run ({absent.get(trial.test_id, 'no record')})")
        return part

    def batching(self) -> Part:
        """Each recorded batching call: its requests' prompts left-padded with the pad id, one greedy
        model.generate, its raw ids per row and its first step's logits."""
        import torch

        part = self.part("batching")
        calls = [r for r in self.view.kind("batching") if r.get("record_type") == "call"]
        if not calls:
            part.notes.append("the run holds no batching call (the optional extension was left out or did not run)")
            return part
        config = _greedy_config(self.tokens, output_logits=True, return_dict_in_generate=True)
        pad = self.tokens["pad_token_id"]
        for call in calls:
            requests = call.get("request_ids")
            if not isinstance(requests, list) or not all(r in self.prompt_ids for r in requests):
                part.differences.append(f"call {call.get('call_index')}: requests {requests!r} are not the protocol's")
                continue
            if not self.within_limit(part):
                break
            rows = [self.prompt_ids[r] for r in requests]
            width = max(map(len, rows))
            input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (B, T_max), left-padded
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # (B, T_max)
            output = self.model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config,
                                         use_model_defaults=False)
            where = f"call {call.get('call_index')} {requests}"
            part.check(f"{where} raw ids", call.get("generated_ids_raw"), output.sequences[:, width:].tolist())
            part.close(f"{where} first-step logits", self.saved(call.get("first_step_logits")),
                       output.logits[0].float().numpy())  # (B, vocab)
        return part

    def run(self) -> list[Part]:
        """Every part, in the protocol's order."""
        import torch

        with torch.inference_mode():
            self.parts = [self.inputs(), *self.generation(), self.first_step(), self.matched_prefix(), self.timing(),
                          self.batching()]
        return self.parts


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


def specimen_part(view: RunView, spec, verification: dict, how: str) -> Part:
    """The run's specimen against the grader's copy: its name, revision and pinned file hashes."""
    part = Part("specimen")
    part.notes.append(f"verified against {how}")
    recorded = view.specimen_spec()
    part.check("specimen name", recorded.get("name"), spec.name)
    part.check("revision", recorded.get("revision"), spec.revision)
    copy = {row["name"]: row.get("sha256") for row in verification.get("files", []) if row.get("present")}
    for record in view.kind("artifact_file"):
        if record.get("name") in copy:
            part.check(f"{record['name']} sha256", record.get("sha256"), copy[record["name"]])
    return part


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


def replay_run(run_dir, *, specimen: Optional[str] = None, artifacts: Optional[str] = None,
               offline: bool = False) -> dict:
    """Replay a run on the grader's copy: {parts: [Part], agree, rule, elapsed_s, acquisition, directory}.

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
    parts, rule = [specimen_part(view, spec, acquired["verification"], how)], None
    if parts[0].agrees:  # the copy's files are the ones the run recorded: only then is the model loaded
        model, tokenizer = load_model(Path(acquired["directory"]), acquired["verification"])
        replay = Replay(view, model, tokenizer, started)
        parts, rule = parts + replay.run(), replay.rule
    else:
        parts[0].notes.append("nothing else was replayed and no model was loaded: the grader's copy is not the files "
                              "the run recorded")
    counted = [p for p in parts if p.compared or p.differences]
    return {"parts": parts, "agree": bool(counted) and all(p.agrees for p in counted), "rule": rule,
            "elapsed_s": time.monotonic() - started, "acquisition": acquired["acquisition"],
            "directory": acquired["directory"], "specimen": spec.name}

