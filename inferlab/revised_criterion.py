"""A justified revised cache criterion: parsed from the command line, evaluated beside the declared one.

The protocol declares |a-b| <= 1e-5 + 1e-4*|b| before any error is seen and never relaxes it. A learner
who has found, and can justify, a reason for another bound may name it with
``--revised-cache-criterion ATOL,RTOL --justification TEXT``. The run then records a second, labelled
evaluation under it; the declared criterion and its verdict stay exactly as they are.

This module has no torch import: the plugin uses it while parsing options.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Optional

from inferlab.protocol import Tolerance

LABEL = ("revised criterion, supplied by the learner with a justification; evaluated beside the declared "
         "criterion, whose verdict it does not change")


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
    return CriterionOption(atol=values[0], rtol=values[1], text=text)


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
