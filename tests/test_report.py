"""report.md and its plots, rendered from synthetic record dirs (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlab import plots, protocol, report
from inferlab.__main__ import main
from inferlab.records import MANIFEST_FILE, PREDICTIONS_FILE, RECORDS_FILE, REPORT_FILE, dumps, write_json_atomic

from fixtures_records import SKIP_REASON, all_nodeids, build_complete_run, build_failed_run, copy_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory) -> Path:
    return build_complete_run(tmp_path_factory.mktemp("report") / "complete")


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory) -> Path:
    return build_failed_run(tmp_path_factory.mktemp("report") / "failed")


def section(text: str, heading: str) -> str:
    """The text of one '## ' section of the report."""
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_regenerated_report_equals_the_sessions_text(complete_run):
    assert report.render_report(complete_run) == (complete_run / REPORT_FILE).read_text(encoding="utf-8")


def test_regeneration_does_not_depend_on_the_directory_path(complete_run, tmp_path):
    moved = copy_run(complete_run, tmp_path / "elsewhere")
    assert report.render_report(moved) == (complete_run / REPORT_FILE).read_text(encoding="utf-8")


def test_cli_report_check_agrees_with_the_session(complete_run, capsys):
    assert main(["report", str(complete_run), "--check"]) == 0
    assert "identical" in capsys.readouterr().out


def test_cli_report_check_catches_an_edited_report(complete_run, tmp_path, capsys):
    run = copy_run(complete_run, tmp_path / "edited")
    (run / REPORT_FILE).write_text((run / REPORT_FILE).read_text() + "hindsight\n")
    assert main(["report", str(run), "--check"]) == 1
    assert "differs" in capsys.readouterr().out


def test_synthetic_specimen_gets_the_banner_at_the_top(complete_run):
    head = (complete_run / REPORT_FILE).read_text().splitlines()[:4]
    assert any(report.SYNTHETIC_BANNER in line for line in head)


def test_real_specimen_has_no_synthetic_banner(failed_run):
    assert report.SYNTHETIC_BANNER not in (failed_run / REPORT_FILE).read_text()


def test_all_26_trials_are_listed_with_their_ids(complete_run):
    generation = section((complete_run / REPORT_FILE).read_text(), "7. Generation")
    for trial in protocol.generation_trials():
        assert f"`{trial.test_id}`" in generation


def test_texts_are_escaped_so_tables_stay_intact(complete_run):
    generation = section((complete_run / REPORT_FILE).read_text(), "7. Generation")
    rows = [line for line in generation.splitlines() if line.startswith("| ") and ("-rep" in line or "-seed" in line)]
    assert len(rows) == len(protocol.generation_trials())
    # the fixture's texts hold '|' and newlines: escaped as \| and \n, every row stays one line with 7 cells
    assert any("\\|" in row for row in rows) and any("\\n" in row for row in rows)
    for row in rows:
        assert len(row.replace("\\|", "").split("|")) == 7 + 2


def test_timing_section_labels_the_stopping_rule_and_lists_every_sample(complete_run):
    timing = section((complete_run / REPORT_FILE).read_text(), "11. Timing")
    assert protocol.TIMING_STOPPING_RULE in timing
    for trial in protocol.timing_schedule():
        assert f"`{trial.test_id}`" in timing
    records = [json.loads(line) for line in (complete_run / RECORDS_FILE).read_text().splitlines()]
    summary = next(r for r in records if r["kind"] == "timing_summary")
    for value in summary["ttft_s"]["values"]:
        assert f"{value * 1e3:.3f}" in timing


def test_at_least_two_plots_are_written_and_linked(complete_run):
    text = (complete_run / REPORT_FILE).read_text()
    pngs = sorted(complete_run.glob("*.png"))
    assert len(pngs) >= 2
    for png in pngs:
        assert png.read_bytes().startswith(PNG_SIGNATURE)
        assert f"]({png.name})" in text


def test_plots_are_byte_identical_when_redrawn(complete_run, tmp_path):
    records = [json.loads(line) for line in (complete_run / RECORDS_FILE).read_text().splitlines()]
    results = plots.write_plots(tmp_path, records)
    assert all(r["written"] for r in results)
    for result in results:
        assert (tmp_path / result["file"]).read_bytes() == (complete_run / result["file"]).read_bytes()


def test_failed_run_report_names_the_failure_and_the_skip_reason(failed_run):
    text = (failed_run / REPORT_FILE).read_text()
    status = section(text, "1. Run status")
    skipped = len(all_nodeids()) - 2  # all but the passed thread check and the failed acquisition
    assert f"1 failed, 1 passed, {skipped} skipped" in status
    assert "test_acquisition" in status and "model.safetensors: sha256" in status
    assert SKIP_REASON in status
    # the gaps elsewhere point back to the labelled reason
    assert "not run: skipped, reason R1 (section 1)" in section(text, "7. Generation")


def test_failed_run_skips_plots_and_says_why(failed_run):
    text = (failed_run / REPORT_FILE).read_text()
    assert not list(failed_run.glob("*.png"))
    assert text.count("not drawn") >= 3
    assert report.render_report(failed_run) == text


def test_partial_and_malformed_records_never_crash_the_report(tmp_path):
    run = tmp_path / "partial"
    run.mkdir()
    odd = [
        {"kind": "generation", "test": "x::test_generation[P1-G-rep1]", "seq": 0, "prompt_id": "P1",
         "condition": "G", "seed": None, "repetition": 1},
        {"kind": "timing_trial", "test": None, "seq": 1, "schedule_index": 2, "warmup": False, "token_times": None},
        {"kind": "cache_comparison", "test": None, "seq": 2, "prefix_length": 9, "max_abs_diff": None},
        {"kind": "timing_summary", "test": None, "seq": 3, "prompt_id": "P1", "use_cache": True, "ttft_s": "odd"},
        {"kind": "memory", "test": None, "seq": 4, "unmeasured": ["activations", "workspace"]},
    ]
    (run / RECORDS_FILE).write_text("".join(dumps(r) + "\n" for r in odd) + "{not json\n", encoding="ascii")
    text = report.render_report(run)
    assert report.MISSING in text
    assert "records.jsonl:6: not a JSON object" in text
    assert "could not be rendered" not in text, text
    assert "- activations" in text


def test_supplied_predictions_are_named_with_their_hash_and_left_untouched(failed_run, tmp_path):
    run = copy_run(failed_run, tmp_path / "with-predictions")
    (run / PREDICTIONS_FILE).write_text("## 1.\nPrediction: identical | 90 %\n")
    before = (run / PREDICTIONS_FILE).read_bytes()
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    manifest["predictions"] = {"supplied": True, "copied_to": PREDICTIONS_FILE, "sha256": "f" * 64,
                               "source_mtime_utc": "2025-01-01T00:00:00+00:00"}
    write_json_atomic(run / MANIFEST_FILE, manifest)
    report.write_report(run)
    text = (run / REPORT_FILE).read_text()
    assert f"Supplied, see [{PREDICTIONS_FILE}]({PREDICTIONS_FILE}) (sha256 `{'f' * 64}`" in text
    assert (run / PREDICTIONS_FILE).read_bytes() == before


def test_without_predictions_the_report_says_none_were_supplied(complete_run):
    assert "No predictions were supplied" in section((complete_run / REPORT_FILE).read_text(), "2. Predictions")


def test_checklist_has_seven_items_with_status_and_file(complete_run, failed_run):
    complete = section((complete_run / REPORT_FILE).read_text(), "16. Submission checklist")
    rows = [line for line in complete.splitlines() if line[:4] in {f"| {n} " for n in range(1, 8)}]
    assert len(rows) == 7
    assert [row.split(" | ")[2] for row in rows[1:6]] == ["recorded"] * 5
    failed = section((failed_run / REPORT_FILE).read_text(), "16. Submission checklist")
    assert "**missing**: input x0 (expected 3); generation x0 (expected 26)" in failed


def test_conclusions_scaffold_is_marked_as_prompts_with_numbers(complete_run):
    scaffold = section((complete_run / REPORT_FILE).read_text(), "17. Your conclusions")
    assert "prompts for you, the learner, not conclusions" in scaffold
    assert "On selection" in scaffold and "On computation" in scaffold
    assert scaffold.count("**Limitation") == 2
    assert "cache max abs diff over 8 prefixes" in scaffold


def test_code_span_escapes_pipes_and_backticks():
    assert report.code("a|b") == "`a\\|b`"
    assert report.code("a`b") == "``a`b``"
    assert report.code("a|b", in_table=False) == "`a|b`"
    assert report.jstr("x\ny") == '`"x\\ny"`'
