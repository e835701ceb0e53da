"""The report's verdict, one test per kind, on the shared complete run's variants in memory (tests/fixture_runs.py)
and on copied folders where a file is the subject. Only a run that finished, uninterrupted, with the complete
protocol and every planned test's outcome passed may be called "every planned test passed"."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlab import report
from inferlab.__main__ import main
from inferlab.read.runview import RunView
from inferlab.run.records import REPORT_FILE
from inferlab.specimen import acquisition_next_steps

from fixtures_records import abandon_finish, build_rich_run, kill_after, rerender
from fixture_runs import RunData, plots_not_drawn, runs, shared  # noqa: F401 (fixtures)

PASSED = "Every planned test passed"
TIMING_DIVERGENCE = "experiments/test_50_timing.py::test_cache_divergence"
INTERRUPTED = {"interrupted": True, "stop_reason": "interrupted by SIGINT", "exit_status": 2,
               "exit_code_name": "INTERRUPTED"}


def headline(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("**Verdict:**"))


def file_headline(run: Path) -> str:
    return headline((run / REPORT_FILE).read_text(encoding="utf-8"))


complete = shared("complete", "complete", "The shared complete run in memory: every variant below is "
                  "build_rich_run's, made from it without a disk.", in_memory=True)


def judged(data: RunData, after_session: bool = False) -> tuple[report.Verdict, str]:
    """The verdict of a run in memory and report.md's text, as the session renders it."""
    view = data.view()
    return report.decide(view, after_session=after_session), report.render_report(view, after_session=after_session)


def outcome(test_suffix: str, **fields):
    """A transform that changes the outcome of the test ending in test_suffix to these fields."""
    def transform(records):
        for record in records:
            if record["kind"] == "test_outcome" and record["test"].endswith(test_suffix):
                record.update(fields)
        return records
    return transform


def fail(test_suffix: str, message: str):
    """The test ending in test_suffix failed with this message."""
    return outcome(test_suffix, outcome="failed", longrepr=f"    def test():\n>       assert x\nE   {message}\n")


def drop_outcomes(predicate):
    def transform(records):
        return [r for r in records if not (r["kind"] == "test_outcome" and predicate(r["test"]))]
    return transform


def test_a_variant_in_memory_is_the_run_build_rich_run_writes(complete, runs, tmp_path):
    interrupted = drop_outcomes(lambda t: "test_70_batching" in t)
    built = build_rich_run(tmp_path / "built", transform=interrupted, session_end=INTERRUPTED,
                           base=runs.get("complete"))
    data = complete.rich(transform=interrupted, session_end=INTERRUPTED)
    assert data.records == RunData.read(built).records
    assert report.render_report(data.view()) == (built / REPORT_FILE).read_text()
    assert report.decide(data.view()) == report.decide(built)


def test_an_interrupted_run_says_so_first_even_with_a_failed_diagnostic(complete):
    def interrupted(records):
        records = fail("test_greedy_repetitions_identical", "greedy repetitions differ")(records)
        return drop_outcomes(lambda t: "test_60_memory" in t or "test_70_batching" in t)(records)

    found, page = judged(complete.rich(transform=interrupted, session_end=INTERRUPTED))
    assert found.kinds[0] == "interrupted" and "diagnostic_failed" in found.kinds
    assert "**The run was interrupted** (interrupted by SIGINT)" in headline(page)
    assert PASSED not in page


def test_an_abandoned_finish_is_expected_during_the_session_never_passed_after_it_and_unprotected_as_a_killed_run(
        runs, tmp_path, capsys, plots_not_drawn):
    run = abandon_finish(runs.copy("rich", tmp_path / "abandoned"))  # a second Ctrl-C during the final writes
    # the session renders before its final manifest, so the default form does not read that as abandoned; once the
    # session is over, the page it wrote no longer says what the folder holds
    assert report.decide(run).kind == "passed" and report.check(run).status == "identical"
    assert main(["report", str(run), "--check"]) == 1
    assert "regenerated text differs" in capsys.readouterr().out
    found = report.decide(run, after_session=True)
    assert found.kind == "finish_abandoned" and "passed" not in found.kinds
    report.write_report(run, after_session=True)
    text = (run / REPORT_FILE).read_text()
    assert "**The run's final writes were abandoned.**" in file_headline(run)
    assert "Nothing in this folder is protected by the manifest's hashes." in file_headline(run)
    assert PASSED not in text and "the run finished" not in text
    assert main(["report", str(run), "--check"]) == 0
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    assert "final writes were abandoned" in capsys.readouterr().out
    killed = report.decide(kill_after(runs.copy("rich", tmp_path / "killed"), tests_done=40), after_session=True)
    assert killed.kind == "not_finished" and "finish_abandoned" not in killed.kinds  # killed: unprotected too
    assert "Nothing in this folder is protected by the manifest's hashes." in killed.headline


@pytest.mark.parametrize("session_end, transform, kind, said", [
    (False, None, "not_finished", "**The run did not finish.**"),
    ({"stopped_early": True, "stop_reason": "-x/--maxfail after 1 failure"},
     drop_outcomes(lambda t: "test_50_timing" in t), "stopped_early", "-x/--maxfail after 1 failure"),
    ({"protocol_complete": False, "partial_reasons": ["-k P1: 40 of 66 tests selected"]}, None, "partial",
     "**Partial run: not the complete protocol.** Why: -k P1: 40 of 66 tests selected"),
    (None, outcome("test_cache_divergence", outcome="skipped", skip_reason="not applicable: early EOS"), "skipped",
     "did not run** (skipped: not applicable: early EOS)"),
    ({"exit_status": 3, "exit_code_name": "INTERNAL_ERROR"}, None, "unexpected_exit", "exit status 3 (INTERNAL_ERROR)"),
    ({"collect_only": True}, drop_outcomes(lambda t: True), "collect_only", "only collected"),
    # issue 26 B4: a source file edited while the run ran
    ({"environment_changed_during_run": ["source_sha256: experiments/test_40_cache.py"]}, None, "environment_changed",
     "source_sha256: experiments/test_40_cache.py"),
], ids=["no-session-end", "maxfail", "partial", "skipped", "nonzero-exit", "collect-only", "environment-changed"])
def test_a_run_that_did_not_simply_pass_says_what_it_is_first_and_is_never_called_passed(complete, session_end,
                                                                                          transform, kind, said):
    found, page = judged(complete.rich(session_end=session_end, transform=transform))
    assert found.kind == kind and "passed" not in found.kinds
    assert said in headline(page) and PASSED not in page


def test_a_plan_with_shortfalls_is_not_the_complete_protocol(complete):
    def shortfall(plan):
        plan["shortfalls"] = ["cache_forwards: planned 0, the complete protocol has 16"]
        return plan

    found, page = judged(complete.rich().changed(plan=shortfall))  # without partial_reasons: the plan says it
    assert found.kind == "partial" and "cache_forwards: planned 0" in headline(page)


def test_planned_tests_without_an_outcome_are_named_even_when_the_session_ended(complete):
    found, _ = judged(complete.rich(transform=drop_outcomes(lambda t: t.endswith("test_cache_divergence"))))
    assert found.kind == "missing_outcomes"
    assert TIMING_DIVERGENCE in found.not_reached


def test_a_failed_acquisition_heads_a_short_page_with_the_reason_and_the_next_steps(runs):
    run = runs.get("failed_ended")
    found = report.decide(run)
    assert found.kind == "acquisition_failed"
    assert "integrity_failed" not in found.kinds  # the acquisition is the subject, not a second finding
    assert "**The specimen could not be acquired, so nothing was measured.**" in file_headline(run)
    text = (run / REPORT_FILE).read_text(encoding="utf-8")
    assert len(text.splitlines()) < 60 and "## Inputs" not in text
    assert text.index("## What happened") < text.index("## What to do next")
    assert all(f"- {step}" in text for step in acquisition_next_steps(RunView.read(run).specimen_spec()))


def test_a_failed_integrity_check_is_a_harness_problem_a_failed_diagnostic_a_finding_read_after_it(complete):
    found, page = judged(complete.rich(transform=fail("test_cache_criterion_declared", "no criterion")))
    assert found.kind == "integrity_failed"
    assert "**1 harness-integrity check failed**" in headline(page)
    status = page.split("## The questions")[0]
    assert "| F1 | `test_cache_criterion_declared` | integrity | call | no criterion |" in status
    found, page = judged(complete.rich(transform=fail("test_loop_matches_generate", "loop ids differ")))
    assert found.kinds == ["diagnostic_failed"]
    assert "**1 protocol diagnostic failed**, and every harness-integrity check that ran passed" in headline(page)
    assert "not mean the harness is broken" in headline(page)
    assert "| F1 | `test_loop_matches_generate` | diagnostic | call | loop ids differ |" in page
    found, _ = judged(complete.rich(transform=lambda records: fail("test_loop_matches_generate", "differ")(
        fail("test_cache_criterion_declared", "none")(records))))
    assert found.kinds == ["integrity_failed", "diagnostic_failed"]
    assert "read them after the integrity failure is fixed" in found.facts[0]


def test_damaged_records_are_never_called_every_test_passed(runs, tmp_path):
    run = runs.copy("rich", tmp_path / "damaged")
    lines = (run / "records.jsonl").read_text().splitlines(keepends=True)
    generation = next(i for i, line in enumerate(lines) if '"kind": "generation"' in line)
    lines[generation] = "{ this line was damaged\n"
    (run / "records.jsonl").write_text("".join(lines))
    rerender(run)
    found = report.decide(run)
    assert found.kind == "records_damaged" and "passed" not in found.kinds
    assert PASSED not in (run / REPORT_FILE).read_text()
    assert "could not all be read" in file_headline(run) and "records.jsonl" in file_headline(run)


def test_a_complete_finished_run_with_every_test_passed_says_so_unless_its_forward_count_is_over_the_plan(complete):
    """Issue 33 part 6 b: a failed harness-integrity fact of the whole session, never 'every planned test passed'."""
    from inferlab.run import endings as session_status, plan

    budget = plan.forward_budget(complete.plan["schedule"])
    trial = next(t for t in budget["by_test"] if "test_generation_trial[" in t)
    over = session_status.reconcile_forwards(budget["at_most"] + 1, {trial: budget["at_most"] + 1}, budget)
    found, page = judged(complete.rich(session_end={"forward_reconciliation": over}))
    assert found.kind == "forwards_unreconciled" and "passed" not in found.kinds
    assert (f"forwards: the session ran {budget['at_most'] + 1}, the plan allows at most {budget['at_most']}"
            in found.headline)
    within = session_status.reconcile_forwards(16, {trial: 16}, budget)
    found, page = judged(complete.rich(session_end={"forward_reconciliation": within}))
    assert found.kind == "passed" and PASSED in headline(page) and "complete protocol" in headline(page)


def test_every_kind_has_a_test_here():
    source = Path(__file__).read_text()
    for kind in report.KINDS:
        assert f'"{kind}"' in source, f"no test names verdict kind {kind}"


def test_check_kind_falls_back_to_the_plan_then_to_integrity(complete):
    def diagnostic_in_the_plan(plan):
        for entry in plan["schedule"]:
            if entry["test"].endswith("test_greedy_repetitions_identical"):
                entry["check_kind"] = "diagnostic"
        return plan

    view = complete.changed(plan=diagnostic_in_the_plan).view()  # outcomes without check_kind
    assert all("check_kind" not in o for o in complete.records if o["kind"] == "test_outcome")
    kinds = {o["test"].split("::")[-1]: view.check_kind(o) for o in view.outcomes}
    assert kinds["test_greedy_repetitions_identical"] == "diagnostic"
    assert kinds["test_loop_matches_generate"] == "integrity"
