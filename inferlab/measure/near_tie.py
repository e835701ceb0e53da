"""The near-tie rule for greedy ids computed twice (an instructor's reference and a run, or a run and its replay):
one place, used by inferlab.recheck.trusted (a reference, the course's run and a replay compare through it).

Each greedy step records its top two raw logits as the selected id's logit and the best other id with its logit
(`step_top2_ids` [[selected, runner-up], ...] and `step_top2_logits` [[top, second], ...]: sampling.py and
decode_loop.py write them). Two honest computations on other CPUs move every logit a little, so where the two
largest are close they may swap. The rule:

- the ids are compared step by step up to the first difference; at every step compared, and at the step of the
  difference, the top two values of both sides must agree within the tolerance, |a - b| <= atol + rtol*|b| with b
  the trusted side (the reference, or the replay), because up to there both computed from the same ids;
- at the first difference, when a side's margin (top - second) is at or below near_tie_limit(its top) = 2(atol +
  rtol*|top|), the most the criterion lets the two logits close, and the two ids swapped places (each side's
  runner-up, where known, is the other side's id), the step is a near tie: a near-tie divergence, noted with the
  step and both margins, never a contradiction; the ids after it are not compared (they continue from other ids);
- the untrusted side's margin counts only where its top two values were checked against the trusted side's at
  that step; any other first difference is a contradiction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from inferlab.measure.summaries import first_divergence

STEP_VALUES_FIELD = "step_top2_logits"  # [[top, second], ...]: the selected id's raw logit, the best other one
STEP_IDS_FIELD = "step_top2_ids"  # [[selected id, runner-up id], ...]
SHOWN_VALUE_PROBLEMS = 3


def near_tie_limit(top_value: float, atol: float, rtol: float) -> float:
    """A top-two margin at or below this can swap when each of the two logits moves within the tolerance."""
    return 2 * (atol + rtol * abs(top_value))


@dataclass(frozen=True)
class Step:
    """One greedy step's top two: the selected id's logit and the best other id's (the runner-up may be None when
    a source does not know it)."""

    top: float
    second: float
    runner_up: Optional[int] = None

    @property
    def margin(self) -> float:
        return self.top - self.second

    def near_tie(self, atol: float, rtol: float) -> bool:
        return self.margin <= near_tie_limit(self.top, atol, rtol)


def steps_of(record: dict) -> Optional[list[Step]]:
    """The steps a record holds (STEP_VALUES_FIELD with STEP_IDS_FIELD when present), or None when it holds none
    or they are not of that shape: a list of [top, second] pairs of finite numbers with top >= second."""
    values = record.get(STEP_VALUES_FIELD) if isinstance(record, dict) else None
    problem = shape_problem(values, record.get(STEP_IDS_FIELD) if isinstance(record, dict) else None)
    if values is None or problem is not None:
        return None
    ids = record.get(STEP_IDS_FIELD)
    return [Step(float(pair[0]), float(pair[1]), int(ids[i][1]) if ids is not None else None)
            for i, pair in enumerate(values)]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def shape_problem(values, ids) -> Optional[str]:
    """What is wrong with the two fields' shape, or None (None too when neither is there)."""
    if values is None and ids is None:
        return None
    if not isinstance(values, list) or not all(isinstance(p, list) and len(p) == 2 and all(map(_number, p))
                                               for p in values):
        return f"{STEP_VALUES_FIELD} is not a list of [top, second] pairs of finite numbers"
    if any(p[0] < p[1] for p in values):
        step = next(i for i, p in enumerate(values) if p[0] < p[1])
        return f"{STEP_VALUES_FIELD}[{step}]: the selected id's logit {values[step][0]!r} is below the runner-up's " \
               f"{values[step][1]!r}, so greedy selection did not pick it"
    if ids is not None:
        if not isinstance(ids, list) or len(ids) != len(values) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in p)
                for p in ids):
            return f"{STEP_IDS_FIELD} is not a list of [selected, runner-up] id pairs, one per {STEP_VALUES_FIELD} step"
    return None


@dataclass
class IdsComparison:
    """Two greedy id lists under the rule: equal, a near-tie divergence, or a difference; with the steps compared
    and the steps whose top-two values disagree beyond the tolerance."""

    status: str  # "equal", "near_tie" or "differ"
    step: Optional[int] = None
    ours_margin: Optional[float] = None
    theirs_margin: Optional[float] = None
    compared_steps: int = 0
    value_problems: list[str] = field(default_factory=list)

    def margins_text(self, ours: str = "the run", theirs: str = "the reference") -> str:
        def shown(value):
            return "unknown" if value is None else f"{value:.3g}"
        return f"top-two margin {shown(self.ours_margin)} in {ours}, {shown(self.theirs_margin)} in {theirs}"


def within(ours: float, theirs: float, atol: float, rtol: float) -> bool:
    """Whether a value agrees with the trusted one within the tolerance: |ours - theirs| <= atol + rtol*|theirs|."""
    return abs(ours - theirs) <= atol + rtol * abs(theirs)


def compare_greedy(ours: Sequence[int], theirs: Sequence[int], ours_steps: Optional[list[Step]],
                   theirs_steps: Optional[list[Step]], atol: float, rtol: float) -> IdsComparison:
    """`ours` (the side under test) against `theirs` (the trusted side) by the module's rule. A side's steps may be
    None (not recorded) or shorter than its ids; a missing step is simply not known."""
    ours_steps, theirs_steps = ours_steps or [], theirs_steps or []
    step = first_divergence(list(ours), list(theirs))
    last = (min(len(ours), len(theirs)) - 1) if step is None else step
    checked: set[int] = set()
    result = IdsComparison(status="equal" if step is None else "differ", step=step)
    for index in range(last + 1):
        if index < len(ours_steps) and index < len(theirs_steps):
            a, b = ours_steps[index], theirs_steps[index]
            # sorted top-two values move by at most the largest move of any logit: comparable even after a swap
            if within(a.top, b.top, atol, rtol) and within(a.second, b.second, atol, rtol):
                checked.add(index)
            else:
                result.value_problems.append(f"step {index}: top two raw logits [{a.top:.7g}, {a.second:.7g}], "
                                             f"against [{b.top:.7g}, {b.second:.7g}]")
    result.compared_steps = last + 1
    if step is None:
        return result
    a = ours_steps[step] if step < len(ours_steps) else None
    b = theirs_steps[step] if step < len(theirs_steps) else None
    result.ours_margin, result.theirs_margin = (a.margin if a else None), (b.margin if b else None)
    if step >= min(len(ours), len(theirs)):
        return result  # one list ends where the other goes on, with no id of its own there: no near tie
    # a swap of the two: each side's runner-up (where known) is the other side's id at that step
    swapped = (b is None or b.runner_up in (None, ours[step])) and (a is None or a.runner_up in (None, theirs[step]))
    trusted_tie = b is not None and b.near_tie(atol, rtol)
    checked_tie = a is not None and step in checked and a.near_tie(atol, rtol)
    if swapped and (trusted_tie or checked_tie):
        result.status = "near_tie"
    return result
