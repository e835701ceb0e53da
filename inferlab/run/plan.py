"""The schedule of a session as data: each test's facts (its markers), plan.json (its totals against the protocol's
caps, every way it falls short of the protocol), the prerequisite ledger, and the refusals made before anything runs."""

from __future__ import annotations

import ast
import collections
import importlib.util
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from inferlab import protocol
from inferlab.files import spelled
from inferlab.run.records import RECORD_SCHEMA

EXPERIMENTS_DIR = "experiments"  # the protocol's tests, below the project root
OPTIONAL_MARKER = "optional_extension"  # on a module (pytestmark): leaving it out does not make a run partial
MARKERS = (
    "provides(name): this test establishes the named check for later tests",
    "requires(*names): skip unless every named check passed earlier",
    "budget(category, selections=0, forwards=0, calls=0): what the test spends",
    "records(*kinds): the record kinds this test writes (the plan carries them; `record` refuses any other kind)",
    "optional_extension: an optional part of the protocol (on a module): leaving it out does not make a run partial",
    "batching: the optional batching extension (deselect with -m 'not batching')",
    "diagnostic: a protocol diagnostic; its failure is a finding about the computation, not a broken harness",
)
LAST_FAILED_SPECIMEN_KEY = "inferlab/last_failed_specimen"  # in pytest's cache, beside its own cache/lastfailed


@dataclass(frozen=True)
class TestFacts:
    """What one experiment test declares with its markers (MARKERS) and parameters: all a plan entry, the ledger
    and `record` need."""

    __test__ = False  # not a test class, whatever its name

    nodeid: str
    params: dict = field(default_factory=dict)  # parametrize values, as plain data
    budget: Optional[dict] = None
    requires: tuple = ()
    provides: tuple = ()
    records: tuple = ()
    timeout_s: Optional[float] = None
    diagnostic: bool = False
    optional: bool = False

    @property
    def check_kind(self) -> str:
        return "diagnostic" if self.diagnostic else "integrity"


def facts_from_markers(nodeid: str, params: dict, markers: Callable) -> TestFacts:
    """A test's facts: markers(name) gives its markers of that name, closest first (pytest's item.iter_markers)."""
    def args(name: str) -> tuple:
        return tuple(arg for marker in markers(name) for arg in marker.args)

    budget, timeout = next(iter(markers("budget")), None), next(iter(markers("timeout")), None)
    plain = {name: ({**asdict(v), "test_id": getattr(v, "test_id", None)} if hasattr(v, "__dataclass_fields__") else v
                    if isinstance(v, (str, int, float, bool, type(None))) else repr(v)) for name, v in params.items()}
    return TestFacts(nodeid, plain, dict(budget.kwargs) if budget else None, args("requires"), args("provides"),
                     tuple(dict.fromkeys(args("records"))), timeout.args[0] if timeout and timeout.args else None,
                     bool(list(markers("diagnostic"))), bool(list(markers(OPTIONAL_MARKER))))


def file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def function_of(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]


def plan_totals(entries: list[dict]) -> dict:
    """Trials, selections, forwards and calls of a schedule, named like protocol.CAPS."""
    totals = collections.Counter()
    for planned in entries:
        budget = planned.get("budget") or {}
        category, selections = budget.get("category"), budget.get("selections", 0)
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
        elif category is not None:  # any other spending has no room in the protocol's budget (no practice runs)
            totals["other_forwards"] += budget.get("forwards", 0) + budget.get("calls", 0) + selections
    totals["core_trials"] = totals["generation_trials"] + totals["timing_warmups"] + totals["timing_measured"]
    totals["core_selections"] = totals["generation_new_tokens"] + totals["timing_selections"]
    return {name: totals.get(name, 0) for name in protocol.CAPS}


def planned_forwards(budget: Optional[dict]) -> int:
    """The most forwards a test with this budget may run (one per selection; per new token of a batching call)."""
    budget = budget or {}
    category = budget.get("category")
    if category in ("generation", "timing_warmup", "timing_measured"):
        return budget.get("selections", 0)
    if category == "cache":
        return budget.get("forwards", 0)
    if category == "batching":
        return budget.get("forwards", budget.get("calls", 0) * protocol.MAX_NEW_TOKENS)
    return 0 if category is None else budget.get("forwards", 0) + budget.get("calls", 0) + budget.get("selections", 0)


def forward_budget(entries: list[dict]) -> dict:
    by_test = {planned["test"]: planned_forwards(planned.get("budget")) for planned in entries}
    return {"at_most": sum(by_test.values()), "by_test": by_test}


def _marker_args(decorators: list, marker: str) -> list[str]:
    return [arg.value for d in decorators if isinstance(d, ast.Call) and getattr(d.func, "attr", None) == marker
            for arg in d.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]


def experiment_files(root: Path) -> tuple[list[dict], list[dict]]:
    """From the source, so that a file or test left out of the session is known too: one part per file ({file,
    title, optional}) and every test function ({file, function, provides, requires})."""
    parts, tests = [], []
    for path in sorted((Path(root) / EXPERIMENTS_DIR).glob("test_*.py")):
        file = f"{EXPERIMENTS_DIR}/{path.name}"
        try:
            module = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            parts.append({"file": file, "title": path.stem, "optional": False})
            continue
        title = (ast.get_docstring(module) or "").strip().splitlines()
        marks = [n for node in module.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "pytestmark" for t in node.targets) for n in ast.walk(node.value)]
        parts.append({"file": file, "title": title[0] if title else path.stem,
                      "optional": any(getattr(n, "attr", None) == OPTIONAL_MARKER for n in marks)})
        tests += [{"file": file, "function": node.name, "provides": _marker_args(node.decorator_list, "provides"),
                   "requires": _marker_args(node.decorator_list, "requires")}
                  for node in module.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]
    return parts, tests


def selection_of(option, last_failed_plugin=None) -> dict:
    """The options that can shrink the schedule, from pytest's option namespace and its lfplugin."""
    return {"keyword": getattr(option, "keyword", "") or None, "markexpr": getattr(option, "markexpr", "") or None,
            "deselect": list(getattr(option, "deselect", None) or []),
            # --lf narrows the run only when failures are on record; otherwise it runs everything
            "last_failed": bool(getattr(option, "lf", False) and getattr(last_failed_plugin, "lastfailed", None))}


def named_experiment_paths(args: Iterable[str], invocation_dir: Path, root: Path) -> Optional[tuple[list[str], bool]]:
    """The command-line paths inside experiments/ when the folder as a whole (or one above it) was not named, and
    whether node ids were named; None when no path reaches experiments/."""
    experiments, whole, inside = (Path(root) / EXPERIMENTS_DIR).resolve(), False, []
    for arg in args:
        path = (Path(invocation_dir) / arg.split("::")[0]).resolve()
        if experiments == path or experiments.is_relative_to(path):
            whole = whole or "::" not in arg
        elif path.is_relative_to(experiments):
            inside.append(arg)
    if not (whole or inside):
        return None
    return ([], False) if whole else (inside, any("::" in arg for arg in inside))


def selection_reasons(selection: dict, deselected_core: int, named_paths: list[str]) -> list[str]:
    named = [f"-k {selection['keyword']!r}"] if selection.get("keyword") else []
    named += [f"-m {selection['markexpr']!r}"] if selection.get("markexpr") else []
    named += ["--deselect " + " ".join(selection["deselect"])] if selection.get("deselect") else []
    reasons = ["--lf: only the tests that failed last time were collected and run"] if selection.get("last_failed") \
        else []  # --lf filters files while collecting: the counts below cannot see all that it left out
    if deselected_core:
        by = " and ".join(named) or ("--lf" if selection.get("last_failed") else "an option or plugin")
        reasons.append(f"{by} deselected {deselected_core} protocol test(s)")
    if named_paths:
        reasons.append("the command named " + ", ".join(named_paths) + " instead of the whole experiments folder")
    return reasons


def make_plan(*, mode: str, facts: list[TestFacts], parts: list[dict], collected: list[str], selection: dict,
              named_paths: list[str] = (), named_tests: bool = False, collector: Optional[dict] = None) -> dict:
    """plan.json: the schedule in run order, its totals against the caps, and every way it falls short of the
    protocol (partial_reasons; leaving out the optional extension is a note, not a shortfall)."""
    entries = [{"index": i, "test": f.nodeid, "params": dict(f.params), "budget": dict(f.budget) if f.budget else None,
                "requires": list(f.requires), "provides": list(f.provides), "timeout_s": f.timeout_s,
                "check_kind": f.check_kind, "records": list(f.records), "optional": f.optional}
               for i, f in enumerate(facts)]
    planned, totals = [e["test"] for e in entries], plan_totals(entries)
    deselected = [nodeid for nodeid in collected if nodeid not in planned]  # by -k, -m, --deselect, --lf
    collected_by = collections.Counter(file_of(n) for n in collected or planned)
    planned_by = collections.Counter(file_of(n) for n in planned)
    counted, shortfalls, optional_notes = [], protocol.shortfalls(totals), []
    for part in parts:
        part = {**part, "collected": collected_by[part["file"]], "planned": planned_by[part["file"]]}
        counted.append(part)
        label = f"{part['file']} ({part['title']})"
        if not part["collected"]:
            line = f"{label}: not collected, so none of its tests is planned"
        elif part["planned"] < part["collected"]:
            line = (f"{label}: {part['planned']} of its {part['collected']} tests planned "
                    f"({part['collected'] - part['planned']} deselected)")
        elif named_tests:
            line = f"{label}: only the {part['planned']} test(s) named on the command line were collected"
        else:
            continue
        (optional_notes if part["optional"] else shortfalls).append(line)
    optional_files = {part["file"] for part in parts if part["optional"]}
    core_deselected = [n for n in deselected if file_of(n) not in optional_files]
    reasons = selection_reasons(selection, len(core_deselected), list(named_paths)) + shortfalls
    return {"schema": RECORD_SCHEMA, "mode": mode, "protocol": protocol.as_dict(), "collector": collector,
            "schedule": entries, "totals": totals, "caps": dict(protocol.CAPS),
            "cap_violations": protocol.cap_violations(totals), "shortfalls": shortfalls, "parts": counted,
            "selection": {**selection, "named_paths": list(named_paths), "deselected": len(deselected)},
            "protocol_complete": not reasons, "partial_reasons": reasons, "optional_left_out": optional_notes}


def plan_lines(plan: Optional[dict], plan_path) -> list[str]:
    """What --plan prints: one line per planned test with its spend, the totals against the caps, the notes."""
    if plan is None:
        return ["inferlab plan: no experiment tests collected"]
    lines = [f"inferlab plan: {len(plan['schedule'])} tests, written to {plan_path}"]
    for planned in plan["schedule"]:
        budget = planned["budget"] or {}
        spend = ", ".join(f"{k}={v}" for k, v in budget.items() if k != "category")
        lines.append(f"{planned['index']:4d}  {budget.get('category', 'check'):16s} {spend:28s} {planned['test']}")
    lines.append("totals (planned/cap): " + ", ".join(f"{k}={v}/{plan['caps'].get(k, 'no cap')}"
                                                     for k, v in plan["totals"].items()))
    return lines + [f"note: not the complete protocol: {note}" for note in plan["partial_reasons"]]


class Ledger:
    """Each named check's status ({status, by, reason, root_cause}), and the session limit, counted from the moment
    protocol.SETUP_DONE_CHECK passed. A test's skip names the root cause of a chain, not every link."""

    def __init__(self):
        self.checks: dict = {}
        self.setup_done: Optional[float] = None  # time.monotonic() when the setup check passed
        self.session_limit_skips = 0
        self._root_causes: dict = {}  # node id -> why it was not started (passed on to the checks it provides)

    def refusal(self, nodeid: str, requires: Iterable[str], absent: Callable[[str], str]) -> Optional[str]:
        """Why this test must not start, or None; absent(name) says why a check no test has provided is missing."""
        if self.setup_done is not None and time.monotonic() - self.setup_done > protocol.SESSION_LIMIT_S:
            self.session_limit_skips += 1
            return (f"not run: the session limit of {protocol.SESSION_LIMIT_S} s after setup was reached "
                    f"({time.monotonic() - self.setup_done:.0f} s since '{protocol.SETUP_DONE_CHECK}' passed) "
                    f"before this test started")
        for name in requires:
            check = self.checks.get(name) or {"status": "absent", "root_cause": absent(name)}
            if check["status"] != "passed":
                self._root_causes[nodeid] = cause = check["root_cause"]
                return f"not run: prerequisite '{name}' did not run, because {cause}" if check["status"] == \
                    "did not run" else f"not run: {cause}"
        return None

    def update(self, nodeid: str, provides: Iterable[str], outcome: str, phase: str, reason: str) -> None:
        """What one test's outcome means for its checks; one failed provider fails a check for good."""
        for name in provides:
            if (self.checks.get(name) or {}).get("status", "passed") != "passed":
                continue
            if outcome == "passed":
                if phase == "call":
                    self.checks[name] = {"status": "passed", "by": nodeid, "reason": None, "root_cause": None}
                    if name == protocol.SETUP_DONE_CHECK and self.setup_done is None:
                        self.setup_done = time.monotonic()
                continue
            status = "did not run" if outcome == "skipped" else outcome
            root_cause = self._root_causes.get(nodeid) or f"prerequisite '{name}' {status} in {nodeid}: {reason}"
            self.checks[name] = {"status": status, "by": nodeid, "reason": reason, "root_cause": root_cause}


def case_checks(facts: Iterable[TestFacts], declared: list[dict]) -> list[dict]:
    """Parametrized cases that provide a check their function does not declare, named by the case's id (-k)."""
    by_function = {(test["file"], test["function"]): set(test["provides"]) for test in declared}
    return [{"file": file_of(f.nodeid), "function": function_of(f.nodeid), "nodeid": f.nodeid,
             "keyword": f.nodeid.split("[", 1)[1].rstrip("]"), "provides": extra, "requires": list(f.requires)}
            for f in facts if "[" in f.nodeid
            for extra in [[n for n in f.provides
                           if n not in by_function.get((file_of(f.nodeid), function_of(f.nodeid)), set())]] if extra]


def missing_tests(names: Iterable[str], declared: list[dict], planned: Iterable[str]) -> list[dict]:
    """The tests outside the schedule that provide the checks `names` need, and what those need in turn."""
    chain, wanted, seen = [], list(names), set()
    while wanted:
        check = wanted.pop(0)
        if check not in seen:
            seen.add(check)
            for test in declared:
                if check in test["provides"] and test not in chain:
                    chain.append(test)
                    wanted += test["requires"]
    planned = set(planned)
    functions = {function_of(nodeid) for nodeid in planned}
    return [test for test in sorted(chain, key=declared.index)
            if (test["nodeid"] not in planned if test.get("nodeid") else test["function"] not in functions)]


def include_hint(keyword: str, missing: Iterable[dict]) -> str:
    return f"-k '{keyword} or {' or '.join(dict.fromkeys(t.get('keyword') or t['function'] for t in missing))}'"


def absent_prerequisite(name: str, missing: list[dict], selection: dict) -> str:
    """Why a required check has not run: the tests outside the schedule, what left them out, how to include them."""
    if not missing:
        return f"prerequisite '{name}' has not run"
    names = ", ".join(dict.fromkeys(test.get("keyword") or test["function"] for test in missing))
    files = " ".join(dict.fromkeys(test["file"] for test in missing))
    keyword, named = selection.get("keyword"), selection.get("named_paths") or []
    if keyword:
        why, how = f"-k {keyword!r} deselected them", include_hint(keyword, missing)
    elif named:
        why, how = f"the command named only {' '.join(named)}", f"name {files} too"
    else:
        why, how = "the command's selection left them out", "run the whole experiments folder"
    return (f"prerequisite '{name}' has not run: the tests it needs are not in this session's schedule "
            f"({names}; {why}); to include them: {how}")


# --- refusals, made before anything runs ---------------------------------------------------------------------------

KEEPS_ORDER = ("the experiment runs in the protocol's order (every test after the checks it relies on, the trials "
               "in their schedule), so a run never changes it")
# pytest's options that reorder the tests (option dest: as typed), refused before anything is written (order_refusal
# sees an order only after the claim), and random-order plugins by the names pytest registers (-p NAME unblocks one).
REORDERING_OPTIONS = {"failedfirst": "--ff (--failed-first)", "newfirst": "--nf (--new-first)",
                      "stepwise": "--sw (--stepwise)", "stepwise_skip": "--sw-skip (--stepwise-skip)"}
REORDERING_PLUGINS = ("randomly", "random_order", "pytest_randomly", "pytest_random_order", "random-order")


def refusal(config, specimen: str) -> Optional[str]:
    """Why this session may not run at all (pytest's config read as plain data), or None: no bound on each trial
    (no interval timers, or no pytest-timeout), another bound (--timeout), parallel workers, tests reordered, --lf of
    another specimen."""
    has_plugin = config.pluginmanager.has_plugin
    limit = f"the {protocol.TRIAL_LIMIT_S} s per-trial limit cannot be enforced"
    if not (hasattr(signal, "SIGALRM") and hasattr(signal, "setitimer")):
        return f"this platform ({sys.platform}) has no POSIX interval timers, so {limit}; the experiments refuse to " \
               "run unbounded"
    if not has_plugin("timeout") and importlib.util.find_spec("pytest_timeout") is None:
        return (f"this Python ({sys.executable}) is not the project's environment: it has no pytest-timeout (pinned "
                f"in requirements.lock), so {limit} and the experiments refuse to run. Run them with the project's "
                f"interpreter: {spelled('-m pytest experiments ...', 'python')} (`make` builds .venv)")
    if not has_plugin("timeout"):
        return (f"the pytest-timeout plugin is not loaded (for example by -p no:timeout), so {limit}; the experiments "
                "refuse to run unbounded (leave out -p no:timeout; pytest-timeout is pinned in requirements.lock)")
    if getattr(config.option, "timeout", None) is not None:
        return (f"--timeout {config.option.timeout}: the experiment gives each trial the protocol's limit of "
                f"{protocol.TRIAL_LIMIT_S} s itself (inferlab/protocol.py, TRIAL_LIMIT_S); leave --timeout out")
    workers = config.getoption("numprocesses", None)
    if workers not in (None, 0, "0", "no"):
        return (f"the experiments run in one process, one test at a time, but -n {workers} (pytest-xdist) asks for "
                "parallel workers; leave out -n (it is for the harness's own tests in tests/)")
    named = [(flag, "reorders the tests") for dest, flag in REORDERING_OPTIONS.items()
             if getattr(config.option, dest, False)]
    named += [(f"-p {name}", "shuffles the tests") for name in REORDERING_PLUGINS if has_plugin(name)]
    if named:  # --lf keeps the order: it leaves tests out, and the run is partial
        also = f" (and {', '.join(f for f, _ in named[1:])})" if len(named) > 1 else ""
        return f"{named[0][0]} {named[0][1]}{also}: {KEEPS_ORDER}; leave {named[0][0].split(' (')[0]} out"
    return last_failed_refusal(config.option, config.pluginmanager.get_plugin("lfplugin"),
                               getattr(config, "cache", None), specimen)


def last_failed_refusal(option, last_failed_plugin, cache, specimen: str) -> Optional[str]:
    """pytest keeps one last-failed list per folder: --lf after another specimen's run is refused."""
    recorded = cache.get(LAST_FAILED_SPECIMEN_KEY, None) if cache is not None else None
    if not selection_of(option, last_failed_plugin)["last_failed"] or recorded in (None, specimen):
        return None
    return (f"--lf: the last-failed list was written by a run of specimen {recorded!r}, and this run is of "
            f"{specimen!r}: its failures are not this specimen's. Rerun with --specimen {recorded} --lf, or run "
            f"{specimen!r} without --lf (`{spelled('-m pytest --cache-clear', 'python')}` empties the list)")


def order_refusal(items: list[tuple[str, str, int]], collected: list[str]) -> Optional[str]:
    """Why the tests about to run ((node id, file, line)) are not in the protocol's order (file names, definitions,
    variants as declared), naming the first out of place."""
    first_seen = {nodeid: index for index, nodeid in enumerate(collected)}
    expected = sorted(items, key=lambda item: (item[1], item[2], first_seen.get(item[0], len(first_seen))))
    for position, (actual, wanted) in enumerate(zip(items, expected)):
        if actual[0] != wanted[0]:
            return (f"the tests are not in the protocol's order: {actual[0]} would run at position {position + 1}, "
                    f"where {wanted[0]} belongs. An option or plugin reordered them (pytest's --ff, --nf or --sw, a "
                    f"random-order plugin, a conftest hook), or the command named the experiment files out of their "
                    f"order; {KEEPS_ORDER}")
    return None


def collection_refusal(experiments: bool, given: list[str], collect_only: bool, run: bool) -> Optional[str]:
    """Why the collected session must not run: the experiment's options and none of its tests (they would be silently
    ignored), or its tests and no record dir."""
    if experiments and not run and not collect_only:
        return "--record-dir DIR (or --runs-dir DIR) is required to run the experiments (use a new directory, e.g. " \
               "runs/first)"
    if not experiments and given and not collect_only:
        return (f"{', '.join(flag.split(' ')[0] for flag in given)}: options of the experiment, and this command "
                f"collects no experiment test; run them with the experiments folder: "
                f"{spelled('-m pytest experiments ' + ' '.join(given), 'python')}")
    return None
