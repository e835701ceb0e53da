"""verify on built runs (no model): a run as its session wrote it verifies; every kind of change to its files,
and every gap without evidence, is one problem line; an unfinished or partial run says so once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from inferlab import protocol
from inferlab.__main__ import main
from inferlab.run.records import MANIFEST_FILE, RECORDS_FILE
from inferlab.read.verify import integrity_problems, verify_run

from fixtures_records import copy_run, kill_after, refresh_manifest, rewrite_records
from fixture_runs import runs, shared  # noqa: F401 (fixtures)

complete_run = shared("complete_run", "complete", "The shared complete run (never change it: run_copy is a copy).")
failed_run = shared("failed_run", "failed", "The shared failed run.")


@pytest.fixture
def run_copy(complete_run, tmp_path) -> Path:
    return copy_run(complete_run, tmp_path / "copy")


def problems_of(directory: Path) -> list[str]:
    return verify_run(directory)["problems"]


def test_a_run_as_its_session_wrote_it_verifies_and_a_failed_runs_gaps_have_their_evidence_said_in_words(
        complete_run, failed_run, capsys):
    result = verify_run(complete_run)
    assert result["problems"] == [] and result["all_tests_passed"] and result["complete"]
    assert main(["verify", str(complete_run)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"verify: OK ({result['records']} records, ")
    result = verify_run(failed_run)  # the acquisition failed: every dependent test skipped, naming why
    assert result["problems"] == [] and not result["all_tests_passed"] and result["explained_gaps"]
    assert main(["verify", str(failed_run)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "{" not in last and "'" not in last, last
    assert re.search(r"not every test passed \(\d+ failed, \d+ passed, \d+ skipped\), and each of the \d+ gap\(s\) "
                     r"this leaves \(a record the protocol expects that is not there\) has its recorded "
                     r"evidence", last), last
    assert "nothing was measured: the specimen could not be acquired (" in last and "harness failed" not in last
    assert main(["verify", str(failed_run), "--all-passed"]) == 1
    assert re.search(r"^not every test passed: \d+ failed, \d+ passed, \d+ skipped$", capsys.readouterr().out, re.M)


def test_a_changed_byte_and_a_file_removed_or_added_after_the_session_are_each_named(run_copy, capsys):
    path = run_copy / RECORDS_FILE
    path.write_text(path.read_text().replace('"status": "ok"', '"status": "ok" ', 1))
    (run_copy / "report.md").unlink()
    (run_copy / "notes.txt").write_text("added by hand\n")
    problems = problems_of(run_copy)
    assert any(p.startswith(f"{RECORDS_FILE}: sha256 ") and "(file changed)" in p for p in problems), problems
    assert "report.md: listed in the manifest but missing" in problems
    assert "notes.txt: present but not listed in the manifest (added after the session)" in problems
    assert main(["verify", str(run_copy)]) == 1 and "problem(s)" in capsys.readouterr().out.splitlines()[-1]


def test_an_edited_tensor_is_caught_by_its_record_even_with_the_manifest_refreshed(run_copy):
    from safetensors.numpy import load_file, save_file

    tensor_file = next((run_copy / "tensors").glob("*.safetensors"))
    tensors = load_file(str(tensor_file))
    key = next(iter(tensors))
    tensors[key] = tensors[key] + 1
    save_file(tensors, str(tensor_file))
    refresh_manifest(run_copy)  # the inventory agrees with the file; the record's hash does not
    assert any(f"[{key}] sha256 " in p and "record says" in p for p in problems_of(run_copy))


def test_records_and_a_protocol_altered_with_the_inventory_refreshed_are_each_named_by_the_protocol_checks(run_copy):
    target = protocol.generation_trials()[5].test_id

    def edit(records):
        records = [r for r in records if r.get("trial_id") != target and not str(r.get("test")).endswith(f"[{target}]")]
        next(r for r in records if r["kind"] == "generation").update(status="failed", error="RuntimeError: x")
        records.append({**next(r for r in records if r["kind"] == "timing_trial")})  # a trial run twice
        criterion = next(r for r in records if r["kind"] == "cache_criterion")
        records.remove(criterion)
        return records + [criterion]  # declared after the first comparison

    rewrite_records(run_copy, edit)
    manifest = json.loads((run_copy / MANIFEST_FILE).read_text())
    manifest["protocol"]["seeds"] = [1, 2, 3]
    (run_copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    problems = problems_of(run_copy)
    assert f"generation {target}: no record and no failed, error or skipped outcome for a test with id [{target}]" \
        in problems
    assert any("status 'failed' but no failed or errored test outcome" in p for p in problems), problems
    assert any("2 records, expected 1 (no trial is regenerated)" in p for p in problems), problems
    assert "cache_criterion was recorded after the first cache_comparison; it must be declared first" in problems
    assert "protocol: manifest.json seeds: recorded [1, 2, 3], this checkout's inferlab.protocol has [17, 23, 31]" \
        in problems


def test_a_killed_run_says_so_once_and_still_reports_its_integrity_problems(runs, tmp_path):
    killed = kill_after(runs.copy("complete", tmp_path / "killed"), 10)
    result = verify_run(killed)
    assert len(result["completeness"]) == 1 and result["completeness"][0].startswith("unfinished: no session_end")
    assert integrity_problems(result) == [] and not result["complete"]
    lines = (killed / RECORDS_FILE).read_text().splitlines(keepends=True)
    (killed / RECORDS_FILE).write_text("".join(lines[:3] + lines[4:]))  # a record taken out, as an editor would
    result = verify_run(killed)
    assert result["completeness"] and any(f"{RECORDS_FILE}: seq is not" in p for p in integrity_problems(result))


def test_a_partial_run_says_so_once_and_a_test_that_ran_without_its_record_is_named(runs, tmp_path):
    partial = runs.copy("complete", tmp_path / "partial")
    plan = json.loads((partial / "plan.json").read_text())
    plan["partial_reasons"] = ["-k 'not test_timing_' deselected 24 protocol test(s)"]
    (partial / "plan.json").write_text(json.dumps(plan))
    rewrite_records(partial, lambda records: [r for r in records if r["kind"] != "cache_summary"])
    result = verify_run(partial)
    assert result["completeness"] == ["partial: -k 'not test_timing_' deselected 24 protocol test(s)"]
    assert any(p.startswith("no cache_summary record, and none of its producing tests (test_matched_prefix)")
               for p in result["problems"]), result["problems"]


def test_a_plan_folder_holds_a_plan_and_nothing_that_ran(runs, tmp_path):
    assert verify_run(runs.get("plan"))["problems"] == []
    folder = runs.copy("plan", tmp_path / "plan")
    rewrite_records(folder, lambda records: records + [{**records[0], "kind": "generation"}])
    assert any("a plan folder holds 1 record(s) besides the plan" in p for p in problems_of(folder))
