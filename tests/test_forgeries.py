"""Forged runs, made as a learner would make them, and what catches each (issue 25; docs/trust.md).

Each forgery edits a run's records (or tensors) with a few lines of plain Python and then re-hashes the
manifest's inventory, so that the hashes verify again: only the consistency checks (numbers that must agree
with what they derive from) and the protocol check (the recorded protocol against this checkout's) can catch
it. The forgeries that no file can expose (timings forged consistently, predictions written after the run) are
kept here too, asserting that verify does not catch them: docs/trust.md says so, and this keeps it true.

Fixture runs (tests/fixtures_records) serve the forgeries of records; the session's one real stand-in run
(conftest.standin_run) those that need real tensors, a real tokenizer and real clock stamps.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from inferlab import protocol
from inferlab.__main__ import main
from inferlab.measure import contention, summaries
from inferlab.verify import verify_run

from fixtures_records import build_complete_run
from forging import find, forge, rehash
from fixture_runs import runs, shared  # noqa: F401 (runs is a fixture)

SCHEMA1_RUN = Path(__file__).resolve().parent / "fixtures" / "schema1-run"


def caught(run: Path) -> list[str]:
    """verify's problems, each of them a consistency or protocol problem (the hashes were made to agree)."""
    problems = verify_run(run)["problems"]
    assert problems, "the forgery was not caught"
    assert all(p.startswith(("inconsistent: ", "protocol: ")) for p in problems), problems
    return problems


def resummarize(records: list[dict]) -> None:
    """Recompute every timing summary from the (forged) trials, with the project's own functions."""
    trials = [r for r in records if r["kind"] == "timing_trial"]
    for record in records:
        if record["kind"] == "timing_summary":
            record.update(summaries.timing_summary(trials, record["prompt_id"], record["use_cache"]))


fixture_run = shared("fixture_run", "complete", "The shared complete run (forge() copies it).")
rich_run = shared("rich_run", "rich", "A fixture run with the records the evidence tracks added (weight_read among "
                  "them).")


# --- honest runs stay clean ------------------------------------------------------------------------------


@pytest.mark.parametrize("build", ["complete", "rich", "failed"])
def test_an_honest_fixture_run_has_no_consistency_problem_and_says_what_it_could_not_check(build, runs):
    result = verify_run(runs.get(build))
    assert result["problems"] == []
    if build != "failed":  # a run that stopped at its specimen decoded nothing
        assert any("tokenizer files not at hand" in line for line in result["not_checked"]), result["not_checked"]


def test_the_schema_1_run_has_no_consistency_problem_and_no_stamps_to_order():
    result = verify_run(SCHEMA1_RUN)
    assert result["problems"] == []
    assert any("carry no perf_counter_ns" in line for line in result["not_checked"])


def test_an_honest_real_run_is_consistent_with_nothing_left_unchecked(standin_run):
    result = verify_run(standin_run)
    assert result["problems"] == [] and result["not_checked"] == []
    records = [json.loads(line) for line in (standin_run / "records.jsonl").read_text().splitlines()]
    stamps = [r["perf_counter_ns"] for r in records]
    assert stamps == sorted(stamps)  # the envelope's monotonic stamp, on every record of a live session


# --- the forgeries -----------------------------------------------------------------------------


def test_forgery_1_a_ttft_below_its_prefill_is_caught(fixture_run, tmp_path):
    def edit(records):
        trial = find(records, "timing_trial", schedule_id="P1-cache_on-rep2")
        trial["ttft_s"] = trial["prefill_s"] / 2

    run = forge(fixture_run, tmp_path / "forged", edit)
    problems = caught(run)
    line = next(p for p in problems if "below its own prefill_s" in p)
    assert "timing_trial seq" in line and "[P1-cache_on-rep2] ttft_s" in line
    assert any("ttft_s: recorded" in p and "token_times_s[0]" in p for p in problems)  # and its first selection
    assert main(["verify", str(run)]) == 1


def test_forgery_1_on_a_real_run_is_caught_by_the_nanosecond_stamps(standin_run, tmp_path):
    def edit(records):
        trial = find(records, "timing_trial", schedule_id="P1x8-cache_off-rep3")
        trial["ttft_s"] = trial["prefill_s"] * 0.9

    problems = caught(forge(standin_run, tmp_path / "forged", edit))
    assert any("[P1x8-cache_off-rep3] ttft_s: recorded" in p and "token_times_ns[0] - t_start_ns" in p
               for p in problems), problems
    assert any("below its own prefill_s" in p for p in problems)


@pytest.mark.slow
def test_forgery_6_a_run_made_with_a_loosened_tolerance_is_a_protocol_problem(tmp_path, monkeypatch):
    """As if protocol.py had said atol = rtol = 1 while the run was made: every copy of it is recorded so."""
    with monkeypatch.context() as patched:
        patched.setattr(protocol, "CACHE_TOLERANCE", protocol.Tolerance(atol=1.0, rtol=1.0))
        run = build_complete_run(tmp_path / "loosened")
    problems = caught(run)
    for where in ("manifest.json protocol.cache_tolerance.atol", "plan.json protocol.cache_tolerance.rtol",
                  "cache_criterion seq"):
        assert any(p.startswith(f"protocol: {where}") for p in problems), (where, problems)
    criterion = next(p for p in problems if p.startswith("protocol: cache_criterion") and " criterion: " in p)
    assert "|a-b| <= 1 + 1*|b|" in criterion and protocol.CACHE_TOLERANCE.describe() in criterion
    assert main(["verify", str(run)]) == 1


def test_a_declared_criterion_edited_alone_is_a_protocol_problem(standin_run, tmp_path):
    def edit(records):
        find(records, "cache_criterion").update(atol=1.0, rtol=1.0, rule="|a-b| <= 1 + 1*|b| (b = uncached reference)")

    problems = caught(forge(standin_run, tmp_path / "forged", edit))
    criterion = [p for p in problems if p.startswith("protocol: cache_criterion seq")]
    assert any(" atol: recorded 1.0, this checkout's inferlab.protocol has 1e-05" in p for p in criterion), problems
    assert any(" rule: recorded '|a-b| <= 1 + 1*|b|" in p for p in criterion), problems


def test_a_run_made_with_other_prompts_is_a_protocol_problem(fixture_run, tmp_path):
    """As if protocol.py had another P2: its input record and the manifest's and plan's protocol say so."""
    def edit(records):
        find(records, "input", prompt_id="P2")["source"] = "An easier sentence."

    run = forge(fixture_run, tmp_path / "other-prompts", edit)
    for name in ("manifest.json", "plan.json"):
        data = json.loads((run / name).read_text())
        data["protocol"]["prompts"]["P2"] = "An easier sentence."
        (run / name).write_text(json.dumps(data, indent=2))
    rehash(run)
    problems = caught(run)
    assert any(p.startswith("protocol: input seq") and "[P2] source" in p for p in problems), problems
    assert any(p.startswith("protocol: manifest.json protocol.prompts.P2") for p in problems)


# --- forgeries of our own, of the same kinds ----------------------------------------------------------


def test_a_summary_median_edited_alone_is_caught(fixture_run, tmp_path):
    def edit(records):
        find(records, "timing_summary", prompt_id="P1x8", use_cache=False)["ttft_s"]["median"] /= 2

    problems = caught(forge(fixture_run, tmp_path / "forged", edit))
    assert len(problems) == 1 and "timing_summary seq" in problems[0] and "ttft_s.median" in problems[0]


def test_a_weight_read_median_edited_alone_is_caught(rich_run, tmp_path):
    def edit(records):
        find(records, "weight_read")["median_s"] *= 10

    problems = caught(forge(rich_run, tmp_path / "forged", edit))
    assert len(problems) == 1 and "weight_read seq" in problems[0] and "median_s" in problems[0], problems


def test_a_loop_time_edited_alone_is_caught(fixture_run, tmp_path):
    def edit(records):
        find(records, "timing_trial", schedule_id="P1-cache_off-rep4")["loop_s"] *= 0.5
        resummarize(records)

    problems = caught(forge(fixture_run, tmp_path / "forged", edit))
    assert any("[P1-cache_off-rep4] loop_s" in p and "token_times_s[-1]" in p for p in problems), problems


def test_a_test_shorter_than_the_loop_it_timed_is_caught(fixture_run, tmp_path):
    test = "experiments/test_50_timing.py::test_timing_trial[P1x8-cache_on-rep1]"

    def edit(records):
        find(records, "test_outcome", test=test)["duration"] = 0.001

    problems = caught(forge(fixture_run, tmp_path / "forged", edit))
    assert len(problems) == 1 and "duration: recorded 0.001 s, shorter than timing_trial" in problems[0]


def test_a_greedy_trials_ids_edited_with_their_text_and_summary_are_caught(standin_run, tmp_path):
    """ids[0] changed everywhere a careful learner would change it: the saved logits' argmax still disagrees."""
    def edit(records):
        trial = find(records, "generation", trial_id="P2-G-rep2")
        trial["generated_ids"][0] += 1
        trial["sequence_ids"] = trial["prompt_ids"] + trial["generated_ids"]
        trial["first_step_logits_argmax"] = trial["generated_ids"][0]
        generations = [r for r in records if r["kind"] == "generation"]
        find(records, "sampling_summary", prompt_id="P2").update(summaries.sampling_summary(generations, "P2"))

    problems = caught(forge(standin_run, tmp_path / "forged", edit))
    assert any("[P2-G-rep2] first_step_logits_argmax" in p and "saved first-step logits" in p for p in problems)
    assert any("[P2-G-rep2] text" in p for p in problems)  # the text no longer decodes from the ids


def test_a_decoded_text_edited_is_caught_with_the_runs_tokenizer(standin_run, tmp_path):
    def edit(records):
        find(records, "generation", trial_id="P1-S3-seed31")["text"] = "a fluent, plausible answer"

    problems = caught(forge(standin_run, tmp_path / "forged", edit))
    assert len(problems) == 1 and "[P1-S3-seed31] text: recorded 'a fluent, plausible answer'" in problems[0]


def test_cache_statistics_edited_with_their_summary_are_caught_by_the_saved_tensors(standin_run, tmp_path):
    def edit(records):
        comparisons = [r for r in records if r["kind"] == "cache_comparison"]
        for row in comparisons:
            row.update(max_abs_diff=0.0, bitwise_equal=True, fail_count=0, fail_fraction=0.0)
        summary = find(records, "cache_summary")
        summary["all_bitwise_equal"] = True
        summary["numerical_agreement"].update(all_bitwise_equal=True, max_abs_diff=0.0)

    problems = caught(forge(standin_run, tmp_path / "forged", edit))
    assert any("cache_comparison seq" in p and "max_abs_diff" in p and "saved cached and uncached" in p
               for p in problems), problems
    assert any("cache_summary seq" in p and "numerical_agreement.max_abs_diff" in p for p in problems)


def test_a_trial_moved_in_time_runs_the_clock_backwards(standin_run, tmp_path):
    """Every stamp of one trial shifted by a minute, its seconds (relative to its start) left as they were. (A
    second was once enough; the full collection before each trial and a loaded machine can now leave more than a
    second between a trial and the record before it.)"""
    def edit(records):
        trial = find(records, "timing_trial", schedule_id="P1-cache_off-rep3")
        shift = 60 * 10**9
        trial["t_start_ns"] -= shift
        trial["t_prefill_done_ns"] -= shift
        trial["token_times_ns"] = [t - shift for t in trial["token_times_ns"]]

    problems = caught(forge(standin_run, tmp_path / "forged", edit))
    assert len(problems) == 1 and "[P1-cache_off-rep3] t_start_ns" in problems[0]
    assert "the monotonic clock ran backwards in record order" in problems[0]


def test_a_trial_that_claims_another_collector_policy_than_the_run_declared_is_caught(standin_run, tmp_path):
    def edit(records):
        find(records, "timing_trial", schedule_id="P1-cache_on-rep2")["collector"]["policy"] = "on_in_spans"

    problems = caught(forge(standin_run, tmp_path / "forged", edit))
    assert len(problems) == 1 and "[P1-cache_on-rep2] collector.policy: recorded 'on_in_spans'" in problems[0]
    assert "manifest.json and plan.json" in problems[0]


def test_a_collection_inside_a_span_under_the_default_policy_is_caught(standin_run, tmp_path):
    """A collection event planted inside a loop span, every derived field recomputed: under off_in_spans the
    collector was off there, so no collection can have started in it. The planted collection lasts 2 us, far
    below the rule's collector share on any machine, so the trial's contention verdict (and so its summary)
    stays what it was and the policy check alone must catch it."""
    def edit(records):
        trial = find(records, "timing_trial", schedule_id="P1x8-cache_off-rep1")
        start = trial["t_start_ns"]
        trial["gc_events"] = [[0, start + 1_000, start + 3_000]]
        trial.update(contention.recorded_evidence(trial))

    problems = caught(forge(standin_run, tmp_path / "forged", edit))
    assert len(problems) == 1 and "[P1x8-cache_off-rep1]: 1 collection(s) started inside its loop span" in problems[0]


# --- what no file can expose (docs/trust.md) -----------------------------------------------------------------


def faster_p1_cache_on_loops(records: list[dict], cpu_too: bool) -> None:
    """The P1 cache-on loops made faster: twice as fast with their thread CPU readings halved too (cpu_too), else
    shrunk to half the CPU time the thread recorded, its readings left as measured. The derived contention fields
    and every second and summary are recomputed with the project's own functions either way."""
    for trial in records:
        if trial["kind"] == "timing_trial" and trial["prompt_id"] == "P1" and trial["use_cache"]:
            start = trial["t_start_ns"]
            factor = 0.5 if cpu_too else contention.loop_cpu_share(trial) / 2
            shrink = lambda t: start + int((t - start) * factor)  # noqa: E731
            trial["t_prefill_done_ns"] = shrink(trial["t_prefill_done_ns"])
            trial["token_times_ns"] = [shrink(t) for t in trial["token_times_ns"]]
            times = trial["token_times_ns"]
            trial.update(prefill_s=(trial["t_prefill_done_ns"] - start) / 1e9, ttft_s=(times[0] - start) / 1e9,
                         loop_s=(times[-1] - start) / 1e9, token_times_s=[(t - start) / 1e9 for t in times],
                         mean_post_first_interval_s=summaries.post_first_interval_s(times))
            readings = trial["cpu_readings"]
            if cpu_too:
                first = readings["start"][0]
                for point in ("prefill_done", "end"):
                    readings[point][0] = first + (readings[point][0] - first) // 2
            trial.update(contention.trial_evidence(readings, start, trial["t_prefill_done_ns"], times[-1],
                                                   gc_events=trial.get("gc_events")))
    resummarize(records)


def test_timings_forged_consistently_are_not_caught_by_any_file(standin_run, tmp_path):
    """Forgery 2: the P1 cache-on loops made twice as fast, every stamp, second, CPU reading and summary
    recomputed."""
    result = verify_run(forge(standin_run, tmp_path / "forged", lambda r: faster_p1_cache_on_loops(r, True)))
    assert result["problems"] == []  # only running the experiment again (a course's own CI) can tell


def test_loops_made_shorter_than_their_own_cpu_time_are_caught(standin_run, tmp_path):
    """The thread's CPU readings bound a forgery of its wall times: a loop shrunk below the CPU time its thread
    recorded (readings left as measured, everything derived recomputed) is one no thread could have run."""
    problems = caught(forge(standin_run, tmp_path / "forged", lambda r: faster_p1_cache_on_loops(r, False)))
    assert any("P1-cache_on-rep1] cpu_readings: the loop span used" in p and "one thread cannot" in p
               for p in problems), problems


def test_predictions_written_after_the_run_are_not_caught_by_any_file(fixture_run, tmp_path):
    """Forgery 5: predictions.md added afterwards and the manifest made to say they were supplied."""
    run = forge(fixture_run, tmp_path / "forged", lambda records: None)
    (run / "predictions.md").write_text("1. Greedy repeats exactly; sampling differs by seed. Sure.\n")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["predictions"] = {"supplied": True, "copied_to": "predictions.md", "sha256": hashlib.sha256(
        (run / "predictions.md").read_bytes()).hexdigest(), "copied_at_utc": manifest["started_utc"]}
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
    rehash(run)
    assert verify_run(run)["problems"] == []  # no file can prove the predictions came first
