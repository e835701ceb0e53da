"""Re-execution in the grade: `grade --replay` (or a rubric that requires it) replays every deterministic part of a
run on the grader's own verified copy of the specimen (inferlab.recheck.replay is the engine, called, never
restated) and folds the result into the run's grade.

The replay and the course's run are folded alike (fold_comparison): each contradiction of the run with the
trusted outputs is an integrity problem naming the output and its first difference; a run that cannot be replayed
at all (its specimen is not one of this checkout's, the grader's copy fails verification against it) is one too,
saying why: the grader asked that every run be re-executed, and this one could not be. What could not be compared
(seeded sampling ids drawn by another torch or transformers) goes into the grade's not_checked, as the absence of a
replay does when none was asked for (grade.not_established).

The grader's copy is acquired offline (grading never opens the network) and loaded once per process and specimen
(GraderCopy): a class replays one run after another on the same model. What a replay computes does not depend on
the run: the protocol fixes the prompts, the seeds and every generation config, and the replay tokenizes the
prompts itself. So the model's calls are remembered (OnceModel): a call with the same inputs (and, for generate,
the same random generator state) is computed once per process and its output handed to every later run, which is
then compared with it as the first run was. A call that feeds a cache object is always computed again. The specimen
is --specimen NAME when given, else the one the run names, looked up in this checkout's artifacts/ only; the pins a
run recorded for a specimen this checkout does not know are never used, since the learner wrote them.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Optional


class OnceModel:
    """The grader's model, each of its computations made once per process: model(...) and model.generate(...)
    with the same inputs (every tensor by shape, dtype and bytes, every other argument by value, and for generate
    torch's random generator state) return the output computed the first time. A forward that is given a cache
    (past_key_values) changes that cache, so it is always computed. Everything else is the model's own."""

    def __init__(self, model):
        self._model = model
        self._outputs: dict = {}
        self.computed = self.reused = 0  # how many calls were computed, and how many handed an earlier output

    def __getattr__(self, name):
        return getattr(self._model, name)

    @staticmethod
    def _key(value):
        import torch

        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), str(value.dtype),
                    hashlib.sha256(value.detach().contiguous().cpu().numpy().tobytes()).hexdigest())
        if hasattr(value, "to_json_string"):  # a GenerationConfig: all its values
            return ("config", value.to_json_string(use_diff=False))
        if isinstance(value, (list, tuple)):
            return tuple(OnceModel._key(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, OnceModel._key(v)) for k, v in value.items()))
        return ("value", repr(value))

    def _once(self, call, key, args, kwargs):
        if key in self._outputs:
            self.reused += 1
            return self._outputs[key]
        self.computed += 1
        output = call(*args, **kwargs)
        self._outputs[key] = output
        return output

    def __call__(self, *args, **kwargs):
        if kwargs.get("past_key_values") is not None:
            self.computed += 1
            return self._model(*args, **kwargs)
        return self._once(self._model, ("forward", self._key(args), self._key(kwargs)), args, kwargs)

    def generate(self, *args, **kwargs):
        import torch

        state = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
        return self._once(self._model.generate, ("generate", state, self._key(args), self._key(kwargs)), args, kwargs)


class GraderCopyError(Exception):
    """The grader's own copy cannot be used (a usage error of the grader, exit 2): an unknown --specimen, or a
    copy that fails verification before any run is read."""


class GraderCopy:
    """The grader's verified copies of the specimen, each loaded once per process: {name: (spec, how, acquired,
    model, tokenizer)}, or the reason a name could not be acquired (so 40 runs do not try 40 times)."""

    def __init__(self, specimen: Optional[str] = None, artifacts: Optional[str] = None):
        self.specimen = specimen
        self.artifacts = None if artifacts is None else str(artifacts)
        self._loaded: dict[str, tuple] = {}
        self._failed: dict[str, str] = {}
        self.loads = 0  # how many models this process loaded (a test and the benchmark read it)

    def prepare(self, load: bool = True) -> None:
        """With --specimen NAME, acquire it now (and load it, unless the runs are graded in other processes, which
        load their own): a copy that cannot be used is the grader's error."""
        if self.specimen is None:
            return
        problem = self._load(self.specimen, load)
        if problem:
            raise GraderCopyError(problem)

    def _load(self, name: str, load: bool = True) -> Optional[str]:
        """Acquire (offline), verify and (unless load is False) load the specimen `name` once; the reason when it
        cannot be."""
        from inferlab.recheck.replay import load_model
        from inferlab.specimen import SpecimenError, acquire, load_spec

        if name in self._loaded:
            return None
        if name in self._failed:
            return self._failed[name]
        try:
            spec = load_spec(name)
        except SpecimenError as error:
            self._failed[name] = (f"the specimen {name!r} is not one of this checkout's specimens ({error}); the "
                                  "pins a run records are not used to fetch a copy")
            return self._failed[name]
        where = f"your copy in {self.artifacts}" if self.artifacts else "this checkout's project cache"
        try:
            acquired = acquire(spec, artifacts_dir=self.artifacts, offline=True)
            if not load:
                return None
            model, tokenizer = load_model(Path(acquired["directory"]), acquired["verification"])
        except (SpecimenError, OSError) as error:
            self._failed[name] = (f"the grader's copy of {name} ({where}) could not be acquired offline and "
                                  f"verified: {error}")
            return self._failed[name]
        self.loads += 1
        model = OnceModel(model)
        how = f"this checkout's artifacts/{name}.json ({acquired['acquisition']}: {acquired['directory']})"
        self._loaded[name] = (spec, how, acquired, model, tokenizer)
        return None

    def replay(self, view) -> dict:
        """The run replayed on the grader's copy and compared with it (inferlab.recheck.replay.replayed_on): {made,
        specimen, comparison, agree, rule, elapsed_s}, or {made: False, reason}."""
        from inferlab.recheck.elsewhere import replay_in_child, settings_to_match
        from inferlab.recheck.replay import replayed_on

        started = time.monotonic()
        name = self.specimen or view.specimen_spec().get("name")
        if not isinstance(name, str) or not name:
            return {"made": False, "reason": "the run names no specimen to replay it on"}
        problem = self._load(name)
        if problem:
            return {"made": False, "reason": problem}
        settings = settings_to_match(view.manifest)
        if settings is not None and view.directory is not None:  # torch takes kernel settings only at its start
            return replay_in_child(view.directory, name, self.artifacts, settings)
        spec, how, acquired, model, tokenizer = self._loaded[name]
        return replayed_on(view, model, tokenizer, spec, acquired["verification"], how, started)


class MadeHere:
    """The course's own run, graded where it was made (the Gradescope bundle): its outputs are the trusted ones, so a
    rubric's require_replay is met without replaying it, and the grade says so."""

    requirement_words = ("this is the course's own run, made here on the course's copy of the specimen: its outputs "
                         "are the trusted ones, so nothing of it is replayed")


class CourseRun:
    """A run the course made itself (`grade --against COURSE_RUN`, and the Gradescope bundle's own run): a claimed run
    is compared with it by the one comparison of inferlab.recheck.trusted, bit for bit when the two runs' recorded
    conditions match (inferlab.recheck.agreement), else within the reference's default tolerance, saying so."""

    requirement_words = ("the run's deterministic outputs were compared with the course's own run (a contradiction is "
                         "an integrity problem)")

    def __init__(self, directory, name: str = "the course's run"):
        from inferlab.grading.reference import make_reference
        from inferlab.reading.runview import RunView

        self.directory = Path(directory)
        self.view = RunView.read(self.directory)
        self.trusted = make_reference(self.view)
        self.name = name

    def fold(self, grade, view, rename: Optional[tuple[str, str]] = None) -> None:
        """Every contradiction of `view` with the course's run an integrity problem of `grade`."""
        from inferlab.grading.reference import DEFAULT_ATOL, DEFAULT_RTOL, mismatch
        from inferlab.recheck.agreement import allowance, conditions
        from inferlab.recheck.trusted import compare_trusted

        why = mismatch(view, self.trusted)
        if why:
            grade.integrity.append(f"against {self.name}: not comparable: {why.replace('the reference', self.name)}")
            grade.facts["against"] = {"course_run": str(self.directory), "compared": False}
            return
        rule = allowance(conditions(view.manifest), conditions(self.view.manifest), DEFAULT_ATOL, DEFAULT_RTOL,
                         ("the run", self.name))
        result = compare_trusted(view, self.trusted, rule, self.view, theirs=self.name)
        fold_comparison(grade, result, rule, (f"contradicts {self.name}: ", f"against {self.name}: "), self.name,
                        rename)
        grade.facts["against"] = {"course_run": str(self.directory), "compared": True, "exact": rule.exact,
                                  "contradictions": len(result.contradictions), "counts": result.compared}
        # The timings are a finding beside the course's run, never a check: no machine times alike twice.
        from inferlab.grading.timing_sides import side_by_side

        try:
            grade.findings += side_by_side(view, self.view).findings()
        except (ValueError, TypeError, KeyError) as error:  # a timing value no writer makes (verify names it)
            grade.not_checked.append(f"timings beside {self.name}: not shown: the timing records cannot be read "
                                     f"({type(error).__name__}: {error})")


def fold_comparison(grade, result, rule, prefixes: tuple[str, str], trusted: str,
                    rename: Optional[tuple[str, str]] = None) -> None:
    """A comparison with trusted outputs (inferlab.recheck.trusted.Comparison) folded into `grade`: each
    contradiction an integrity problem (prefixes[0]), a comparison that could not be exact and every output not
    compared under "Not checked", every other note a note (prefixes[1]), and when nothing contradicts, a note
    saying by which rule the run agrees."""
    lines = [line.replace(*rename) for line in result.contradictions] if rename else result.contradictions
    grade.integrity += [prefixes[0] + line for line in lines]
    inexact = rule.not_checked("the run", trusted)
    if inexact:
        grade.not_checked.append(prefixes[1] + inexact)
    for note in result.notes:
        (grade.not_checked if "not compared" in note else grade.notes).append(prefixes[1] + note)
    if not lines:
        grade.notes.append(f"{prefixes[1]}the run agrees with {trusted}, {rule.describe(trusted)} "
                           f"({result.compared.get('tensors', 0)} saved tensors "
                           f"{'by hash' if rule.exact else 'element by element'})")


def summary(result: dict) -> dict:
    """The replay as plain data for the grade's facts: made, specimen, agree, exact, seconds, how many outputs of
    each computation were compared (inferlab.recheck.trusted's counts) and how many contradictions were found."""
    if not result.get("made"):
        return {"made": False, "reason": result.get("reason")}
    return {"made": True, "specimen": result["specimen"], "agree": result["agree"],
            "exact": result["rule"].exact, "kernel_settings": result.get("settings"),
            "elapsed_s": round(result["elapsed_s"], 3), "compared": dict(result["comparison"].compared),
            "contradictions": len(result["comparison"].contradictions)}


def fold(grade, view, copy, rename: Optional[tuple[str, str]] = None) -> None:
    """The replay of `view` on `copy` (a GraderCopy) folded into `grade` as the course's run is (fold_comparison).
    Without one there is nothing to fold (grade.not_established has said 'replay: none made' in the grade's
    not_checked)."""
    if isinstance(copy, CourseRun):
        copy.fold(grade, view, rename)
        return
    if not isinstance(copy, GraderCopy):
        return
    result = copy.replay(view)
    grade.facts["replay"] = summary(result)
    if not result["made"]:
        reason = result["reason"].replace(*rename) if rename else result["reason"]
        grade.integrity.append(f"replay: not made: {reason}")
        return
    if result.get("settings"):
        grade.notes.append("replay: made in a process of its own under the run's kernel settings (" + ", ".join(
            f"{k}={v if v is not None else '(unset)'}" for k, v in sorted(result["settings"].items())) + ")")
    fold_comparison(grade, result["comparison"], result["rule"], ("replay: ", "replay: "), "the replay", rename)
    if not result["agree"] and not result["comparison"].contradictions:
        grade.integrity.append(f"replay: nothing of the run could be compared on the grader's copy of "
                               f"{result['specimen']}")
