"""The ordered schedule of a session: one entry per experiment test, its totals against the protocol's caps,
what the command line left out, and the lines `--plan` prints.

Plain data in, plain data out: the plugin reads each test's markers into a TestFacts and hands them here;
nothing in this module imports pytest or loads a model.
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from inferlab import protocol
from inferlab.base.commands import spelled
from inferlab.run import session_status

EXPERIMENTS_DIR = "experiments"  # the protocol's tests, below the project root


@dataclass(frozen=True)
class TestFacts:
    """What one experiment test declares, read from its markers: all a plan entry, the prerequisite ledger and
    the record fixture need to know about it."""

    __test__ = False  # not a test class, whatever its name

    nodeid: str
    params: dict = field(default_factory=dict)  # parametrize values, as plain data
    budget: Optional[dict] = None  # @pytest.mark.budget(category, selections, forwards, calls)
    requires: tuple = ()  # checks that must have passed before it starts
    provides: tuple = ()  # checks it establishes for later tests
    records: tuple = ()  # the record kinds it may write (@pytest.mark.records)
    timeout_s: Optional[float] = None
    diagnostic: bool = False  # a protocol diagnostic (its failure is a finding), else an integrity check
    optional: bool = False  # part of the optional extension

    @property
    def check_kind(self) -> str:
        """'diagnostic' for a protocol diagnostic (marked), else 'integrity': the harness, inputs and trials."""
        return "diagnostic" if self.diagnostic else "integrity"


def facts_from_markers(nodeid: str, params: dict, markers) -> TestFacts:
    """A test's facts from its parametrize values and its markers: markers(name) gives the test's markers of
    that name (closest first), each with .args and .kwargs, as pytest's item.iter_markers does."""
    def args(name: str) -> tuple:
        return tuple(arg for marker in markers(name) for arg in marker.args)

    budget, timeout = next(iter(markers("budget")), None), next(iter(markers("timeout")), None)
    return TestFacts(
        nodeid=nodeid, params={name: plain_param(value) for name, value in params.items()},
        budget=dict(budget.kwargs) if budget else None, requires=args("requires"), provides=args("provides"),
        records=tuple(dict.fromkeys(args("records"))), timeout_s=timeout.args[0] if timeout and timeout.args else None,
        diagnostic=bool(list(markers("diagnostic"))), optional=bool(list(markers("optional_extension"))))


def plain_param(value):
    """A parametrize value as JSON data: a dataclass (a trial) as its fields and test id, anything else its repr."""
    if hasattr(value, "__dataclass_fields__"):
        return {**asdict(value), "test_id": getattr(value, "test_id", None)}
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def entry(index: int, facts: TestFacts) -> dict:
    """One plan.json schedule entry."""
    return {
        "index": index,
        "test": facts.nodeid,
        "params": dict(facts.params),
        "budget": dict(facts.budget) if facts.budget else None,
        "requires": list(facts.requires),
        "provides": list(facts.provides),
        "timeout_s": facts.timeout_s,
        "check_kind": facts.check_kind,
        "records": list(facts.records),
        "optional": facts.optional,
    }


def plan_totals(entries: list[dict]) -> dict:
    """Trials, selections, forwards and calls of the collected schedule, named like protocol.CAPS."""
    totals = collections.Counter()
    for planned in entries:
        budget = planned["budget"] or {}
        category = budget.get("category")
        selections = budget.get("selections", 0)
        if category == "generation":
            totals["generation_trials"] += 1
            totals["generation_new_tokens"] += selections
        elif category in ("timing_warmup", "timing_measured"):
            totals["timing_warmups" if category == "timing_warmup" else "timing_measured"] += 1
            totals["timing_selections"] += selections
        elif category == "cache":
            totals["cache_forwards"] += budget.get("forwards", 0)
        elif category == "batching":
            totals["batching_calls"] += budget.get("calls", 0)
        elif category is not None:
            # Any other spending is a forward the protocol's budget has no room for (no practice runs).
            totals["other_forwards"] += budget.get("forwards", 0) + budget.get("calls", 0) + budget.get("selections", 0)
    totals["core_trials"] = totals["generation_trials"] + totals["timing_warmups"] + totals["timing_measured"]
    totals["core_selections"] = totals["generation_new_tokens"] + totals["timing_selections"]
    return {name: totals.get(name, 0) for name in protocol.CAPS}


def planned_forwards(budget: Optional[dict]) -> int:
    """The most forwards of the model a test with this budget may run: one per selection for a generation trial (an
    EOS stops it sooner) and a timing trial (exactly that many), the cache test's declared forwards, one per new
    token per batching call, and for any other spending all it declares; a test without a budget none."""
    budget = budget or {}
    category = budget.get("category")
    if category in ("generation", "timing_warmup", "timing_measured"):
        return budget.get("selections", 0)
    if category == "cache":
        return budget.get("forwards", 0)
    if category == "batching":
        return budget.get("forwards", budget.get("calls", 0) * protocol.MAX_NEW_TOKENS)
    if category is None:
        return 0
    return budget.get("forwards", 0) + budget.get("calls", 0) + budget.get("selections", 0)


def forward_budget(entries: list[dict]) -> dict:
    """The plan's forward totals: {"at_most": the session's most forwards, "by_test": {node id: its most}}."""
    by_test = {planned["test"]: planned_forwards(planned.get("budget")) for planned in entries}
    return {"at_most": sum(by_test.values()), "by_test": by_test}


def named_experiment_paths(args: Iterable[str], invocation_dir: Path, experiments_root: Path) -> tuple[list[str], bool]:
    """The command-line paths inside experiments/ when the folder as a whole was not named; node ids named?"""
    root = Path(experiments_root).resolve()
    base = Path(invocation_dir)
    whole, inside = False, []
    for arg in args:
        path = (base / arg.split("::")[0]).resolve()
        if root == path or root.is_relative_to(path):
            whole = whole or "::" not in arg
        elif path.is_relative_to(root):
            inside.append(arg)
    if whole:
        return [], False
    return inside, any("::" in arg for arg in inside)


def selection_of(option, last_failed_plugin=None) -> dict:
    """The options in effect that can shrink the schedule, from pytest's option namespace (any object with
    those attributes) and its last-failed plugin (None with -p no:cacheprovider)."""
    return {
        "keyword": getattr(option, "keyword", "") or None,
        "markexpr": getattr(option, "markexpr", "") or None,
        "deselect": list(getattr(option, "deselect", None) or []),
        # --lf narrows the run only when failures are on record; otherwise it runs everything.
        "last_failed": bool(getattr(option, "lf", False) and last_failed_plugin is not None
                            and getattr(last_failed_plugin, "lastfailed", None)),
        "stepwise": bool(getattr(option, "stepwise", False) or getattr(option, "stepwise_skip", False)),
    }


LAST_FAILED_SPECIMEN_KEY = "inferlab/last_failed_specimen"  # in pytest's cache, beside its own cache/lastfailed


def last_failed_refusal(option, last_failed_plugin, cache, specimen: str) -> Optional[str]:
    """Why --lf must not run now: pytest keeps one last-failed list for the folder, and the run that wrote it
    used another specimen (recorded under LAST_FAILED_SPECIMEN_KEY); None when --lf selects nothing or the
    specimens agree. cache is pytest's config.cache (None with -p no:cacheprovider)."""
    if cache is None or not selection_of(option, last_failed_plugin)["last_failed"]:
        return None
    recorded = cache.get(LAST_FAILED_SPECIMEN_KEY, None)
    if recorded in (None, specimen):
        return None
    return (f"--lf: the last-failed list was written by a run of specimen {recorded!r}, and this run is of "
            f"{specimen!r}: its failures are not this specimen's. Rerun with --specimen {recorded} --lf, or run "
            f"{specimen!r} without --lf (`{spelled('-m pytest --cache-clear', 'python')}` empties the list)")


def core_deselected(deselected: Iterable[str], parts: list[dict]) -> list[str]:
    """The deselected node ids outside the optional parts: each one makes the run partial."""
    optional_files = {part["file"] for part in parts if part["optional"]}
    return [nodeid for nodeid in deselected if session_status.file_of(nodeid) not in optional_files]


@dataclass
class Schedule:
    """The session's experiment tests: as collected, as deselected, as planned, and what the plan says of itself."""

    collected: list = field(default_factory=list)  # node ids before any deselection
    deselected: list = field(default_factory=list)  # node ids deselected (-k, -m, --lf, ...)
    planned: list = field(default_factory=list)  # node ids after selection: the plan
    status: dict = field(default_factory=dict)  # protocol_complete, partial_reasons, optional_left_out
    plan: Optional[dict] = None  # plan.json as written
    declared: list = field(default_factory=list)  # every experiment test on disk: provides, requires
    collected_facts: list = field(default_factory=list)  # TestFacts of every collected test, deselected ones too
    missing: dict = field(default_factory=dict)  # prerequisite tests outside the schedule that a test waited for

    def adopt(self, plan: dict) -> None:
        """Remember a written plan: what it planned and how it judged itself."""
        self.plan = plan
        self.planned = [planned["test"] for planned in plan["schedule"]]
        self.status = {name: plan[name] for name in ("protocol_complete", "partial_reasons", "optional_left_out")}

    def partial_reasons(self) -> list[str]:
        """Why the session is not the complete protocol (no experiment test collected is one reason)."""
        return self.status.get("partial_reasons", []) if self.planned else ["no experiment test was collected"]


def plan_lines(plan: Optional[dict], plan_path) -> list[str]:
    """What --plan prints: one line per planned test with its spend, the totals against the caps, the notes."""
    if plan is None:
        return ["inferlab plan: no experiment tests collected"]
    lines = [f"inferlab plan: {len(plan['schedule'])} tests, written to {plan_path}"]
    for planned in plan["schedule"]:
        budget = planned["budget"] or {}
        spend = ", ".join(f"{k}={v}" for k, v in budget.items() if k != "category")
        category = budget.get("category", "check")
        lines.append(f"{planned['index']:4d}  {category:16s} {spend:28s} {planned['test']}")
    lines.append("totals (planned/cap): " + ", ".join(f"{k}={v}/{plan['caps'].get(k, 'no cap')}"
                                                     for k, v in plan["totals"].items()))
    lines += [f"note: not the complete protocol: {note}" for note in plan["partial_reasons"]]
    return lines
