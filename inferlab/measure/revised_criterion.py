"""A justified revised cache criterion: parsed from the command line, evaluated beside the declared one.

The protocol declares |a-b| <= 1e-5 + 1e-4*|b| before any error is seen and never relaxes it. A learner
who has found, and can justify, a reason for another bound may name it with
``--revised-cache-criterion ATOL,RTOL --justification TEXT``. The run then records a second, labelled
evaluation under it; the declared criterion and its verdict stay exactly as they are. After the run,
``inferlab revise RUN_DIR --cache-criterion ATOL,RTOL --justification TEXT`` (inferlab.recheck.revise) judges the
saved tensors again and keeps the result as an addendum.

Both refuse what could not be a criterion at all, through the same parser and checks: RTOL >= 1 (a cached
vector of zeros would then pass against any uncached one, |0-b| = |b| <= RTOL*|b|) and a justification
without substance (fewer than MIN_WORDS words of two letters or more, or fewer than MIN_DISTINCT_WORDS
different ones: "x" says nothing; whether the reason holds is for a person to judge). `revise`, which has the
saved logits, also refuses a criterion vacuous for them (vacuous_reason: every cached vector within the range
the run's own logits span would pass at every prefix); the run's option is parsed before any logit exists, so
there the rule is the parser's.

Both go through the same two functions: judge() (one prefix's logits under a tolerance, in numpy float64,
the arithmetic of cache_check.compare_vectors) and evaluate() (the shape recorded: a revised verdict per
prefix, and a summary). This module has no torch import: the plugin uses it while parsing options, and
revise runs without torch.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from inferlab.protocol import Tolerance

LABEL = ("revised criterion, supplied by the learner with a justification; evaluated beside the declared "
         "criterion, whose verdict it does not change")


MIN_WORDS = 6
MIN_DISTINCT_WORDS = 4
WORD = re.compile(r"[^\W\d_]{2,}")  # a run of two letters or more


class RevisedCriterionError(argparse.ArgumentTypeError):
    """A bad --revised-cache-criterion value or a missing --justification; the message names the value."""


@dataclass(frozen=True)
class CriterionOption:
    """The parsed ATOL,RTOL of --revised-cache-criterion, with the text as typed."""

    atol: float
    rtol: float
    text: str

    @property
    def tolerance(self) -> Tolerance:
        return Tolerance(atol=self.atol, rtol=self.rtol)


def parse_criterion(text: str) -> CriterionOption:
    """Parse "ATOL,RTOL" (two finite numbers >= 0); RevisedCriterionError naming the value otherwise."""
    expected = "ATOL,RTOL: two finite numbers >= 0 separated by one comma (for example 1e-4,1e-3)"
    parts = text.split(",")
    if len(parts) != 2:
        raise RevisedCriterionError(f"expected {expected}, actual {text!r} ({len(parts)} part(s))")
    values = []
    for name, part in zip(("ATOL", "RTOL"), parts):
        try:
            value = float(part)
        except ValueError:
            raise RevisedCriterionError(f"expected {expected}, actual {text!r} ({name} {part!r} is not a number)") from None
        if not math.isfinite(value) or value < 0:
            raise RevisedCriterionError(f"expected {expected}, actual {text!r} ({name} {part!r} is not finite and >= 0)")
        values.append(value)
    if values[1] >= 1:
        raise RevisedCriterionError(f"expected RTOL below 1, actual {text!r}: with RTOL >= 1 a cached vector of "
                                    f"zeros passes against any uncached one (|0-b| = |b| <= RTOL*|b|), so the "
                                    f"criterion could not detect a cache fault")
    return CriterionOption(atol=values[0], rtol=values[1], text=text)


def justification_problem(text: Optional[str]) -> Optional[str]:
    """Why a justification is too thin to be kept (None when it has MIN_WORDS words, MIN_DISTINCT_WORDS of them
    different): a check of substance only, never of whether the reason is right."""
    words = [word.lower() for word in WORD.findall(text or "")]
    if len(words) >= MIN_WORDS and len(set(words)) >= MIN_DISTINCT_WORDS:
        return None
    return (f"expected a sentence saying why the criterion is justified, at least {MIN_WORDS} words of two letters "
            f"or more, {MIN_DISTINCT_WORDS} of them different (it is kept beside the criterion for a person to "
            f"judge), actual {text!r} ({len(words)} word(s), {len(set(words))} different)")


def vacuous_reason(prefixes: Iterable[tuple], tolerance: Tolerance) -> Optional[str]:
    """Why a criterion is vacuous for a run's saved logits, or None. prefixes are (cached, uncached) pairs of
    finite arrays ((vocab,) each). With lo and hi the smallest and largest of all of them, the criterion is
    vacuous when every cached vector whose values lie in [lo, hi] passes at every prefix: for each uncached
    value b, the farthest value in the range, max(b - lo, hi - b), is within atol + rtol*|b|. (atol >= hi - lo
    is always vacuous. RTOL >= 1 need not be by this rule, where |b| is small, but passes a vector of zeros,
    and the parser refuses it.)"""
    import numpy

    pairs = [(numpy.asarray(a, dtype=numpy.float64).reshape(-1), numpy.asarray(b, dtype=numpy.float64).reshape(-1))
             for a, b in prefixes]  # (vocab,) each
    if not pairs:
        return None
    lo = min(min(float(a.min()), float(b.min())) for a, b in pairs)
    hi = max(max(float(a.max()), float(b.max())) for a, b in pairs)
    for _, b in pairs:
        farthest = numpy.maximum(b - lo, hi - b)  # (vocab,)
        if not (farthest <= tolerance.atol + tolerance.rtol * numpy.abs(b)).all():
            return None
    return (f"under {tolerance.describe()} every cached vector whose values lie within the range the run's own saved "
            f"logits span ([{lo:.6g}, {hi:.6g}], {hi - lo:.6g} wide) would pass at every prefix, so the criterion "
            f"could not detect any cache fault")


def check_options(criterion: Optional[CriterionOption], justification: Optional[str]) -> None:
    """Both options or neither: a criterion needs a non-blank justification, a justification needs a criterion."""
    blank = justification is None or not justification.strip()
    if criterion is not None and blank:
        raise RevisedCriterionError(
            f"--revised-cache-criterion {criterion.text}: expected a --justification TEXT saying why this "
            f"criterion is justified, actual {'none' if justification is None else repr(justification)}"
        )
    if criterion is None and not blank:
        raise RevisedCriterionError(
            f"--justification {justification!r}: expected it together with --revised-cache-criterion ATOL,RTOL, "
            f"actual no revised criterion"
        )
    thin = justification_problem(justification) if criterion is not None else None
    if thin is not None:
        raise RevisedCriterionError(f"--justification: {thin}")


@dataclass(frozen=True)
class RevisedCriterion:
    """A revised criterion with its justification, as the run records it."""

    tolerance: Tolerance
    justification: str

    def as_record(self) -> dict:
        """The cache_criterion_revised record's fields: {atol, rtol, rule, justification, label}."""
        return {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol, "rule": self.tolerance.describe(),
                "justification": self.justification, "label": LABEL}


def from_options(criterion: Optional[CriterionOption], justification: Optional[str]) -> Optional[RevisedCriterion]:
    """The revised criterion the options name, or None without them (checked as check_options does)."""
    check_options(criterion, justification)
    if criterion is None:
        return None
    return RevisedCriterion(tolerance=criterion.tolerance, justification=justification.strip())


def judge(cached, uncached, tolerance: Tolerance) -> dict:
    """One prefix's cached logits against the uncached reference under |a-b| <= atol + rtol*|b| (numpy arrays
    or anything numpy reads; both (vocab,)): {atol, rtol, passed, fail_count, fail_fraction}. Float64, NaN
    counts as failing, and passed needs every value finite: as cache_check.compare_vectors decides it."""
    import numpy

    a = numpy.asarray(cached, dtype=numpy.float64).reshape(-1)  # (vocab,)
    b = numpy.asarray(uncached, dtype=numpy.float64).reshape(-1)  # (vocab,)
    if a.shape != b.shape:
        raise ValueError(f"judge: shapes differ, cached {a.shape} vs uncached reference {b.shape}")
    with numpy.errstate(invalid="ignore"):  # inf - inf is NaN, and NaN fails
        failing = ~(numpy.abs(a - b) <= tolerance.atol + tolerance.rtol * numpy.abs(b))
    fail_count, numel = int(failing.sum()), int(a.size)
    finite = bool(numpy.isfinite(a).all() and numpy.isfinite(b).all())
    return {"atol": tolerance.atol, "rtol": tolerance.rtol, "passed": finite and fail_count == 0,
            "fail_count": fail_count, "fail_fraction": fail_count / numel if numel else 0.0}


def evaluate(prefixes: Iterable[tuple], revised: RevisedCriterion) -> dict:
    """The stored logits of every compared prefix judged under a revised criterion: prefixes are (name,
    prefix_length, cached, uncached) in order. Returns {"per_prefix": {name: judge(...)}, "summary": {atol,
    rtol, rule, justification, label, all_within_tolerance, failing_prefix_lengths}}, the shape both the run
    (cache_comparison.revised, cache_summary.revised_evaluation) and `inferlab revise` record."""
    per_prefix, failing = {}, []
    for name, prefix_length, cached, uncached in prefixes:
        per_prefix[name] = judge(cached, uncached, revised.tolerance)
        if not per_prefix[name]["passed"]:
            failing.append(prefix_length)
    summary = {**revised.as_record(), "all_within_tolerance": not failing, "failing_prefix_lengths": failing}
    return {"per_prefix": per_prefix, "summary": summary}
