"""python -m inferlab verify and compare on synthetic record dirs (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlab import protocol
from inferlab.__main__ import main
from inferlab.base.records import MANIFEST_FILE, RECORDS_FILE, write_json_atomic
from inferlab.measure import summaries
from inferlab.report.compare import compare, format_compare
from inferlab.run.plan import plan_totals
from inferlab.verify import verify_run

from fixtures_records import (
    copy_run,
    edit_manifest,
    generation_nodeid,
    kill_after,
    refresh_manifest,
    rerender,
    rewrite_records,
    session_end_record,
)
from fixture_runs import plots_not_drawn, runs, shared  # noqa: F401 (fixtures)


complete_run = shared("complete_run", "complete", "The shared complete run (never change it: run_copy is a copy).")
second_run = shared("second_run", "complete_again", "A second build of the same run.")
failed_run = shared("failed_run", "failed", "The shared failed run.")


@pytest.fixture
def run_copy(complete_run, tmp_path) -> Path:
    return copy_run(complete_run, tmp_path / "copy")


def problems_of(directory: Path) -> list[str]:
    return verify_run(directory)["problems"]


# --- verify ----------------------------------------------------------------------------------


def test_complete_synthetic_run_verifies(complete_run, capsys):
    result = verify_run(complete_run)
    assert result["problems"] == []
    assert result["all_tests_passed"] and result["explained_gaps"] == []
    assert main(["verify", str(complete_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"verify: OK ({result['records']} records, ")  # the verdict is the last line
    assert all(line.startswith("not checked: ") for line in lines[:-1])  # what the built run does not let it check


def test_one_changed_character_in_records_is_caught(run_copy, capsys):
    path = run_copy / RECORDS_FILE
    text = path.read_text()
    index = text.index('"generated_ids": [') + len('"generated_ids": [')
    digit = text[index]
    path.write_text(text[:index] + ("1" if digit != "1" else "2") + text[index + 1:])
    problems = problems_of(run_copy)
    assert any(p.startswith(f"{RECORDS_FILE}: sha256 ") and "file changed" in p for p in problems), problems
    assert main(["verify", str(run_copy)]) == 1
    assert "problem(s)" in capsys.readouterr().out


@pytest.mark.slow
def test_deleted_file_is_caught(runs, tmp_path):
    run = runs.copy("rich_plots", tmp_path / "copy")  # a run whose report drew its plots
    (run / "plot_token_times.png").unlink()
    assert "plot_token_times.png: listed in the manifest but missing" in problems_of(run)


def test_unlisted_file_is_caught(run_copy):
    (run_copy / "notes.txt").write_text("added later\n")
    assert "notes.txt: present but not listed in the manifest (added after the session)" in problems_of(run_copy)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # inside the last tensor's data, so the file still parses
    path.write_bytes(bytes(data))


def test_edited_tensor_is_caught_by_the_manifest(run_copy):
    _flip_last_byte(run_copy / "tensors" / "cache_logits.safetensors")
    problems = problems_of(run_copy)
    assert any(p.startswith("tensors/cache_logits.safetensors: sha256") for p in problems), problems


def test_edited_tensor_is_caught_by_its_record_even_with_a_refreshed_manifest(run_copy):
    _flip_last_byte(run_copy / "tensors" / "cache_logits.safetensors")
    refresh_manifest(run_copy)
    problems = problems_of(run_copy)
    assert len(problems) == 1 and "cache_logits.safetensors[uncached/prefix_16] sha256" in problems[0], problems


def test_incomplete_manifest_is_a_problem(run_copy):
    manifest = json.loads((run_copy / MANIFEST_FILE).read_text())
    manifest["complete"] = False
    write_json_atomic(run_copy / MANIFEST_FILE, manifest)
    assert any("complete is False, expected true" in p for p in problems_of(run_copy))


def test_failed_run_with_its_evidence_verifies_but_is_not_all_passed(failed_run, capsys):
    result = verify_run(failed_run)
    assert result["problems"] == [], result["problems"]
    assert not result["all_tests_passed"]
    assert any(g.startswith("generation P1-G-rep1 missing: explained by") for g in result["explained_gaps"])
    assert main(["verify", str(failed_run)]) == 0
    assert "not every test passed" in capsys.readouterr().out
    assert main(["verify", "--all-passed", str(failed_run)]) == 1


def test_missing_trial_without_evidence_is_a_problem(run_copy):
    target = "P2-S3-seed23"
    rewrite_records(run_copy, lambda records: [r for r in records if not (r.get("test") or "").endswith(f"[{target}]")])
    problems = problems_of(run_copy)
    assert f"generation {target}: no record and no failed, error or skipped outcome for a test with id [{target}]" \
        in problems
    assert any("has no recorded outcome" in p for p in problems)


def test_failure_without_a_longrepr_is_a_problem(run_copy):
    def fail_silently(records):
        outcome = next(r for r in records if r["kind"] == "test_outcome" and r["test"].endswith("[P1-G-rep2]"))
        outcome.update(outcome="failed", longrepr=None)
        return records

    rewrite_records(run_copy, fail_silently)
    assert any("failed with no longrepr (no evidence)" in p for p in problems_of(run_copy))


def test_timing_records_out_of_schedule_order_are_a_problem(run_copy):
    def swap(records):
        indices = [i for i, r in enumerate(records) if r["kind"] == "timing_trial"][2:4]
        records[indices[0]], records[indices[1]] = records[indices[1]], records[indices[0]]
        return records

    rewrite_records(run_copy, swap)
    assert any(p.startswith("timing_trial records are not in schedule order") for p in problems_of(run_copy))


def test_generation_over_budget_is_a_problem(run_copy):
    def extend(records):
        record = next(r for r in records if r["kind"] == "generation")
        record["generated_ids"] = record["generated_ids"] + [1]
        record["generated_length"] += 1
        return records

    rewrite_records(run_copy, extend)
    expected = (f"generation P1-G-rep1: {protocol.MAX_NEW_TOKENS + 1} new tokens, "
                f"the budget is {protocol.MAX_NEW_TOKENS}")
    assert expected in problems_of(run_copy)


def test_criterion_declared_after_the_errors_is_a_problem(run_copy):
    def move_criterion(records):
        criterion = next(r for r in records if r["kind"] == "cache_criterion")
        records.remove(criterion)
        last = max(i for i, r in enumerate(records) if r["kind"] == "cache_comparison")
        records.insert(last + 1, criterion)
        return records

    rewrite_records(run_copy, move_criterion)
    assert any("cache_criterion was recorded after" in p for p in problems_of(run_copy))


def test_unreadable_record_line_is_a_problem(run_copy):
    rewrite_records(run_copy, lambda records: records)
    with open(run_copy / RECORDS_FILE, "a") as handle:
        handle.write("{truncated\n")
    refresh_manifest(run_copy)
    assert any(p.startswith(f"{RECORDS_FILE}:") and "not a JSON object" in p for p in problems_of(run_copy))


# --- compare ---------------------------------------------------------------------------------


def test_compare_of_two_identical_runs_shows_every_id_equal(complete_run, second_run, capsys):
    result = compare(complete_run, second_run)
    assert [row["equal"] for row in result["generation"]] == [True] * len(protocol.generation_trials())
    assert [row["equal"] for row in result["timing_ids"]] == [True] * len(protocol.timing_schedule())
    assert result["tensors"] and all(row["max_abs_diff"] == 0.0 and row["bitwise_equal"] for row in result["tensors"])
    assert all(row["ratio_dir2_over_dir1"] == 1.0 for row in result["timing_ratios"])
    assert result["environment"] == []
    assert main(["compare", str(complete_run), str(second_run)]) == 0
    out = capsys.readouterr().out
    assert f"generation trials (exact generated ids): {len(protocol.generation_trials())} of " \
           f"{len(protocol.generation_trials())} equal" in out


def test_compare_reports_one_changed_generated_id(complete_run, run_copy):
    def change(records):
        record = next(r for r in records if r["kind"] == "generation" and r["test"].endswith("[P2-S2-seed31]"))
        record["generated_ids"][3] += 1
        return records

    rewrite_records(run_copy, change)
    result = compare(complete_run, run_copy)
    changed = [row for row in result["generation"] if not row["equal"]]
    assert changed == [{"trial": "P2-S2-seed31", "equal": False, "first_difference": 3,
                        "status": "differ from index 3"}]
    lines = [line.split() for line in format_compare(result).splitlines()]
    assert ["P2-S2-seed31", "differ", "from", "index", "3"] in lines
    assert f"{len(protocol.generation_trials()) - 1} of {len(protocol.generation_trials())} equal" in \
        format_compare(result)


def test_compare_reports_tensor_and_environment_differences(complete_run, run_copy):
    _flip_last_byte(run_copy / "tensors" / "first_step_logits.safetensors")
    manifest = json.loads((run_copy / MANIFEST_FILE).read_text())
    manifest["distributions"]["torch"] = "9.9.9"
    write_json_atomic(run_copy / MANIFEST_FILE, manifest)
    result = compare(complete_run, run_copy)
    differing = [row for row in result["tensors"] if not row["bitwise_equal"]]
    assert [(row["key"], row["status"]) for row in differing] == [("P2/S3", "differ")]
    assert differing[0]["max_abs_diff"] > 0
    assert {"section": "distributions", "name": "torch", "dir1": "2.13.0", "dir2": "9.9.9"} in result["environment"]


def test_compare_of_an_unreadable_dir_exits_2(complete_run, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(complete_run), str(empty)]) == 2
    assert f"{empty} is not a run's record dir: it has no records.jsonl" in capsys.readouterr().err


def test_compare_of_a_run_whose_records_are_gone_exits_2(complete_run, run_copy, capsys):
    (run_copy / RECORDS_FILE).unlink()
    assert main(["compare", str(complete_run), str(run_copy)]) == 2
    assert "records.jsonl: missing" in capsys.readouterr().err


def test_records_out_of_seq_order_are_a_problem(run_copy):
    lines = (run_copy / RECORDS_FILE).read_text().splitlines(keepends=True)
    lines[3], lines[4] = lines[4], lines[3]
    (run_copy / RECORDS_FILE).write_text("".join(lines))
    refresh_manifest(run_copy)
    assert f"{RECORDS_FILE}: seq is not 0..{len(lines) - 1} in order; record 4 has seq 4, expected 3" \
        in problems_of(run_copy)


def test_missing_report_is_a_problem(run_copy):
    (run_copy / "report.md").unlink()
    refresh_manifest(run_copy)
    assert problems_of(run_copy) == ["report.md: missing (it is written at session end, also after failures)"]


# --- how the session ended (issue 15.2), plan folders (15.12), artifacts in compare (15.11) ------------


def test_a_run_without_session_end_is_not_finished(run_copy):
    rewrite_records(run_copy, lambda records: [r for r in records if r["kind"] != "session_end"])
    assert any("no session_end record: the session never reached its end" in p for p in problems_of(run_copy))


def test_an_interrupted_session_end_is_a_problem_even_with_every_file_intact(run_copy):
    def interrupt(records):
        end = next(r for r in records if r["kind"] == "session_end")
        end.update(interrupted=True, signals=["SIGINT"], stopped_early=True, stop_reason="interrupted by SIGINT",
                   complete=False, exit_status=2, exit_code_name="INTERRUPTED")
        return records

    rewrite_records(run_copy, interrupt)
    problems = problems_of(run_copy)
    assert "unfinished: interrupted by SIGINT; 0 of 66 planned tests have no outcome" in problems
    assert any("complete is True but session_end says False" in p for p in problems)


def test_a_killed_run_verifies_as_unfinished_and_its_report_can_still_be_written(run_copy, capsys, plots_not_drawn):
    kill_after(run_copy, tests_done=40)
    problems = problems_of(run_copy)
    assert any("no session_end record" in p for p in problems)
    assert any("complete is False" in p for p in problems)
    assert main(["report", "--write", str(run_copy)]) == 0
    err = capsys.readouterr().err
    assert "has no session_end record" in err and "the run is not complete" in err
    assert (run_copy / "report.md").is_file()
    manifest = json.loads((run_copy / MANIFEST_FILE).read_text())
    assert manifest["complete"] is False  # writing a report never promotes the run


def test_a_plan_folder_is_recognised_and_refused_like_every_command_refuses_it(runs, capsys):
    folder = runs.get("plan")
    result = verify_run(folder)
    assert result["problems"] == [] and result["plan_folder"] is True
    for argv in (["verify", str(folder)], ["verify", "--all-passed", str(folder)], ["report", "--write", str(folder)]):
        assert main(argv) == 2
        assert "is a plan folder (written by --plan): no test ran" in capsys.readouterr().err
    assert not (folder / "report.md").exists()


def test_a_plan_folder_with_test_records_is_a_problem(runs, tmp_path):
    folder = runs.copy("plan", tmp_path / "plan")

    def add_outcome(records):
        return records[:1] + [{"kind": "generation", "test": "x", "seq": 0, "wall_time": "t"}] + records[1:]

    rewrite_records(folder, add_outcome)
    assert any("a plan folder holds 1 record(s) besides the plan" in p for p in problems_of(folder))


def test_compare_reports_every_artifact_hash_difference(complete_run, run_copy):
    def change(records):
        for record in records:
            if record["kind"] == "artifact_file" and record["name"] in ("tokenizer.json", "model.safetensors"):
                record["sha256"] = "ff" * 32
        return records

    rewrite_records(run_copy, change)
    result = compare(complete_run, run_copy)
    differing = [row["file"] for row in result["artifacts"] if not row["equal"]]
    assert differing == ["tokenizer.json", "model.safetensors"]
    text = format_compare(result)
    assert f"artifacts (sha256 and size of every file each run verified): 4 of 6 equal" in text
    assert "ff" * 32 in text


def test_compare_of_equal_artifacts_says_so(complete_run, second_run):
    rows = compare(complete_run, second_run)["artifacts"]
    assert len(rows) == len(protocol.ALLOWLISTED_FILES) and all(row["equal"] for row in rows)


def test_check_artifacts_accepts_a_valid_copy_and_names_a_bad_file(standin_copy, capsys):
    assert main(["check-artifacts", str(standin_copy), "--specimen", "standin"]) == 0
    assert "is a valid copy" in capsys.readouterr().out
    (standin_copy / "tokenizer_config.json").write_text("{}\n")
    assert main(["check-artifacts", str(standin_copy), "--specimen", "standin"]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM tokenizer_config.json" in out and "is NOT a valid copy" in out


# --- a folder that is not a run is refused, never written into ------------------------------------------


@pytest.mark.parametrize("mode", [["--write"], ["--check"], []])
def test_report_refuses_a_folder_that_is_not_a_run_and_leaves_its_report_alone(tmp_path, capsys, mode):
    folder = tmp_path / "my-notes"
    folder.mkdir()
    mine = "# My own report\n\nNothing to do with inferlab.\n"
    (folder / "report.md").write_text(mine)
    assert main(["report", str(folder), *mode]) == 2
    captured = capsys.readouterr()
    assert f"report: {folder} is not a run's record dir" in captured.err and "planned tests" not in captured.out
    assert (folder / "report.md").read_text() == mine
    assert sorted(p.name for p in folder.iterdir()) == ["report.md"]


def test_files_named_like_a_runs_are_not_enough_to_be_a_run(tmp_path, capsys):
    folder = tmp_path / "extension"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"name": "a browser extension", "version": "1"}\n')
    assert main(["report", "--write", str(folder)]) == 2
    assert "its manifest.json is not a run's" in capsys.readouterr().err
    assert not (folder / "report.md").exists()


def test_verify_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert f"verify: {tmp_path} is not a run's record dir" in captured.err and captured.out == ""


def test_a_killed_run_with_only_its_claim_is_still_a_run(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "claim.json").write_text('{"pid": 1}\n')
    assert main(["verify", str(folder)]) == 1  # a run, unfinished: its problems are listed
    assert "is not a run's record dir" not in capsys.readouterr().err


# --- unfinished and partial runs: said once, and only real problems listed (issue: verify's 150 lines) ----


def interrupt_after(directory: Path, tests_done: int) -> str:
    """What a Ctrl-C after `tests_done` outcomes leaves: the next test (a generation trial) recorded its trial as
    failed with the KeyboardInterrupt and re-raised, so it has no outcome; session_end says interrupted; the
    final manifest says complete false. Returns the node id of the test that was cut short."""
    cut_short = {}

    def cut(records):
        kept, outcomes = [], 0
        for record in records:
            if record["kind"] == "session_end":
                continue
            if outcomes >= tests_done:
                break
            kept.append(record)
            outcomes += record["kind"] == "test_outcome"
        done = {r["test"] for r in kept if r["kind"] == "test_outcome"}
        trial = next(t for t in protocol.generation_trials() if generation_nodeid(t) not in done)
        cut_short["test"] = generation_nodeid(trial)
        kept.append({"kind": "generation", "test": cut_short["test"], "seq": 0, "wall_time": "t",
                     "trial_id": trial.test_id, "prompt_id": trial.prompt_id, "condition": trial.condition,
                     "seed": trial.seed, "repetition": trial.repetition, "status": "failed",
                     "error": "KeyboardInterrupt: SIGINT received"})
        kept.append(session_end_record(kept, interrupted=True, signals=["SIGINT"], stopped_early=True,
                                       stop_reason="interrupted by SIGINT", complete=False, exit_status=2,
                                       exit_code_name="INTERRUPTED"))
        return kept

    rewrite_records(directory, cut)
    edit_manifest(directory, complete=False, status="the run did NOT finish (interrupted by SIGINT)")
    rerender(directory)  # the session writes its report from the records it kept, as after any Ctrl-C
    return cut_short["test"]


def test_an_interrupted_run_says_so_once_and_lists_no_record_it_never_reached(run_copy, capsys):
    cut_short = interrupt_after(run_copy, tests_done=20)
    result = verify_run(run_copy)
    assert result["problems"] == [
        f"unfinished: interrupted by SIGINT; 46 of 66 planned tests have no outcome (the first: {cut_short})"]
    assert result["unfinished"] == "interrupted by SIGINT" and result["not_listed"] > 40
    # The trial that the Ctrl-C cut short recorded its failure and has no outcome: that is no contradiction.
    assert any(f"its test {cut_short} was cut short (interrupted by SIGINT)" in note
               for note in result["explained_gaps"])
    assert main(["verify", str(run_copy)]) == 1  # not a complete run, but a readable answer
    out = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("not checked: ")]
    assert len(out) == 2 and out[1].startswith(f"verify: 1 problem(s) in {run_copy}; not listed: ")
    # Issue 26 B10: the outcomes it does not list are counted as the line above counts the tests (46 of 66).
    assert result["not_listed_outcomes"] == 46 and result["not_listed"] == 46 + result["not_listed_records"]
    assert (f"not listed: 46 missing test outcome(s) and {result['not_listed_records']} missing record(s) of the "
            f"tests the run left out or never reached") in out[1]


def test_an_interrupted_run_still_reports_its_integrity_problems(run_copy):
    cut_short = interrupt_after(run_copy, tests_done=20)

    def contradict(records):  # a failed trial whose test passed, and a record no test was cut short in
        trial = next(r for r in records if r["kind"] == "generation" and r["status"] == "ok")
        trial.update(status="failed", error="RuntimeError: x")
        return records

    rewrite_records(run_copy, contradict)
    _flip_last_byte(run_copy / "tensors" / "first_step_logits.safetensors")
    lines = (run_copy / RECORDS_FILE).read_text().splitlines(keepends=True)
    del lines[5]
    (run_copy / RECORDS_FILE).write_text("".join(lines))
    problems = problems_of(run_copy)
    assert problems[0].startswith("unfinished: interrupted by SIGINT")
    assert any("tensors/first_step_logits.safetensors: sha256" in p for p in problems), problems
    assert any("records.jsonl: seq is not 0.." in p for p in problems), problems
    assert any("status 'failed' but no failed or errored test outcome" in p for p in problems), problems
    assert not any(cut_short in p for p in problems[1:]), problems


def test_a_killed_run_says_so_once(run_copy):
    kill_after(run_copy, tests_done=40)
    (problem,) = problems_of(run_copy)
    assert problem.startswith("unfinished: no session_end record: the session never reached its end (it was killed "
                              "or crashed); its process (pid 4242 on fixture-host) runs on another machine, so "
                              "whether it still runs is not known here; 26 of 66 planned tests have no outcome (the "
                              "first: ")
    assert problem.endswith("its manifest is the one written when the run began (complete is False, no file "
                            "inventory), so no file hash can be checked")


def test_a_killed_run_still_reports_a_damaged_record_line(run_copy):
    kill_after(run_copy, tests_done=40)
    with open(run_copy / RECORDS_FILE, "a") as handle:
        handle.write('{"kind": "generation", "te')  # the line SIGKILL cut in half
    problems = problems_of(run_copy)
    assert problems[0].startswith("unfinished: no session_end record")
    assert any("not a JSON object" in p for p in problems), problems


def partial_run(directory: Path, left_out: str) -> None:
    """Deselect every test whose node id contains `left_out`, as -k 'not ...' would: gone from the plan and
    the records, and the plan and session_end say why."""
    plan = json.loads((directory / "plan.json").read_text())
    plan["schedule"] = [e for e in plan["schedule"] if left_out not in e["test"]]
    plan["totals"] = plan_totals(plan["schedule"])  # as the plan of such a selection counts them
    reasons = [f"-k 'not {left_out}' deselected 24 protocol test(s)", *protocol.shortfalls(plan["totals"]),
               "experiments/test_50_timing.py: 3 of 27"]
    plan.update(partial_reasons=reasons, protocol_complete=False)
    write_json_atomic(directory / "plan.json", plan)

    def drop(records):
        kept = [r for r in records if left_out not in (r.get("test") or "") and r["kind"] != "session_end"]
        kept = [r for r in kept if not (r["kind"] == "timing_summary")]
        # the checks that read the timing trials ran on what was left of them, as they would in such a session
        trials = [r for r in kept if r["kind"] == "timing_trial"]
        generations = [r for r in kept if r["kind"] == "generation"]
        for record in kept:
            if record["kind"] == "cache_divergence":
                record.update(summaries.cache_divergence(trials, record["prompt_id"]))
            elif record["kind"] == "loop_vs_generate":
                record.update(summaries.loop_vs_generate(trials, generations, record["prompt_id"]))
        return kept + [session_end_record(kept, plan["schedule"], protocol_complete=False, partial_reasons=reasons,
                                          complete=False, tests_without_outcome=[])]

    rewrite_records(directory, drop)
    edit_manifest(directory, complete=False)
    refresh_manifest(directory)


def test_a_partial_run_says_so_once_and_lists_no_record_of_a_deselected_test(run_copy, capsys):
    partial_run(run_copy, "test_timing_")
    result = verify_run(run_copy)
    assert result["problems"] == ["partial: -k 'not test_timing_' deselected 24 protocol test(s) (and 3 more "
                                  "shortfall(s): plan.json partial_reasons)"], result["problems"]
    assert result["not_listed"] == len(protocol.timing_schedule()) + 4  # each trial, and each summary
    assert main(["verify", str(run_copy)]) == 1


def test_a_partial_run_still_reports_a_missing_record_of_a_test_that_ran(run_copy):
    partial_run(run_copy, "test_timing_")
    rewrite_records(run_copy, lambda records: [r for r in records if r["kind"] != "cache_summary"])
    problems = problems_of(run_copy)
    assert "no cache_summary record, and none of its producing tests (test_matched_prefix) has a failed, error or " \
           "skipped outcome" in problems


def test_a_plan_that_falls_short_without_saying_so_is_a_problem(run_copy):
    plan = json.loads((run_copy / "plan.json").read_text())
    plan["totals"]["generation_trials"] = 3
    plan.update(partial_reasons=[], protocol_complete=True)
    write_json_atomic(run_copy / "plan.json", plan)
    refresh_manifest(run_copy)
    assert any("generation_trials: planned 3" in p and "its partial_reasons do not say so" in p
               for p in problems_of(run_copy))


def test_check_artifacts_says_an_absent_optional_file_is_absent_and_why(tmp_path, capsys):
    from inferlab.specimen.check import ABSENT_FROM_COPY

    # pythia-14m's spec does not pin generation_config.json either way: absent from a copy, it is fine.
    assert main(["check-artifacts", str(tmp_path)]) == 1  # the required files are missing
    lines = capsys.readouterr().out.splitlines()
    assert f"ok      generation_config.json: absent (optional): {ABSENT_FROM_COPY}" in lines
    assert "PROBLEM config.json: missing" in lines
    assert not any("None" in line for line in lines), lines


def test_check_artifacts_says_a_missing_pinned_optional_file_is_a_problem(standin_copy, capsys):
    (standin_copy / "generation_config.json").unlink()  # the stand-in's spec pins it present
    assert main(["check-artifacts", str(standin_copy), "--specimen", "standin"]) == 1
    assert "PROBLEM generation_config.json: missing" in capsys.readouterr().out.splitlines()


@pytest.mark.process
@pytest.mark.parametrize("command", [["verify"], ["report"], ["compare", "SAME"]])
def test_a_reader_that_closed_the_pipe_ends_the_command_quietly(complete_run, second_run, command):
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` that has already gone: the first write meets a closed pipe
    args = [str(second_run) if word == "SAME" else word for word in command] + [str(complete_run)]
    done = subprocess.run([sys.executable, "-m", "inferlab", *args], stdout=write_end, stderr=subprocess.PIPE,
                          text=True, cwd=Path(__file__).resolve().parents[1], timeout=120)
    os.close(write_end)
    assert done.stderr == "" and done.returncode == 141


def test_a_plan_from_before_partial_reasons_falls_short_by_its_totals(run_copy):
    plan = json.loads((run_copy / "plan.json").read_text())
    assert "partial_reasons" not in plan  # the fixture writes the older plan format
    plan["totals"]["generation_trials"] = 3
    write_json_atomic(run_copy / "plan.json", plan)
    refresh_manifest(run_copy)
    assert problems_of(run_copy)[0].startswith("partial: generation_trials: planned 3")


# --- compare, as a new user read it (issue 26 B9) ----------------------------------------------------------------


def test_compare_names_only_the_specimen_fields_that_differ(complete_run, run_copy):
    manifest = json.loads((run_copy / MANIFEST_FILE).read_text())
    manifest["specimen"] = {**manifest["specimen"], "name": "replica", "revision": "f" * 40}
    write_json_atomic(run_copy / MANIFEST_FILE, manifest)
    result = compare(complete_run, run_copy)
    rows = [(r["name"], r["dir2"]) for r in result["environment"] if r["section"] == "specimen"]
    assert rows == [("name", "replica"), ("revision", "f" * 40)]
    text = format_compare(result)
    assert "  specimen.name: dir1=standin  dir2=replica" in text
    assert max(len(line) for line in text.splitlines() if line.startswith("  specimen.")) < 200


def test_compare_does_not_count_the_acquisition_method_as_an_artifact(complete_run, run_copy):
    def built(records):
        for record in records:
            if record["kind"] == "artifact_acquisition":
                record["acquisition"] = "built_offline"
        return records

    rewrite_records(run_copy, built)
    result = compare(complete_run, run_copy)
    assert [row["file"] for row in result["artifacts"]] == list(protocol.ALLOWLISTED_FILES)
    assert result["acquisition"] == {"dir1": "reuse:project_cache", "dir2": "built_offline", "equal": False}
    text = format_compare(result)
    assert "6 of 6 equal" in text and "of 7" not in text
    assert "acquisition (how each run got its files; not an artifact): dir1=reuse:project_cache  dir2=built_offline" \
        in text


def test_compare_says_when_a_run_did_not_finish(complete_run, run_copy):
    rewrite_records(run_copy, lambda records: [r for r in records if r["kind"] != "session_end"])
    text = format_compare(compare(complete_run, run_copy))
    lines = text.splitlines()
    assert lines[0].endswith("(finished, the complete protocol)")
    assert "(UNFINISHED: no session_end record (the session was killed or crashed)" in lines[1]
    assert "a ratio away from 1 is no finding by itself" in text
