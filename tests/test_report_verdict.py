"""The report's verdict: one test per kind, from synthetic record dirs (no model).

Only a run that finished (session_end), uninterrupted, with the complete protocol, an outcome for every
planned test and every outcome passed may be called "every planned test passed".
"""

from __future__ import annotations

import json
from pathlib import Path

from inferlab import report
from inferlab.records import MANIFEST_FILE, PLAN_FILE, REPORT_FILE, write_json_atomic
from inferlab.report import verdict as verdicts

from fixtures_records import (
    abandon_finish,
    build_complete_run,
    build_failed_run_ended,
    build_rich_run,
    edit_manifest,
    kill_after,
    rerender,
)

PASSED = "Every planned test passed"
TIMING_DIVERGENCE = "experiments/test_50_timing.py::test_cache_divergence"


def headline(run: Path) -> str:
    text = (run / REPORT_FILE).read_text(encoding="utf-8")
    return next(line for line in text.splitlines() if line.startswith("**Verdict:**"))


def fail(test_suffix: str, message: str):
    """A transform that turns the outcome of the test ending in test_suffix into a failure with a message."""
    def transform(records):
        for record in records:
            if record["kind"] == "test_outcome" and record["test"].endswith(test_suffix):
                record.update(outcome="failed", longrepr=f"    def test():\n>       assert x\nE   {message}\n")
        return records
    return transform


def drop_outcomes(predicate):
    def transform(records):
        return [r for r in records if not (r["kind"] == "test_outcome" and predicate(r["test"]))]
    return transform


def test_a_complete_finished_run_with_every_test_passed_says_so(tmp_path):
    run = build_rich_run(tmp_path / "passed")
    assert report.verdict_of(run).kind == "passed"
    assert PASSED in headline(run) and "complete protocol" in headline(run)


def test_a_run_without_session_end_did_not_finish(tmp_path):
    run = build_rich_run(tmp_path / "killed", session_end=False)
    found = report.verdict_of(run)
    assert found.kind == "not_finished" and found.finished is None
    assert "**The run did not finish.**" in headline(run)
    assert PASSED not in (run / REPORT_FILE).read_text()


def test_an_interrupted_run_says_so_first_even_with_a_failed_diagnostic(tmp_path):
    def interrupted(records):
        records = fail("test_greedy_repetitions_identical", "greedy repetitions differ")(records)
        return drop_outcomes(lambda t: "test_60_memory" in t or "test_70_batching" in t)(records)

    run = build_rich_run(tmp_path / "interrupted", transform=interrupted,
                         session_end={"interrupted": True, "stop_reason": "interrupted by SIGINT",
                                      "exit_status": 2, "exit_code_name": "INTERRUPTED"})
    found = report.verdict_of(run)
    assert found.kinds[0] == "interrupted" and "diagnostic_failed" in found.kinds
    assert "**The run was interrupted** (interrupted by SIGINT)" in headline(run)
    assert PASSED not in (run / REPORT_FILE).read_text()


def test_an_abandoned_finish_is_never_called_passed_after_the_session(tmp_path, capsys):
    """A second Ctrl-C during the final writes: session_end exists, the manifest is still the start one."""
    from inferlab.__main__ import main

    run = abandon_finish(build_rich_run(tmp_path / "abandoned"))
    found = report.verdict_of(run, after_session=True)
    assert found.kind == "finish_abandoned" and "passed" not in found.kinds
    assert main(["report", str(run), "--write"]) == 0
    text = (run / REPORT_FILE).read_text()
    assert "**The run's final writes were abandoned.**" in headline(run)
    assert "Nothing in this folder is protected by the manifest's hashes." in headline(run)
    assert PASSED not in text and "the run finished" not in text
    assert main(["report", str(run), "--check"]) == 0
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    assert "final writes were abandoned" in capsys.readouterr().out


def test_during_the_session_an_unfinalised_manifest_is_expected(tmp_path):
    """The session renders before its final manifest: the default form must not read that as abandoned."""
    run = abandon_finish(build_rich_run(tmp_path / "in-session"))
    assert report.verdict_of(run).kind == "passed"
    assert report.check_pages(run) == []  # the page the session wrote


def test_the_page_a_session_wrote_before_abandoning_its_finish_fails_the_check(tmp_path, capsys):
    from inferlab.__main__ import main

    run = abandon_finish(build_rich_run(tmp_path / "stale"))
    assert main(["report", str(run), "--check"]) == 1
    assert "regenerated text differs" in capsys.readouterr().out


def test_a_killed_run_reported_later_says_its_files_are_unprotected(tmp_path):
    run = kill_after(build_rich_run(tmp_path / "killed"), tests_done=40)
    found = report.verdict_of(run, after_session=True)
    assert found.kind == "not_finished" and "finish_abandoned" not in found.kinds
    assert "Nothing in this folder is protected by the manifest's hashes." in found.headline


def test_a_run_stopped_by_maxfail_stopped_early(tmp_path):
    run = build_rich_run(tmp_path / "x", transform=drop_outcomes(lambda t: "test_50_timing" in t),
                         session_end={"stopped_early": True, "stop_reason": "-x/--maxfail after 1 failure"})
    assert report.verdict_of(run).kind == "stopped_early"
    assert "-x/--maxfail after 1 failure" in headline(run)


def test_a_partial_selection_is_not_the_complete_protocol_and_says_why(tmp_path):
    run = build_rich_run(tmp_path / "k", session_end={"protocol_complete": False,
                                                       "partial_reasons": ["-k P1: 40 of 66 tests selected"]})
    found = report.verdict_of(run)
    assert found.kind == "partial"
    assert "**Partial run: not the complete protocol.** Why: -k P1: 40 of 66 tests selected" in headline(run)


def test_plan_shortfalls_make_a_run_partial_even_without_partial_reasons(tmp_path):
    run = build_rich_run(tmp_path / "shortfall")
    plan = json.loads((run / PLAN_FILE).read_text())
    plan["shortfalls"] = ["cache_forwards: planned 0, the complete protocol has 16"]
    write_json_atomic(run / PLAN_FILE, plan)
    rerender(run)
    assert report.verdict_of(run).kind == "partial"
    assert "cache_forwards: planned 0" in headline(run)


def test_planned_tests_without_an_outcome_are_named_even_when_the_session_ended(tmp_path):
    run = build_rich_run(tmp_path / "missing", transform=drop_outcomes(lambda t: t.endswith("test_cache_divergence")))
    found = report.verdict_of(run)
    assert found.kind == "missing_outcomes"
    assert TIMING_DIVERGENCE in found.not_reached


def test_a_failed_acquisition_heads_the_page(tmp_path):
    run = build_failed_run_ended(tmp_path / "failed")
    found = report.verdict_of(run)
    assert found.kind == "acquisition_failed"
    assert "integrity_failed" not in found.kinds  # the acquisition is the subject, not a second finding
    assert "**The specimen could not be acquired, so nothing was measured.**" in headline(run)


def test_a_failed_integrity_check_is_a_harness_problem(tmp_path):
    run = build_rich_run(tmp_path / "integrity", transform=fail("test_cache_criterion_declared", "no criterion"))
    found = report.verdict_of(run)
    assert found.kind == "integrity_failed"
    assert "**1 harness-integrity check failed**" in headline(run)
    status = (run / REPORT_FILE).read_text().split("## Conditions")[0]
    assert "| F1 | `test_cache_criterion_declared` | integrity | call | no criterion |" in status


def test_a_failed_diagnostic_is_a_finding_not_a_broken_harness(tmp_path):
    run = build_rich_run(tmp_path / "diagnostic", transform=fail("test_loop_matches_generate", "loop ids differ"))
    found = report.verdict_of(run)
    assert found.kind == "diagnostic_failed" and found.kinds == ["diagnostic_failed"]
    line = headline(run)
    assert "**1 protocol diagnostic failed**, and every harness-integrity check that ran passed" in line
    assert "not mean the harness is broken" in line
    assert "| F1 | `test_loop_matches_generate` | diagnostic | call | loop ids differ |" in \
        (run / REPORT_FILE).read_text()


def test_both_kinds_failing_are_both_stated_integrity_first(tmp_path):
    def both(records):
        return fail("test_loop_matches_generate", "differ")(fail("test_cache_criterion_declared", "none")(records))

    run = build_rich_run(tmp_path / "both", transform=both)
    found = report.verdict_of(run)
    assert found.kinds == ["integrity_failed", "diagnostic_failed"]
    assert "read them after the integrity failure is fixed" in found.facts[0]


def test_skipped_tests_are_not_passed(tmp_path):
    def skip(records):
        for record in records:
            if record["kind"] == "test_outcome" and record["test"].endswith("test_cache_divergence"):
                record.update(outcome="skipped", skip_reason="not applicable: early EOS")
        return records

    run = build_rich_run(tmp_path / "skipped", transform=skip)
    assert report.verdict_of(run).kind == "skipped"
    assert "did not run** (skipped: not applicable: early EOS)" in headline(run)
    assert PASSED not in (run / REPORT_FILE).read_text()


def test_a_nonzero_exit_without_a_failed_test_is_not_a_pass(tmp_path):
    run = build_rich_run(tmp_path / "exit", session_end={"exit_status": 3, "exit_code_name": "INTERNAL_ERROR"})
    assert report.verdict_of(run).kind == "unexpected_exit"
    assert "exit status 3 (INTERNAL_ERROR)" in headline(run)


def test_collect_only_has_no_verdict(tmp_path):
    run = build_rich_run(tmp_path / "co", transform=drop_outcomes(lambda t: True),
                         session_end={"collect_only": True})
    assert report.verdict_of(run).kind == "collect_only"
    assert "only collected" in headline(run)


def test_damaged_records_are_never_called_every_test_passed(tmp_path):
    """One unreadable line of records.jsonl: what it held may be missing, so the run cannot be called passed."""
    run = build_rich_run(tmp_path / "damaged")
    lines = (run / "records.jsonl").read_text().splitlines(keepends=True)
    generation = next(i for i, line in enumerate(lines) if '"kind": "generation"' in line)
    lines[generation] = "{ this line was damaged\n"
    (run / "records.jsonl").write_text("".join(lines))
    rerender(run)
    found = report.verdict_of(run)
    assert found.kind == "records_damaged" and "passed" not in found.kinds
    assert PASSED not in (run / REPORT_FILE).read_text()
    assert "could not all be read" in headline(run) and "records.jsonl" in headline(run)


def test_a_plan_folder_is_a_plan_with_no_verdict(tmp_path):
    run = build_rich_run(tmp_path / "plan", transform=drop_outcomes(lambda t: True), session_end=False)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    edit_manifest(run, options={**manifest["options"], "plan": True})
    rerender(run)
    found = report.verdict_of(run)
    assert found.kind == "plan_only" and "not_finished" not in found.kinds
    assert "This folder is a plan" in headline(run)
    text = (run / REPORT_FILE).read_text()
    assert "## The plan" in text and "## What did not run" not in text


def test_an_environment_changed_during_the_run_heads_a_run_that_otherwise_passed(tmp_path):
    """Issue 26 B4: a source file edited while the run ran; never 'every planned test passed'."""
    run = build_rich_run(tmp_path / "edited", session_end={"environment_changed_during_run": [
        "source_sha256: experiments/test_40_cache.py"]})
    found = report.verdict_of(run)
    assert found.kind == "environment_changed" and "passed" not in found.kinds
    assert "source_sha256: experiments/test_40_cache.py" in headline(run)


def test_every_kind_has_a_test_here():
    source = Path(__file__).read_text()
    for kind in verdicts.KINDS:
        assert f'"{kind}"' in source, f"no test names verdict kind {kind}"


def test_check_kind_falls_back_to_the_plan_then_to_integrity(tmp_path):
    run = build_complete_run(tmp_path / "old")  # outcomes without check_kind
    plan = json.loads((run / PLAN_FILE).read_text())
    for entry in plan["schedule"]:
        if entry["test"].endswith("test_greedy_repetitions_identical"):
            entry["check_kind"] = "diagnostic"
    write_json_atomic(run / PLAN_FILE, plan)
    from inferlab.runview import RunView

    view = RunView.read(run)
    kinds = {o["test"].split("::")[-1]: view.check_kind(o) for o in view.outcomes}
    assert kinds["test_greedy_repetitions_identical"] == "diagnostic"
    assert kinds["test_loop_matches_generate"] == "integrity"
