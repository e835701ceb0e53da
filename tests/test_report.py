"""report.md and report-details.md, rendered from synthetic record dirs (no model): the shared fixture runs
(tests/fixture_runs.py), copied where a test changes one, and their variants rendered in memory."""

from __future__ import annotations

import json
import math

import numpy
import pytest

from inferlab import protocol, report
from inferlab.__main__ import main
from inferlab.files import dumps, write_json_atomic
from inferlab.run.records import MANIFEST_FILE, PREDICTIONS_FILE, RECORDS_FILE, REPORT_FILE
from inferlab.read.runview import RunView
from inferlab.report import details, logits, tables
from inferlab.specimen import acquisition_next_steps

from fixtures_records import (
    BANDWIDTH_BYTES_PER_S,
    CACHE_BYTES_PER_POSITION,
    CLOCK_READS_PER_TRIAL,
    EOS_ID,
    INTERRUPT_ERROR,
    SKIP_REASON,
    TYPED_COMMAND,
    build_complete_run,
    build_rich_run,
    copy_run,
    edit_manifest,
    fail_generation,
    interrupt_at_generation,
)
from fixture_runs import RunData, plots_not_drawn, runs, shared, fixture_runs  # noqa: F401 (fixtures)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DETAILS_FILE = report.DETAILS_FILE


rich_run = shared("rich_run", "rich", "The shared rich run (never change it: copy it).")
failed_run = shared("failed_run", "failed_ended", "The shared failed run, ended as the current plugin ends it, "
                    "with the report its session wrote.")
complete = shared("complete", "complete", "The shared complete run in memory, from which rich() makes "
                  "build_rich_run's variants without a disk.", in_memory=True)


Pages = dict  # {report.md: text, report-details.md: text} of a run in memory


def rendered(data: RunData) -> Pages:
    """Both pages of a run in memory, as its session would have written them."""
    return report.render_pages(data.view())


def page(run, name: str = REPORT_FILE) -> str:
    """One page of a record dir (its file) or of a run in memory (rendered)."""
    return run[name] if isinstance(run, dict) else (run / name).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text of one '## ' section."""
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every Markdown table in `text`, split into cells (escaped pipes kept inside cells)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = line.replace("\\|", "\0").strip("|").split("|")
            rows.append([c.strip().replace("\0", "\\|") for c in cells])
    return rows


# --- both pages, regenerated from the records alone -----------------------------------------------------


def test_both_pages_regenerate_byte_for_byte(rich_run):
    pages = report.render_pages(rich_run)
    assert set(pages) == {REPORT_FILE, DETAILS_FILE}
    for name, text in pages.items():
        assert text == page(rich_run, name)


def test_regeneration_does_not_depend_on_the_directory_path(rich_run, tmp_path):
    moved = copy_run(rich_run, tmp_path / "elsewhere")
    assert report.render_pages(moved) == {name: page(rich_run, name) for name in report.PAGES}


def test_cli_report_check_agrees_with_the_session(rich_run, capsys):
    assert main(["report", str(rich_run), "--check"]) == 0
    assert "identical" in capsys.readouterr().out


@pytest.mark.parametrize("name", [REPORT_FILE, DETAILS_FILE])
def test_cli_report_check_catches_an_edit_of_either_page(rich_run, tmp_path, capsys, name):
    run = copy_run(rich_run, tmp_path / "edited")
    (run / name).write_text(page(run, name) + "hindsight\n", encoding="utf-8")
    assert main(["report", str(run), "--check"]) == 1
    assert f"differs from {run / name}" in capsys.readouterr().out


def test_cli_report_check_names_a_missing_details_page(rich_run, tmp_path, capsys):
    run = copy_run(rich_run, tmp_path / "no-details")
    (run / DETAILS_FILE).unlink()
    assert main(["report", str(run), "--check"]) == 1
    assert f"{run / DETAILS_FILE} does not exist" in capsys.readouterr().out


def test_every_details_link_of_the_page_names_a_heading_of_the_details_page(rich_run):
    headings = {details.slug(line[3:]) for line in page(rich_run, DETAILS_FILE).splitlines() if line.startswith("## ")}
    links = [part.split(")")[0] for part in page(rich_run).split(f"]({DETAILS_FILE}#")[1:]]
    assert links and set(links) <= headings
    assert set(details.slug(s) for s in details.SECTIONS) <= headings


# --- the learner's page: length and content -------------------------------------------------------------


def test_stand_in_page_fits_a_learners_read(rich_run):
    lines = page(rich_run).splitlines()
    assert 150 <= len(lines) <= 250, len(lines)


def test_synthetic_specimen_gets_the_banner_at_the_top(rich_run):
    assert any(report.SYNTHETIC_BANNER in line for line in page(rich_run).splitlines()[:4])


def test_real_specimen_has_no_synthetic_banner(failed_run):
    assert report.SYNTHETIC_BANNER not in page(failed_run)


def test_conditions_table_gives_temperature_top_p_top_k_and_seeds(rich_run):
    rows = {row[0]: row for row in table_rows(section(page(rich_run), "Conditions"))}
    assert rows["**G**"][1:5] == ["greedy", "inactive", "inactive", "inactive"]
    assert rows["**S2**"][2:5] == ["0.5", "1", "0 (disabled)"]
    assert rows["**S3**"][2:5] == ["1", "0.8", "0 (disabled)"]
    assert rows["**S1**"][5] == "17, 23, 31 + seed 17 again"


def test_all_26_trials_are_numbered_from_one_in_protocol_order(rich_run):
    rows = table_rows(section(page(rich_run), "Generation trials"))[1:]
    assert [row[0] for row in rows] == [str(n) for n in range(1, 27)]
    assert [row[1] for row in rows] == [f"`{t.test_id}`" for t in protocol.generation_trials()]


def test_trial_texts_are_escaped_and_ids_abbreviated(rich_run):
    rows = table_rows(section(page(rich_run), "Generation trials"))[1:]
    # the fixture's texts hold '|' and newlines: escaped as \| and \n, so every row keeps its 7 cells
    assert all(len(row) == 7 for row in rows)
    assert any("\\|" in row[5] for row in rows) and any("\\n" in row[5] for row in rows)
    assert all(row[6].count(" ") <= 4 and "…" in row[6] for row in rows if row[3] == "16")


def test_repeated_ids_point_to_the_first_trial_that_selected_them(rich_run):
    rows = {row[1]: row for row in table_rows(section(page(rich_run), "Generation trials"))[1:]}
    assert rows["`P1-G-rep2`"][4] == "#1" and rows["`P1-G-rep1`"][4] == ""
    assert rows["`P1-S1-seed17-rerun`"][4] == "#4"


def test_empty_decoded_text_shows_as_an_empty_json_string(complete):
    def empty_first_trial(records):
        trial = next(r for r in records if r["kind"] == "generation")
        trial.update(generated_ids=[50300], text="", generated_length=1, stop_reason="max_new_tokens")
        return records

    run = rendered(complete.rich(transform=empty_first_trial))
    row = table_rows(section(page(run), "Generation trials"))[1]
    assert row[5] == '`""`'
    assert "could not be rendered" not in page(run) + page(run, DETAILS_FILE)


def test_null_token_pieces_render_on_the_details_page(rich_run):
    inputs = section(page(rich_run, DETAILS_FILE), "Inputs")
    assert '`[null, "w' in inputs


def test_repeatability_shows_how_the_rerun_cache_was_fresh(rich_run):
    rows = table_rows(section(page(rich_run), "Repeatability"))[1:]
    assert [row[0] for row in rows] == ["P1", "P2"]
    assert "fresh cache: yes (a new DynamicCache per generate() call)" in rows[0][2]


# --- trials that produced nothing: failed, interrupted, never reached -------------------------------------

INTERRUPTED = {"interrupted": True, "signals": ["SIGINT"], "stop_reason": "interrupted by SIGINT", "exit_status": 2,
               "exit_code_name": "INTERRUPTED"}


def repeatability_of(run) -> dict[str, list[str]]:
    return {row[0]: row for row in table_rows(section(page(run), "Repeatability"))[1:]}


@pytest.fixture(scope="module")
def failed_trials_run(tmp_path_factory) -> Pages:
    """P1's third greedy repetition and its S1 seed 31 failed; the other trials are the rich run's."""
    def fail_two(records):
        return fail_generation(fail_generation(records, "P1-G-rep3"), "P1-S1-seed31")

    return rendered(fixture_runs(tmp_path_factory).data("complete").rich(transform=fail_two))


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory) -> Pages:
    """Ctrl-C during P2's first greedy repetition: P1's twelve trials ran, nothing after that trial did."""
    return rendered(fixture_runs(tmp_path_factory).data("complete").rich(
        transform=lambda records: interrupt_at_generation(records, "P2-G-rep1"), session_end=INTERRUPTED))


def test_a_failed_greedy_repetition_leaves_identity_undecided_not_false(failed_trials_run):
    row = repeatability_of(failed_trials_run)["P1"]
    assert row[1] == "2 of 3 recorded, 1 failed: not decidable"
    scaffold = section(page(failed_trials_run), "Your conclusions")
    assert "Greedy repetitions identical: P1 2 of 3 recorded, 1 failed: not decidable, P2 yes." in scaffold
    assert "24 of 26 trials produced ids (2 failed)" in scaffold


def test_recorded_greedy_repetitions_that_differ_are_a_no_even_with_one_failed(complete):
    def differ(records):
        second = next(r for r in records if r["kind"] == "generation" and r["trial_id"] == "P1-G-rep2")
        second["generated_ids"] = second["generated_ids"][:-1] + [second["generated_ids"][-1] % 50 + 1]
        return fail_generation(records, "P1-G-rep3")

    run = rendered(complete.rich(transform=differ))
    assert repeatability_of(run)["P1"][1] == "**no** (2 of 3 recorded, 1 failed)"


def test_distinct_continuations_count_only_trials_that_produced_ids(failed_trials_run):
    row = repeatability_of(failed_trials_run)["P1"]
    assert row[3] == "S1 2/2 (1 failed), S2 3/3, S3 3/3"


def test_a_failed_trial_is_labelled_failed_with_its_outcome(failed_trials_run):
    rows = {r[1]: r for r in table_rows(section(page(failed_trials_run), "Generation trials"))[1:]}
    assert rows["`P1-G-rep3`"][2] == "**failed** (failed, F1)"


def test_early_eos_means_before_the_last_allowed_token(complete):
    def eos_as_last_token(records):
        for record in records:
            if record["kind"] == "generation" and record["trial_id"] == "P1-S3-seed17":
                ids = record["generated_ids"][:-1] + [EOS_ID]
                assert len(ids) == protocol.MAX_NEW_TOKENS
                record.update(generated_ids=ids, stop_reason="eos", generated_length=len(ids))
        return records

    run = rendered(complete.rich(transform=eos_as_last_token))
    rows = repeatability_of(run)
    # the fixture's only early stop per prompt is S2 seed 23 (6 tokens); EOS as token 16 of 16 is not early
    assert rows["P1"][4] == rows["P2"][4] == "1 of 12"
    assert f"early EOS (before token {protocol.MAX_NEW_TOKENS}, first runs)" in table_rows(
        section(page(run), "Repeatability"))[0]


def test_early_eos_counts_only_recorded_trials(failed_trials_run):
    assert repeatability_of(failed_trials_run)["P1"][4] == "1 of 10 (2 failed)"


def test_a_prompt_with_no_trial_run_says_not_run_instead_of_counts(interrupted_run):
    row = repeatability_of(interrupted_run)["P2"]
    assert row[1] == "0 of 3 recorded, 1 interrupted, 2 not run: not decidable"
    assert row[2] == "not run"
    assert row[3] == "S1 not run, S2 not run, S3 not run"
    assert row[4] == "none recorded (1 interrupted, 11 not run)"
    assert repeatability_of(interrupted_run)["P1"][2] == "not decidable: first run ok, rerun not run"


def test_a_trial_cut_off_by_the_interrupt_is_interrupted_not_failed(interrupted_run):
    rows = {r[1]: r for r in table_rows(section(page(interrupted_run), "Generation trials"))[1:]}
    assert rows["`P2-G-rep1`"][2] == f"interrupted ({INTERRUPT_ERROR})"
    assert rows["`P2-G-rep2`"][2] == "not run (not reached: the run was interrupted (SIGINT))"
    assert "**failed**" not in section(page(interrupted_run), "Generation trials")


def test_records_an_interrupted_run_never_reached_are_explained_by_the_interrupt(interrupted_run):
    text = page(interrupted_run) + page(interrupted_run, DETAILS_FILE)
    assert "no record and no outcome explains it" not in text
    cache = section(page(interrupted_run), "Cache: matched prefixes")
    assert "No `cache_criterion` record (not reached: the run was interrupted (SIGINT))." in cache


def test_records_of_a_run_that_did_not_finish_are_explained_by_that(complete):
    run = rendered(complete.rich(transform=lambda records: interrupt_at_generation(records, "P2-G-rep1"),
                                 session_end=False))
    assert "No `cache_criterion` record (not reached: the run did not finish)." in page(run)
    assert "no record and no outcome explains it" not in page(run) + page(run, DETAILS_FILE)


def test_checklist_says_how_many_records_are_present_of_how_many(interrupted_run):
    rows = table_rows(section(page(interrupted_run), "Submission checklist"))[1:]
    assert "generation: 13 of 26 recorded" in rows[3][2] and "missing generation" not in rows[3][2]
    assert rows[3][2].startswith("**partial**: ")
    assert rows[3][2].endswith("; not reached: the run was interrupted (SIGINT)")


# --- first-step distribution ---------------------------------------------------------------------------


def test_entropy_top_p_and_temperature_follow_the_spec_example():
    vector = numpy.log(numpy.array([8.0, 4.0, 2.0, 1.0]))
    probs = logits.probabilities(vector)
    assert numpy.allclose(probs, numpy.array([8, 4, 2, 1]) / 15)
    assert numpy.allclose(logits.probabilities(vector, 0.5), numpy.array([64, 16, 4, 1]) / 85)
    # temperature one-half, then top-p 3/4, leaves only the first token; at T=1 top-p 3/4 keeps two
    assert logits.top_p_kept(logits.probabilities(vector, 0.5), 0.75) == 1
    assert logits.top_p_kept(probs, 0.75) == 2
    assert logits.entropy_nats(logits.probabilities(numpy.zeros(50304))) == pytest.approx(math.log(50304))


def test_first_step_table_is_computed_from_the_saved_logits(rich_run):
    from safetensors.numpy import load_file

    vector = load_file(str(rich_run / "tensors" / "first_step_logits.safetensors"))["P1/G"].astype(numpy.float64)
    probs = numpy.exp(vector - vector.max())
    probs /= probs.sum()
    entropy = float(-(probs * numpy.log(probs)).sum())
    ordered = numpy.sort(probs)[::-1]
    kept = int(numpy.searchsorted(numpy.cumsum(ordered), 0.8) + 1)  # the smallest prefix whose mass reaches 0.8
    row = table_rows(section(page(rich_run), "First-step distribution"))[1]
    assert row[0] == "P1"
    assert row[2] == f"{entropy:.2f}"
    assert row[4].startswith(f"{int(vector.argmax())}: {probs.max():.3g} / ")
    assert row[5] == f"{kept:,} of {vector.size:,}"


def test_first_step_table_says_when_the_logits_are_missing(rich_run, tmp_path):
    run = copy_run(rich_run, tmp_path / "no-tensors")
    (run / "tensors" / "first_step_logits.safetensors").unlink()
    text = section(report.render_report(run), "First-step distribution")
    assert "not available: tensors/first_step_logits.safetensors [P1/G] is missing or unreadable" in text


# --- cache --------------------------------------------------------------------------------------------------


def test_cache_table_counts_prefixes_from_one_with_the_error_against_its_bound(rich_run):
    from safetensors.numpy import load_file

    rows = table_rows(section(page(rich_run), "Cache: matched prefixes"))[1:]
    assert [row[0] for row in rows] == [str(n) for n in range(1, 9)]
    tensors = load_file(str(rich_run / "tensors" / "cache_logits.safetensors"))
    last = sorted(k for k in tensors if k.startswith("cached/"))[-1]
    a, b = tensors[last].astype(numpy.float64), tensors[last.replace("cached/", "uncached/")].astype(numpy.float64)
    ratio = float((abs(a - b) / (1e-5 + 1e-4 * abs(b))).max())
    assert rows[-1][3] == f"{ratio:.3g}"


def test_revised_criterion_is_shown_beside_the_declared_one_and_labelled(rich_run):
    cache = section(page(rich_run), "Cache: matched prefixes")
    assert "**Revised criterion, declared after the errors were seen**" in cache
    assert "justification: a test justification" in cache
    header = table_rows(cache)[0]
    assert header[-3:] == ["passed (declared)", "passed (revised)", "fail fraction (revised)"]


def test_without_a_revised_criterion_nothing_revised_is_shown(complete):
    run = rendered(complete.rich(revised=False))
    assert "revised" not in section(page(run), "Cache: matched prefixes").lower()


def test_fed_inputs_are_listed_on_the_details_page(rich_run):
    cache = section(page(rich_run, DETAILS_FILE), "Cache comparison in full")
    assert "What each path was fed" in cache
    assert "| 1 | cached | `[1, 1, 1, 1, 1, 1, 1, 1, 1]` | `[8]` | `[8]` |" in cache


# --- timing, the weight read, phases ---------------------------------------------------------------------------


def test_timing_table_lists_every_sample_with_median_and_range_and_lengths(rich_run):
    records = [json.loads(line) for line in (rich_run / RECORDS_FILE).read_text().splitlines()]
    measured = [r for r in records if r["kind"] == "timing_trial" and not r["warmup"]
                and r["prompt_id"] == "P1" and r["use_cache"]]
    ttft = sorted(r["ttft_s"] for r in measured)
    row = next(r for r in table_rows(section(page(rich_run), "Timing"))
               if r[0] == "P1, cache on" and r[3] == "local TTFT")
    assert row[1:3] == [str(measured[0]["prompt_length"]), "16"]
    assert row[4] == ", ".join(f"{r['ttft_s'] * 1e3:.3f}" for r in measured)
    assert row[5] == f"{ttft[2] * 1e3:.3f} [{ttft[0] * 1e3:.3f}–{ttft[-1] * 1e3:.3f}]"


def test_timing_labels_follow_the_protocols_selection_count(rich_run, monkeypatch):
    """'t16', '/15' and '16 selections' come from protocol.TIMING_NEW_TOKENS, not from literals."""
    monkeypatch.setattr(protocol, "TIMING_NEW_TOKENS", 8)
    pages = report.render_pages(rich_run)
    timing = section(pages[REPORT_FILE], "Timing")
    assert "mean post-first interval = (t8 − t1)/7; throughput = 8/(t8 − t0)" in timing
    assert any(row[3] == "loop (8 selections)" for row in table_rows(timing) if len(row) == 7)
    assert "t16" not in timing and "16 selections" not in timing
    assert "selection times t1..t8 (ms from loop start)" in pages[DETAILS_FILE]


def test_timing_section_labels_the_stopping_rule(rich_run):
    assert protocol.TIMING_STOPPING_RULE in section(page(rich_run), "Timing")


def test_the_weight_read_is_set_beside_the_step_times_and_nothing_is_called_a_floor(rich_run):
    """Issue 26 A1: what this run measured (one pass reading the step's weights, the caches, whether they fit),
    and no explanation of the gap that no measurement supports."""
    timing = section(page(rich_run), "Timing")
    assert "floor" not in timing.lower() and "dispatch" not in timing.lower()
    assert "### Reading the decode step's weights" in timing
    assert "L1 Data 32K, L3 Unified 32768K" in timing and "The weights fit in the largest level listed: yes: 32,768 B" in timing
    assert "on a virtual machine that level can be the host's" in timing
    assert "this report does not explain the difference" in timing
    row = next(r for r in table_rows(timing) if r[0] == "P1, cache on" and len(r) == 3)
    assert row[2] == "0.300 [0.200–0.500]"  # the pass times in ms: median [min–max]


def test_without_a_weight_read_record_the_section_is_left_out_or_names_the_old_bandwidth(complete):
    none = section(page(rendered(complete.rich(weight_read=False))), "Timing")
    assert "Reading the decode step's weights" not in none and "floor" not in none.lower()
    old_bandwidth = rendered(complete.rich(weight_read=False, bandwidth=True))
    old = section(page(old_bandwidth), "Timing")
    assert "This run recorded a copy bandwidth (`memory_bandwidth`" in old and "floor" not in old.lower()
    assert f"`{BANDWIDTH_BYTES_PER_S!r}`" in page(old_bandwidth, DETAILS_FILE)  # kept as data


def test_output_decoding_is_a_phase_beside_tokenization(rich_run):
    rows = {row[0]: row for row in table_rows(section(page(rich_run), "Timing"))}
    assert rows["output_decoding (generation)"][1] == "0.100 [0.100–0.100], n=26"
    assert rows["output_decoding (timing)"][1] == "0.200 [0.200–0.200], n=24"


def test_limitations_state_the_clock_overhead_measured_in_this_run(rich_run):
    limitations = section(page(rich_run), "Limitations")
    assert f"This run's own measurement: {CLOCK_READS_PER_TRIAL} clock reads ≈ 0.85 µs of a ≈ " in limitations
    assert "a hook on every forward that checks inference mode" in limitations
    assert "This run quoted no overhead benchmark" in limitations and "benchmarks/" not in limitations


def test_the_benchmarks_figures_are_quoted_beside_this_runs_labelled_as_another_runs(complete, tmp_path):
    """Issue 55: the hook, every reading, and the frame-placement spread, from the tracked results file as the run
    recorded them at its start, with the other run's date, commit and machine; this run's clock cost stays its own."""
    from inferlab.host import machine

    results = tmp_path / "results.jsonl"
    machine.append_result({"benchmark": "benchmarks/overhead.py", "recorded_utc": "2026-12-06T01:00:00+00:00",
                           "git": {"commit": "abcdef0123"}, "machine": {"cpu_model": "AMD EPYC", "logical_cpus": 2},
                           "software": {"python": "3.11.7"}, "rounds": 508,
                           "paired": {"overhead": 1.0071, "interval": [1.0052, 1.0093], "aa": 0.9998,
                                      "verdict": "within 1%"},
                           "hook": {"median": 1.0021, "interval": [1.0008, 1.0035]},
                           "readings_without_hook": {"median": 1.0049, "interval": [1.003, 1.0068]}}, results)
    machine.append_result({"benchmark": "benchmarks/page_faults.py", "recorded_utc": "2026-12-06T02:00:00+00:00",
                           "git": {"commit": "0123456789"}, "python": "3.11.7",
                           "placement_timing": {"rounds": 300, "most_over_fewest": 1.1386, "interval": [1.12, 1.1523],
                                                "aa": 1.0033}}, results)
    machine.append_result({"benchmark": "benchmarks/overhead.py", "paired": {"overhead": 1.5}}, results)  # no hook
    figures = machine.benchmark_figures(results)

    def quoted(records):
        for record in records:
            if record["kind"] == "clock_overhead":
                record["benchmark"] = figures
        return records

    limitations = section(page(rendered(complete.rich(transform=quoted))), "Limitations")
    assert f"This run's own measurement: {CLOCK_READS_PER_TRIAL} clock reads ≈ 0.85 µs" in limitations
    assert (f"Another run's figures, not this run's ({results}: benchmarks/overhead.py on 2026-12-06T01:00:00+00:00, "
            "at abcdef0, on AMD EPYC, 2 CPUs, Python 3.11.7, 508 rounds") in limitations
    assert ("(the clock, the usage reads, the collection watch and the per-forward hook) 1.0071 [1.0052, 1.0093], "
            "the per-forward hook alone 1.0021 [1.0008, 1.0035], the rest without the hook 1.0049 [1.0030, 1.0068]; "
            "the bare loop against itself (A/A) 0.9998; its verdict: within 1%.") in limitations
    assert ("**Frame placement** (benchmarks/page_faults.py, another run's too: 2026-12-06T02:00:00+00:00, at 0123456, "
            "Python 3.11.7, 300 rounds): the same bare loop took 1.1386 [1.1200, 1.1523] times as long started where "
            "its calls crossed the most frame-stack chunk ends as where they crossed the fewest (A/A 1.0033)"
            ) in limitations
    assert machine.benchmark_figures(tmp_path / "absent.jsonl")["found"] is False


def test_clock_overhead_share_is_bounded_by_the_shortest_measured_loop(rich_run):
    records = [json.loads(line) for line in (rich_run / RECORDS_FILE).read_text().splitlines()]
    overhead = next(r for r in records if r["kind"] == "clock_overhead")
    shortest = min(r["loop_s"] for r in records if r["kind"] == "timing_trial" and not r["warmup"])
    share = overhead["per_trial_overhead_ns"] / 1e9 / shortest * 100
    limitations = section(page(rich_run), "Limitations")
    assert f"({share:.2g} % of the shortest measured loop, {shortest * 1e3:.1f} ms)" in limitations
    assert "of the longest" not in limitations


def test_clock_reads_come_from_the_record(complete):
    def reads_20(records):
        for record in records:
            if record["kind"] == "clock_overhead":
                record.update(reads_per_trial=20, per_trial_overhead_ns=20 * record["per_read_ns"])
        return records

    run = rendered(complete.rich(transform=reads_20))
    assert "20 clock reads ≈ 1.00 µs of a ≈ " in section(page(run), "Limitations")


@pytest.mark.parametrize("found", [True, False])
def test_a_benchmark_reference_of_an_older_run_is_never_quoted_as_this_runs(complete, found):
    """Issue 26 A6: an older run's benchmark_reference (another machine's figure, matched by a CPU fingerprint)
    stays on the details page as data; the report's own pages quote only what the run measured."""
    run = rendered(complete.rich(benchmark_found=found))
    text = page(run)
    assert "benchmarks/overhead.py" not in text and "fingerprint" not in text
    assert "`benchmark_reference` (seq" in page(run, DETAILS_FILE)


# --- memory, batching, status facts, checklist ----------------------------------------------------------


def test_memory_lists_per_prefix_cache_bytes(rich_run):
    memory = section(page(rich_run), "Memory")
    assert f"9: {9 * CACHE_BYTES_PER_POSITION:,} B · 10: " in memory


def test_rss_baseline_includes_the_libraries_and_subtraction_is_warned_against():
    from fixtures_records import _envelope

    record = _envelope("memory", "x::test_process_memory", measure="process_rss",
                       baseline={"current_rss": {"bytes": 2 * 10**8, "meaning": "current", "tool": "/proc/self/status",
                                                 "source_field": "VmRSS"}},
                       now={"current_rss": {"bytes": 4 * 10**8, "meaning": "current", "tool": "/proc/self/status",
                                            "source_field": "VmRSS"}},
                       baseline_point="before the model was loaded")
    view = RunView.from_data([record])
    from inferlab.report import sections

    text = "\n".join(sections.section_memory(view, tables.Labels(view)))
    assert "already includes them" in text and "| lifetime peak (freeing objects does not lower it) |" in text
    assert 'Do not subtract these RSS values to get "model + cache"' in text
    assert "200,000,000 B" in text and "400,000,000 B" in text


def test_batching_gets_a_singleton_against_batch_table(rich_run):
    rows = table_rows(section(page(rich_run), "Batching"))[1:]
    assert rows[1][0] == "P2" and rows[1][2] == "2"
    assert rows[1][6] == "**no** (first differ at token 5)"


def test_status_names_the_typed_command_and_that_the_run_was_offline(rich_run):
    status = section(page(rich_run), "Run status")
    assert f"| command | `{TYPED_COMMAND}` |" in status
    assert "| offline | **yes**: every network connection refused for the whole session" in status


def test_status_counts_artifact_reference_matches_and_absent_files(complete):
    def absent_generation_config(records):
        for record in records:
            if record["kind"] == "artifact_file" and record["name"] == "generation_config.json":
                record["absent_at_revision"] = True
                record["reference"]["status"] = "absent"
        return records

    run = rendered(complete.rich(transform=absent_generation_config))
    files = next(r for r in table_rows(section(page(run), "Run status")) if r[0] == "files")[1]
    assert "absent at the revision: generation_config.json" in files
    assert "5 matches, 1 absent" in files
    assert "| `generation_config.json` | absent at the revision |" in page(run, DETAILS_FILE)


def files_cell(run) -> str:
    return next(r for r in table_rows(page(run)) if r[0] == "files")[1]


def test_a_verified_acquisition_is_labelled_verified(rich_run):
    assert files_cell(rich_run).startswith("reuse of the project cache, verified; 6 of 6 files present verified")


@pytest.mark.parametrize("method, keep_files, expected", [
    ("download", False, "bounded download, failed: hub unreachable: connection refused; no file was examined"),
    ("reuse:artifacts_dir", True, "local reuse (`--artifacts`), refused: --artifacts /x failed verification: "
                                  "model.safetensors: sha256 00 …; 5 of 6 files present verified"),
])
def test_a_failed_acquisition_is_labelled_by_its_outcome_never_verified(runs, method, keep_files, expected):
    error = ("hub unreachable: connection refused" if method == "download" else
             "--artifacts /x failed verification:\n  model.safetensors: sha256 00\nNothing was loaded.")

    def failed_by(records):
        for record in records:
            if record["kind"] == "artifact_acquisition":
                record.update(acquisition=method, ok=False, error=error)
                record.pop("status", None)
        return [r for r in records if keep_files or r["kind"] != "artifact_file"]

    cell = files_cell(rendered(runs.data("failed_ended").changed(failed_by)))
    assert cell == expected
    assert "verified local reuse" not in cell and not cell.split(";")[0].endswith("verified")


def test_blank_predictions_template_is_flagged(rich_run, tmp_path):
    run = copy_run(rich_run, tmp_path / "blank")
    edit_manifest(run, predictions={"supplied": True, "copied_to": PREDICTIONS_FILE, "sha256": "e" * 64,
                                    "template_unanswered": True})
    text = report.render_report(run)
    assert "still the blank template: no question is answered" in section(text, "Run status")
    checklist = table_rows(section(text, "Submission checklist"))
    assert "predictions are still the blank template" in checklist[1][2]


def test_supplied_predictions_are_linked_and_left_untouched(rich_run, tmp_path, plots_not_drawn):
    run = copy_run(rich_run, tmp_path / "with-predictions")
    (run / PREDICTIONS_FILE).write_text("## 1.\nPrediction: identical | 90 %\n")
    before = (run / PREDICTIONS_FILE).read_bytes()
    edit_manifest(run, predictions={"supplied": True, "copied_to": PREDICTIONS_FILE, "sha256": "f" * 64})
    report.write_report(run)
    assert f"[{PREDICTIONS_FILE}]({PREDICTIONS_FILE}), sha256 `{'f' * 16}`…" in page(run)
    assert (run / PREDICTIONS_FILE).read_bytes() == before


def test_checklist_has_seven_items_and_names_the_effective_config(rich_run):
    rows = table_rows(section(page(rich_run), "Submission checklist"))[1:]
    assert [row[0] for row in rows] == [str(n) for n in range(1, 8)]
    assert [row[2] for row in rows[1:6]] == ["recorded"] * 5
    assert "generation.generation_config_effective" in rows[2][3]


def test_conclusion_scaffold_quotes_ranges_beside_medians(rich_run):
    scaffold = section(page(rich_run), "Your conclusions")
    assert "prompts for you, the learner, not conclusions" in scaffold
    assert scaffold.count("**Limitation") == 2
    assert "Max abs diff over 8 prefixes" in scaffold
    assert "TTFT " in scaffold and " [" in scaffold.split("TTFT ", 1)[1].split(" ms")[0]


def test_warnings_are_counted_in_the_status_and_listed_on_the_details_page(rich_run):
    status = {row[0]: row[1] for row in table_rows(section(page(rich_run), "Run status")) if len(row) == 2}
    assert status["warnings"].startswith("**1 captured** in 1 record(s)")
    assert "UserWarning: a captured warning \\| with a pipe" in section(page(rich_run, DETAILS_FILE), "Warnings")


def test_a_directory_without_records_gets_a_page_that_says_so(tmp_path):
    pages = report.render_pages(tmp_path)
    assert "The run did not finish" in pages[REPORT_FILE]
    assert "records.jsonl: not readable" in pages[REPORT_FILE]
    for text in pages.values():
        assert "could not be rendered" not in text


# --- a failed run's page ------------------------------------------------------------------------------------


def test_failed_run_page_is_short_and_heads_with_the_reason_and_next_steps(failed_run):
    text = page(failed_run)
    assert len(text.splitlines()) < 80
    assert text.index("## What happened") < text.index("## What to do next") < text.index("## What did not run")
    assert "test_acquisition" in section(text, "What happened")
    next_steps = section(text, "What to do next")
    for step in acquisition_next_steps(RunView.read(failed_run).specimen_spec()):
        assert f"- {step}" in next_steps
    assert report.MISSING not in text


def test_failed_run_reason_is_given_in_full_however_long(runs):
    long_reason = "hub unreachable: " + "x" * 400 + " END"

    def longer(records):
        for record in records:
            if record["kind"] == "artifact_acquisition":
                record["error"] = long_reason
        return records

    run = rendered(runs.data("failed_ended").changed(longer))
    assert long_reason in section(page(run), "What happened")


def test_failed_run_says_what_did_not_run_per_protocol_part(failed_run):
    rows = {row[0]: row for row in table_rows(section(page(failed_run), "What did not run"))}
    generation = rows["Part 3: the generation trials and their checks"]
    assert generation[1] == generation[4] and generation[2] == "0"


def test_failed_run_draws_no_plot(failed_run):
    assert not list(failed_run.glob("*.png"))


def test_old_failed_run_without_check_kinds_or_session_end_is_still_short(runs):
    # an inferlab older than session_end and check_kind wrote this run: take both out of its records
    text = page(rendered(runs.data("failed").changed(lambda records: [
        {k: v for k, v in r.items() if k != "check_kind"} for r in records if r["kind"] != "session_end"])))
    assert len(text.splitlines()) < 80 and "## What happened" in text
    assert "The run did not finish" in text  # no session_end record: it cannot claim to have finished
    assert SKIP_REASON not in section(text, "What happened")


# --- robustness ---------------------------------------------------------------------------------------------


def test_partial_and_malformed_records_never_crash_either_page(tmp_path):
    run = tmp_path / "partial"
    run.mkdir()
    odd = [
        {"kind": "generation", "test": "x::test_generation[P1-G-rep1]", "seq": 0, "prompt_id": "P1",
         "condition": "G", "seed": None, "repetition": 1, "generated_ids": None, "text": None},
        {"kind": "timing_trial", "test": None, "seq": 1, "schedule_index": 2, "warmup": False, "token_times": None},
        {"kind": "cache_comparison", "test": None, "seq": 2, "prefix_length": 9, "max_abs_diff": None,
         "tensors": {"cached": {"file": "../../etc/passwd", "key": "x"}}},
        {"kind": "timing_summary", "test": None, "seq": 3, "prompt_id": "P1", "use_cache": True, "ttft_s": "odd"},
        {"kind": "memory", "test": None, "seq": 4, "measure": "unmeasured", "categories": ["activations"]},
        {"kind": "input", "test": None, "seq": 5, "prompt_id": "P1", "token_pieces": [None, "a"]},
    ]
    (run / RECORDS_FILE).write_text("".join(dumps(r) + "\n" for r in odd) + "{not json\n", encoding="ascii")
    pages = report.render_pages(run)
    assert "records.jsonl:7: not a JSON object" in pages[REPORT_FILE]
    for text in pages.values():
        assert "could not be rendered" not in text, text
    assert "- activations" in pages[REPORT_FILE]


def test_code_span_escapes_pipes_and_backticks():
    assert report.code("a|b") == "`a\\|b`"
    assert report.code("a`b") == "``a`b``"
    assert report.code("a|b", in_table=False) == "`a|b`"
    assert report.jstr("x\ny") == '`"x\\ny"`'


def test_code_span_in_a_table_writes_line_breaks_visibly():
    assert report.code("a\nb\r\nc") == "`a\\nb\\r\\nc`"
    assert report.code("x\u2028y") == "`x\\u2028y`"
    assert report.code("a\nb", in_table=False) == "`a\nb`"


def test_a_newline_in_the_command_or_a_path_never_splits_a_table_row(rich_run, tmp_path):
    run = copy_run(rich_run, tmp_path / "newline")
    command = "python -m pytest experiments \\\n  --record-dir 'runs/a\nb'"
    edit_manifest(run, command=command, argv=["pytest", "--record-dir", "runs/a\nb"],
                  git={"commit": "c0ffee\nbad", "dirty": False})
    pages = report.render_pages(run)
    status = {row[0]: row[1] for row in table_rows(section(pages[REPORT_FILE], "Run status")) if len(row) == 2}
    assert status["command"] == "`python -m pytest experiments \\\\n  --record-dir 'runs/a\\nb'`"
    environment = section(pages[DETAILS_FILE], "Environment")
    for line in environment.splitlines():
        if line.startswith("| "):
            assert line.endswith(" |"), line  # a row that split would leave a line without its closing pipe
    assert "| git commit | `c0ffee\\nbad` |" in environment


def test_manifest_fields_that_change_at_session_end_do_not_change_the_pages(rich_run, tmp_path):
    run = copy_run(rich_run, tmp_path / "final-manifest")
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    manifest.update(complete=not manifest["complete"], exit_status=9, outcome_counts={"x": 1},
                    ended_utc="2099-01-01T00:00:00+00:00", torch_threads={"changed": True}, checks={"c": 1})
    write_json_atomic(run / MANIFEST_FILE, manifest)
    assert report.check_pages(run) == []


@pytest.mark.parametrize("text, shown", [
    ("a b", '"a b"'),
    ("a" + " " * 3 + "b", '"a \\u0020\\u0020b"'),
    (" " * 24, '" ' + "\\u0020" * 23 + '"'),
    ("\n\t", '"\\n\\t"'),
    ("", '""'),
])
def test_runs_of_spaces_stay_countable_in_the_report(text, shown):
    """Whitespace tokens (the real tokenizer's ids 50254-50276) must not collapse into one space on a page."""
    import json

    from inferlab.report.fmt import visible_json

    assert visible_json(text) == shown and json.loads(shown) == text


# --- issue 26: what the cache table and the checklist say ------------------------------------------------------


def test_the_cache_table_explains_its_columns_and_the_near_tie_rule_of_the_criterion(rich_run):
    """A2 and B10: near a tie is judged by what the declared criterion allows; '(fed)' is explained."""
    cache = section(page(rich_run), "Cache: matched prefixes")
    assert "*prefix length (fed)*: the tokens of the compared prefix, and in brackets how many" in cache
    assert "what the declared criterion lets those two uncached logits move together" in cache
    assert "10×" not in cache and "tie allowance" in cache
    header = next(line for line in cache.splitlines() if line.startswith("| # | prefix length (fed)"))
    assert "| top-2 margin | tie allowance | near tie |" in header


def test_an_older_runs_near_ties_are_described_by_the_rule_they_were_made_under():
    from inferlab.report import sections

    old = RunView.from_data([{"kind": "cache_comparison", "test": None, "seq": 0, "wall_time": "x", "near_tie": False}],
                            {}, None)
    assert "a top-two margin below 10× the observed max abs diff" in sections.near_tie_sentence(old)


def test_the_checklist_names_the_manifest_field_runs_write(rich_run):
    checklist = section(page(rich_run), "Submission checklist")
    assert "command, argv, requirements_lock_sha256, lock_check" in checklist and "command_line" not in checklist


def test_the_run_table_names_every_difference_from_the_lock(rich_run, tmp_path):
    """A5: the manifest's lock check, shown; an older run that never checked says so."""
    row = next(r for r in table_rows(page(rich_run)) if r[0] == "environment lock")
    assert row[1] == ("**2 difference(s) from `requirements.lock`**: numpy locked 2.4.6, installed 2.0.0; python "
                      "locked 3.11.7, installed 3.11.2")
    older = copy_run(rich_run, tmp_path / "older")
    manifest = json.loads((older / MANIFEST_FILE).read_text())
    del manifest["lock_check"]
    write_json_atomic(older / MANIFEST_FILE, manifest)
    row = next(r for r in table_rows(report.render_report(older)) if r[0] == "environment lock")
    assert row[1].startswith("not checked")


def test_a_real_specimens_text_is_said_to_be_data_that_can_be_false_offensive_or_unsafe(tmp_path, rich_run):
    """A8: only for a real (non-synthetic) specimen; the stand-in's text is made up by construction."""
    real = build_complete_run(tmp_path / "real", synthetic=False)
    trials = section(page(real), "Generation trials")
    assert "can be false, offensive or unsafe" in trials and "kept here as data" in trials
    assert "nothing in it is ever executed" in trials
    assert "offensive" not in section(page(rich_run), "Generation trials")


def test_a_run_whose_environment_changed_is_never_called_passed(runs, tmp_path):
    """B4: the session_end names what changed; the verdict says so before any 'every planned test passed'."""
    run = build_rich_run(tmp_path / "edited", session_end={"environment_changed_during_run": [
        "source_sha256: inferlab/measure/cache_check.py"]}, base=runs.get("complete"))
    status = section(page(run), "Run status")
    assert "**Verdict:** **The environment changed during the run** (source_sha256: inferlab/measure/cache_check.py)" in status
    assert "Every planned test passed" not in status
    from inferlab.read.verify import verify_run

    assert any(p.startswith("session_end: the environment changed during the run") for p in verify_run(run)["problems"])


def test_the_run_table_says_what_the_watch_inside_every_forward_saw(complete):
    """A4: the records' forward_mode, summed; a violation is named."""
    def watched(records, broken=0):
        for record in records:
            if record["kind"] in ("generation", "timing_trial"):
                record["forward_mode"] = {"forwards": 16, "violation_count": 0, "violations": []}
        records[[r["kind"] for r in records].index("generation")]["forward_mode"]["violation_count"] = broken
        return records

    clean = rendered(complete.rich(transform=watched))
    row = next(r for r in table_rows(page(clean)) if r[0] == "every forward")
    assert row[1] == ("800 forwards in 50 records, each seen from inside it: all under `torch.inference_mode()`, none "
                      "in training mode")
    broken = rendered(complete.rich(transform=lambda records: watched(records, broken=3)))
    row = next(r for r in table_rows(page(broken)) if r[0] == "every forward")
    assert row[1].startswith("**3 of 800 forwards broke the controls**")
