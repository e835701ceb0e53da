"""verify's checks of how the session ended and of its plan: the one line for an unfinished or partial run, the
session_end record against the records, plan.json against the protocol, and a plan folder (--plan)."""

from __future__ import annotations

from inferlab import protocol
from inferlab.base.records import MANIFEST_FILE, PLAN_FILE, RECORDS_FILE
from inferlab.reading.runview import bracket_id
from inferlab.run import plan, session_status
from inferlab.verify.checker import Checker


def read_plan(checker: Checker) -> None:
    """State plan.json's reading problems and take its data."""
    for problem in checker.view.problems_of(PLAN_FILE):
        checker.reading_problem(problem)
    checker.plan = checker.view.plan


def read_ending(checker: Checker) -> None:
    """What the records say about the session's end and the plan: which missing tests are explained."""
    view = checker.view
    checker.end = view.session_end
    read_plan(checker)
    checker.partial = view.plan_partial_reasons()
    checker.unfinished = view.unfinished
    checker.live = False
    if view.ending == "killed" and isinstance(view.claim, dict):  # no session_end: killed, or still running
        from inferlab.run.live_claim import claimant

        found = claimant(view.claim)
        if found.live:
            checker.live = True
            checker.unfinished = (f"no session_end record yet: the run is LIVE, its session still running ("
                                  f"{found.why}), so these are not its final records; verify it again once the "
                                  f"session has ended")
    checker.unreached = view.unreached
    checker.final_records_missing = bool(checker.unfinished and checker.manifest is not None
                                         and not view.final_manifest_written)


def is_complete(checker: Checker) -> bool:
    """The one definition of a complete run, which verify states and grade reads (verify_run's `complete`): the
    records could be read and the session reached its end (not unfinished), its plan is the complete protocol (no
    partial reason), every planned test has an outcome, and both the session_end record and the manifest say
    complete. Anything else is not the complete protocol, whatever one of those says alone."""
    view = checker.view
    return bool(checker.end is not None and not checker.unfinished and not checker.partial
                and checker.plan is not None and view.planned and not view.planned_without_outcome()
                and checker.end.get("complete") is True
                and checker.manifest is not None and checker.manifest.get("complete") is True)


def report_ending(checker: Checker) -> None:
    """The one line for an unfinished run and the one line for a partial plan (both problems), put first; they are
    also the run's completeness lines (checker.completeness), which grade shows as why the run is not complete."""
    found_so_far, checker.problems = checker.problems, []
    schedule = checker.view.schedule
    if checker.unfinished:
        line = f"unfinished: {checker.unfinished}"
        if checker.view.ending == "killed" and not checker.live:  # what the claim says: its process gone (renamed?) or still running
            from inferlab.run.ended import killed_detail

            line += killed_detail(checker.view.claim, checker.view.rename_note)
        if schedule and not (checker.end or {}).get("collect_only"):
            first = next((n for n in schedule if n in checker.unreached), None)
            line += f"; {len(checker.unreached)} of {len(schedule)} planned tests have no outcome" + \
                (f" (the first: {first})" if first else "")
        if checker.final_records_missing:
            line += (f"; its manifest is the one written when the run began (complete is "
                     f"{checker.manifest.get('complete')!r}, no file inventory), so no file hash can be checked")
        checker.problem(line)
    if checker.partial:
        more = len(checker.partial) - 1
        checker.problem(f"partial: {checker.partial[0]}" + (f" (and {more} more shortfall(s): {PLAN_FILE} "
                                                              f"partial_reasons)" if more else ""))
    checker.completeness = list(checker.problems)
    checker.problems += found_so_far


def check_plan(checker: Checker) -> None:
    """One plan record; plan.json within the caps, naming every shortfall; every planned test has an outcome;
    the trials planned, and the tests run, in protocol order."""
    view = checker.view
    if len(checker.of_kind("plan")) != 1:
        checker.problem(f"{RECORDS_FILE}: {len(checker.of_kind('plan'))} plan record(s), expected exactly 1")
    if checker.plan is None:
        return
    totals = checker.plan.get("totals") or {}
    for violation in protocol.cap_violations(totals):
        checker.problem(f"{PLAN_FILE}: {violation}")
    # The totals are rechecked here: a shortfall the plan does not name is a plan that hides one.
    for reason in protocol.shortfalls(totals):
        if reason not in checker.partial:
            checker.problem(f"{PLAN_FILE}: not the complete protocol: {reason}, and its partial_reasons do not "
                            f"say so")
    for entry in view.planned:
        if entry.get("test") in checker.unreached:
            checker.suppressed += 1
            checker.suppressed_outcomes += 1
        elif entry.get("test") not in view.with_outcome:
            checker.problem(f"{PLAN_FILE}: planned test {entry.get('test')} has no recorded outcome")
    planned = [bracket_id(e.get("test")) for e in view.planned]
    expected_generation = [t.test_id for t in protocol.generation_trials()]
    expected_timing = [t.test_id for t in protocol.timing_schedule()]
    for name, expected in (("generation", expected_generation), ("timing", expected_timing)):
        order = [p for p in planned if p in expected]
        if order != [p for p in expected if p in order]:
            checker.problem(f"{PLAN_FILE}: {name} trials are not in protocol order: {order}")
    # the tests ran in the plan's order
    plan_index = {e.get("test"): i for i, e in enumerate(view.planned)}
    run_order = [plan_index[r["test"]] for r in checker.of_kind("test_outcome") if r.get("test") in plan_index]
    first_seen = list(dict.fromkeys(run_order))
    if first_seen != sorted(first_seen):
        checker.problem(f"{RECORDS_FILE}: tests did not run in the order of {PLAN_FILE}")


def check_session_end(checker: Checker) -> None:
    """The session_end record against the records; how it ended is said once, by report_ending."""
    view = checker.view
    ends = checker.of_kind("session_end")
    if not ends:
        return
    if len(ends) > 1:
        checker.problem(f"{RECORDS_FILE}: {len(ends)} session_end records, expected exactly 1")
    end = ends[-1]
    if end.get("plan_only"):
        checker.problem(f"{RECORDS_FILE}: session_end says this is a plan, but the records hold test outcomes")
    interrupted_as_said = end.get("interrupted") and end.get("exit_code_name") == "INTERRUPTED"
    if end.get("exit_code_name") not in ("OK", "TESTS_FAILED") and not interrupted_as_said:
        checker.problem(f"session_end: exit status {end.get('exit_status')} ({end.get('exit_code_name')})")
    missing = end.get("tests_without_outcome") or []
    if missing and not checker.unfinished:
        checker.problem(f"session_end: {len(missing)} planned test(s) have no outcome, e.g. {missing[0]}")
    without = view.planned_without_outcome()
    if checker.plan is not None and set(missing) != set(without):
        checker.problem(f"session_end: tests_without_outcome lists {len(missing)} test(s), but {PLAN_FILE} and "
                        f"the test_outcome records leave {len(without)} planned test(s) without an outcome")
    changed = end.get("environment_changed_during_run") or []
    if changed:
        checker.problem(f"session_end: the environment changed during the run ({'; '.join(map(str, changed))}): "
                        f"the source hashes and versions in {MANIFEST_FILE} were taken at its start and may not "
                        f"describe the code that ran")
    check_forwards(checker, end)
    if checker.manifest is not None and checker.manifest.get("complete") != end.get("complete") \
            and not checker.final_records_missing:
        checker.problem(f"{MANIFEST_FILE}: complete is {checker.manifest.get('complete')!r} but session_end says "
                        f"{end.get('complete')!r}")


def check_plan_folder(checker: Checker) -> None:
    """A plan folder: one plan record, one plan_only session_end, nothing that ran, and a plan within the caps."""
    read_plan(checker)
    if len(checker.of_kind("plan")) != 1:
        checker.problem(f"{RECORDS_FILE}: {len(checker.of_kind('plan'))} plan record(s), expected exactly 1")
    ends = checker.of_kind("session_end")
    if len(ends) != 1:
        checker.problem(f"{RECORDS_FILE}: {len(ends)} session_end record(s), expected exactly 1"
                        + (" (the plan was never finished)" if not ends else ""))
    elif not ends[0].get("plan_only"):
        checker.problem("session_end: plan_only is not true in a folder whose manifest says it is a plan")
    ran = [r for r in checker.records if r.get("kind") not in ("plan", "session_end")]
    if ran:
        checker.problem(f"{RECORDS_FILE}: a plan folder holds {len(ran)} record(s) besides the plan, e.g. "
                        f"{ran[0].get('kind')!r} (seq {ran[0].get('seq')})")
    if checker.plan is not None:
        for violation in protocol.cap_violations(checker.plan.get("totals") or {}):
            checker.problem(f"{PLAN_FILE}: {violation}")


def check_forwards(checker: Checker, end: dict) -> None:
    """session_end's forward_reconciliation, recomputed from its counts and plan.json's budgets: each problem it
    finds is a failed harness-integrity fact, and no record's forward window may hold more than its test ran."""
    reconciliation = end.get("forward_reconciliation")
    if end.get("collect_only"):
        return
    if not isinstance(reconciliation, dict):
        checker.not_checked.append("the session's forward count: session_end has no forward_reconciliation (a run "
                                   "written before it was recorded)")
        return
    counted, by_test = reconciliation.get("counted"), reconciliation.get("by_test")
    if not isinstance(counted, int) or not isinstance(by_test, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("forwards"), int) for v in by_test.values()):
        checker.problem(f"session_end: forward_reconciliation holds no usable counted and by_test counts: "
                        f"{reconciliation!r:.200}")
        return
    forwards = {nodeid: entry["forwards"] for nodeid, entry in by_test.items()}
    entries = (checker.plan or {}).get("schedule") or []
    budget = plan.forward_budget(entries)
    expected = session_status.reconcile_forwards(counted, {k: v for k, v in forwards.items() if v}, budget)
    if checker.plan is not None:
        if reconciliation.get("planned_at_most") != expected["planned_at_most"]:
            checker.problem(f"session_end: forward_reconciliation planned_at_most is "
                            f"{reconciliation.get('planned_at_most')!r}, {PLAN_FILE}'s budgets give "
                            f"{expected['planned_at_most']}")
        if reconciliation.get("ok") is not expected["ok"]:
            checker.problem(f"session_end: forward_reconciliation says ok {reconciliation.get('ok')!r}, its counts "
                            f"against {PLAN_FILE} give {expected['ok']}")
    for line in expected["problems"] if checker.plan is not None else reconciliation.get("problems") or []:
        checker.problem(f"session_end: harness integrity failed: {line}")
    for record in checker.records:
        window = record.get("forward_mode")
        if isinstance(window, dict) and isinstance(window.get("forwards"), int) \
                and window["forwards"] > forwards.get(record.get("test"), 0):
            checker.problem(f"{RECORDS_FILE} seq {record.get('seq')}: its forward_mode counts {window['forwards']} "
                            f"forwards, more than the {forwards.get(record.get('test'), 0)} the session counted for "
                            f"its test {record.get('test')}")
