"""A claimed run's timings beside the course's run of the same protocol: a finding for a person, never an
equality check (two machines, or one machine twice, never time alike).

side_by_side(claimed, course) takes two runs read through inferlab.reading.runview.RunView (the learner's run as
handed in, and the run the course made itself: the autograder's own run or `grade --against COURSE_RUN`) and
gives:

- per timing prompt, cache setting and metric (TIME_METRICS: prefill, local TTFT, the mean post-first-token
  interval, the whole loop), the learner's median, the course's median and their ratio (learner / course), over
  every measured trial of each run (warmups and failed trials left out, as the report's medians are);
- per timing prompt and cache-verdict metric (inferlab.measure.contention.VERDICT_METRICS), each run's own cache
  verdict: 'faster', 'slower' or 'cannot_tell', as that run's own report gives it (contention.cache_verdicts: an
  interval of the effect from its uncontended samples, claimed only where it clears that run's A/A noise). The learner's effect is **contradicted** when both runs decide
  beyond their own noise and in opposite directions (the learner's run says the cache made it faster, the
  course's says slower, or the reverse). A verdict of 'cannot_tell' on either side contradicts nothing: a
  machine that cannot tell is no evidence against one that can.

TimingSides.findings() gives these as grade findings (kind TIMING_FINDING for the table, CONTRADICTED_FINDING for
each contradicted effect), none of which costs a point; as_dict() is the JSON form, lines() the text. Nothing is
written and no model is loaded.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Optional

from inferlab import protocol
from inferlab.base.records import RECORDS_FILE
from inferlab.measure import contention
from inferlab.measure.summaries import post_first_interval
from inferlab.reading.runview import RunView

TIME_METRICS = ("prefill_s", "ttft_s", "mean_post_first_interval_s", "loop_s")
TIMING_FINDING = "timing_beside_course_run"
CONTRADICTED_FINDING = "timing_effect_contradicted_by_course_run"
DECIDED = ("faster", "slower")


@dataclass(frozen=True)
class MetricSide:
    """One metric of one (prompt, cache setting): each run's median in seconds, and learner / course."""

    prompt_id: str
    use_cache: bool
    metric: str
    learner_median: Optional[float]
    course_median: Optional[float]
    learner_n: int
    course_n: int

    @property
    def ratio(self) -> Optional[float]:
        """The learner's median over the course's (None when either is missing or the course's is 0)."""
        if self.learner_median is None or not self.course_median:
            return None
        return self.learner_median / self.course_median


@dataclass(frozen=True)
class EffectSide:
    """The cache's effect on one metric of one prompt, as each run decides it against its own noise."""

    prompt_id: str
    metric: str
    learner_verdict: str
    learner_effect: Optional[float]  # median without / median with the cache - 1 (positive: the cache was faster)
    learner_noise: Optional[float]  # the run's A/A noise fraction
    learner_reason: str
    course_verdict: str
    course_effect: Optional[float]
    course_noise: Optional[float]
    course_reason: str

    @property
    def contradicted(self) -> bool:
        """Both runs decided beyond their own noise, in opposite directions."""
        return {self.learner_verdict, self.course_verdict} == set(DECIDED)


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value * 1e3:.3f} ms"


@dataclass
class TimingSides:
    """What side_by_side found: the medians side by side and the cache effects of both runs."""

    metrics: list[MetricSide]
    effects: list[EffectSide]
    learner_run: Optional[str] = None
    course_run: Optional[str] = None

    @property
    def contradictions(self) -> list[EffectSide]:
        """The learner's effects the course's run contradicts in direction, beyond both runs' noise."""
        return [e for e in self.effects if e.contradicted]

    def as_dict(self) -> dict:
        """Plain data (JSON): {learner_run, course_run, metrics: [...with ratio], effects: [...with contradicted]}."""
        return {"learner_run": self.learner_run, "course_run": self.course_run,
                "metrics": [{**asdict(m), "ratio": m.ratio} for m in self.metrics],
                "effects": [{**asdict(e), "contradicted": e.contradicted} for e in self.effects]}

    def lines(self) -> list[str]:
        """The comparison in words: one line per metric, then one per effect."""
        lines = [f"{m.prompt_id} cache {'on' if m.use_cache else 'off'} {m.metric}: learner {_ms(m.learner_median)} "
                 f"(n={m.learner_n}), course {_ms(m.course_median)} (n={m.course_n}), ratio "
                 f"{'-' if m.ratio is None else f'{m.ratio:.2f}'}" for m in self.metrics]
        for e in self.effects:
            lines.append(f"{e.prompt_id} {e.metric} cache effect: learner {e.learner_verdict} "
                         f"({_percent(e.learner_effect)}, noise ±{_percent(e.learner_noise).lstrip('+')}), course "
                         f"{e.course_verdict} ({_percent(e.course_effect)}, noise "
                         f"±{_percent(e.course_noise).lstrip('+')})"
                         + ("; CONTRADICTED: the runs disagree in direction beyond both runs' noise"
                            if e.contradicted else ""))
        return lines

    def findings(self) -> list[dict]:
        """Grade findings: the table (one) and each contradicted effect (one each); no point is taken."""
        evidence = [{"file": RECORDS_FILE, "kind": "timing_trial"}]
        found = [{"kind": TIMING_FINDING,
                  "what": f"timings beside the course's run ({len(self.metrics)} medians: learner / course); "
                          + "; ".join(self.lines()[:len(self.metrics)]),
                  "meaning": "a finding, not a check: two machines never time alike, so the learner's medians are "
                             "shown beside the course's, never compared for equality; no point was taken",
                  "sides": self.as_dict(), "evidence": evidence}]
        for e in self.contradictions:
            found.append({
                "kind": CONTRADICTED_FINDING,
                "what": f"the learner's run says the cache made {e.metric} of {e.prompt_id} {e.learner_verdict} "
                        f"({_percent(e.learner_effect)}, beyond its noise ±{_percent(e.learner_noise).lstrip('+')}); "
                        f"the course's run says {e.course_verdict} ({_percent(e.course_effect)}, beyond its noise "
                        f"±{_percent(e.course_noise).lstrip('+')})",
                "meaning": "for a person to look at: the same protocol on the course's machine decided the opposite "
                           "direction beyond both runs' own noise (machines can honestly differ; ask the learner "
                           "what their machine was doing); no point was taken",
                "effect": {**asdict(e), "contradicted": True}, "evidence": evidence})
        return found


def _trials(view: RunView) -> list[dict]:
    return [t for t in view.kind("timing_trial") if isinstance(t, dict)]


def _value(trial: dict, metric: str) -> Optional[float]:
    value = post_first_interval(trial) if metric == "mean_post_first_interval_s" else trial.get(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _measured(trials: list[dict], prompt_id: str, use_cache: bool, metric: str) -> list[float]:
    values = [_value(t, metric) for t in trials if t.get("status", "ok") == "ok" and t.get("warmup") is False
              and t.get("prompt_id") == prompt_id and t.get("use_cache") == use_cache]
    return [v for v in values if v is not None]


def _median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def side_by_side(claimed: RunView, course: RunView) -> TimingSides:
    """The claimed run's timings beside the course's run (see the module docstring)."""
    mine, theirs = _trials(claimed), _trials(course)
    metrics = []
    for prompt_id in protocol.TIMING_PROMPTS:
        for use_cache in (True, False):
            for metric in TIME_METRICS:
                a, b = _measured(mine, prompt_id, use_cache, metric), _measured(theirs, prompt_id, use_cache, metric)
                metrics.append(MetricSide(prompt_id, use_cache, metric, _median(a), _median(b), len(a), len(b)))
    # each run's own verdicts, as its report gives them: an interval of the effect against that run's own noise
    verdicts_mine, verdicts_theirs = contention.cache_verdicts(mine), contention.cache_verdicts(theirs)
    noise_mine, noise_theirs = verdicts_mine["threshold"], verdicts_theirs["threshold"]  # no A/A noise any more
    theirs_by = {(v["prompt_id"], v["metric"]): v for v in verdicts_theirs["verdicts"]}
    effects = []
    for a in verdicts_mine["verdicts"]:
        b = theirs_by[(a["prompt_id"], a["metric"])]
        effects.append(EffectSide(a["prompt_id"], a["metric"], a["verdict"], a["effect"], noise_mine, a["reason"],
                                  b["verdict"], b["effect"], noise_theirs, b["reason"]))

    def name(view: RunView) -> Optional[str]:
        return view.directory.name if view.directory is not None else None

    return TimingSides(metrics, effects, name(claimed), name(course))
