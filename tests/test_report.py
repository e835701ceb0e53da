"""report.md: the evidence the lab asks the tool to summarize, and no reading of it; a real stand-in run's page against
its records; trials that produced nothing named, never compared; the numbers computed again from the records; partial
and odd runs from the shared fixture runs (tests/fixture_runs.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy
import pytest

from inferlab import protocol, report
from inferlab.__main__ import main
from inferlab.files import dumps
from inferlab.measure import stats
from inferlab.run.records import MANIFEST_FILE, PREDICTIONS_FILE, RECORDS_FILE, REPORT_FILE, REPORT_RENDERER_VERSION
from inferlab.read.runview import RunView
from inferlab.report import costs, evidence

from fixtures_records import INTERRUPT_ERROR, build_complete_run, copy_run, edit_manifest, fail_generation, \
    interrupt_at_generation
from fixture_runs import runs, shared  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT.parent / "shared" / "spec" / "lab12-measure-inference-and-sampling.txt"
# What the page must never say: a verdict on a question, a conclusion, or a ready-made limitation of one.
READING_PHRASES = ("faster with the cache", "slower with the cache", "made it faster", "made it slower",
                   "cannot tell", "did the cache make", "the cache made", "your conclusions", "scaffold",
                   "on selection.", "on computation.", "limitation 1", "limitation 2", "nothing follows for",
                   "does the cache change what is computed", "estimate no output distribution")

rich_run = shared("rich_run", "rich", "The shared rich run (never change it: copy it).")
complete = shared("complete", "complete", "The shared complete run in memory, for variants.", in_memory=True)


def page(run) -> str:
    return run if isinstance(run, str) else (run / REPORT_FILE).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    """The rows of every Markdown table in text, split into cells (escaped pipes kept inside cells)."""
    return [[c.strip().replace("\0", "\\|") for c in line.replace("\\|", "\0").strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]


def rendered(data) -> str:
    return report.render_report(data.view())


def test_a_stand_in_runs_report_holds_every_piece_of_evidence_and_no_reading(standin_run):
    text, view = page(standin_run), RunView.read(standin_run)
    assert not [p for p in READING_PHRASES if p in text.lower()], [p for p in READING_PHRASES if p in text.lower()]
    questions = section(text, "The questions, and where their evidence is")
    assert all(f"| {n} | {question} |" in questions for n, question in protocol.QUESTIONS.items())
    assert "| 7 |" in questions and "report DIR --after`" in questions  # where the tool's reading is, one line
    inputs = section(text, "Inputs")
    for record in view.kind("input"):
        assert f"| {record['prompt_id']} | {evidence.jstr(record['source'])} | yes | {record['length']} |" in inputs
    trials = {row[1]: row for row in table_rows(section(text, "Generation trials"))[1:]}
    for record in view.kind("generation"):
        assert trials[f"`{record['trial_id']}`"][5].startswith(f"`{record['generated_ids'][0]} ")
    repeat = table_rows(section(text, "Repeatability"))
    assert [row[0] for row in repeat[1:]] == list(protocol.PROMPTS) and "identical ids" in repeat[0][1]
    assert [row[0] for row in table_rows(section(text, "First-step logits"))[1:]] == list(protocol.PROMPTS)
    cache = section(text, "Cache: matched prefixes")
    assert f"`{view.first('cache_criterion')['rule']}`" in cache
    assert len(table_rows(cache)) == 1 + len(view.kind("cache_comparison"))
    timing = section(text, "Timing")
    assert protocol.TIMING_STOPPING_RULE in timing
    # every sample, median [min–max]
    for (prompt_id, use_cache), trials in stats.measured(view.kind("timing_trial")).items():
        values = [t["ttft_s"] for t in trials]
        row = next(r for r in table_rows(timing) if r[0] == f"{prompt_id}, cache {'on' if use_cache else 'off'}"
                   and r[3] == "local TTFT (ms)")
        assert [v.rstrip(costs.CONTENDED) for v in row[4].split(", ")] == [f"{v * 1e3:.3f}" for v in values]
        assert row[5] == evidence.spread(values)
    for effect in stats.cache_verdicts(view.kind("timing_trial"))["verdicts"]:  # its interval, the threshold
        interval = effect["interval"]
        assert (f"| {effect['prompt_id']} | {costs.METRIC_NAMES[effect['metric']]} | {effect['samples']} |" in timing
                and f"{interval['estimate_fraction']:+.1%} [{interval['low_fraction']:+.1%}, "
                    f"{interval['high_fraction']:+.1%}], {interval['coverage']:.1%} | +3.0% / -2.9% |" in timing)
    unmeasured = section(text, "Memory").split("Not measured:")[1]
    assert all(f"- {name}:" in unmeasured for name in next(
        r["categories"] for r in view.kind("memory") if r["measure"] == "unmeasured"))
    limitations = section(text, "Limitations of the procedure")
    assert "synthetic" in limitations and "instrumentation adds time" in limitations
    assert f"{view.first('clock_overhead')['reads_per_trial']} clock reads per trial" in limitations


def test_the_templates_ask_the_labs_six_questions_in_its_own_words():
    """The templates, the protocol and the rubric against the lab's page where ../shared/spec has it (never copied)."""
    if not SPEC.is_file():
        pytest.skip(f"the lab's page is not here ({SPEC}): ../shared/spec is beside the repository on the course's "
                    "machines only")
    part = SPEC.read_text(encoding="utf-8").split("Part 1")[1].split("Do not replace these predictions")[0]
    lab = {int(n): q.strip() for n, q in re.findall(r"^\s*(\d)\.\s+(.+\?)\s*$", part, flags=re.MULTILINE)}
    assert sorted(lab) == [1, 2, 3, 4, 5, 6] and protocol.QUESTIONS == lab
    templates = {name: (ROOT / name).read_text(encoding="utf-8") for name in ("predictions.md", "explanation.md")}
    for name, level in (("predictions.md", "##"), ("explanation.md", "###")):
        asked = dict(re.findall(rf"^{level} (\d)\. (.+)$", templates[name], flags=re.MULTILINE))
        assert {int(n): q for n, q in asked.items()} == lab, name
    rubric = (ROOT / "inferlab" / "grade" / "default_rubric.toml").read_text(encoding="utf-8")
    assert all(f'"{n}. {q}"' in rubric for n, q in lab.items())


def test_report_check_agrees_catches_an_edit_and_never_compares_another_renderers_page(rich_run, tmp_path, capsys):
    edited = copy_run(rich_run, tmp_path / "edited")
    (edited / REPORT_FILE).write_text(page(edited) + "hindsight\n", encoding="utf-8")
    assert main(["report", str(edited), "--check"]) == 1
    assert f"differs from {edited / REPORT_FILE}" in capsys.readouterr().out
    older = copy_run(rich_run, tmp_path / "older")
    edit_manifest(older, report_renderer_version=REPORT_RENDERER_VERSION - 1)
    assert main(["report", str(older), "--check"]) == 3
    assert "neither called identical nor different" in capsys.readouterr().out
    run = copy_run(rich_run, tmp_path / "final-manifest")  # the fields that change at session end leave the page
    edit_manifest(run, complete=not json.loads((run / MANIFEST_FILE).read_text())["complete"], exit_status=9,
                  outcome_counts={"x": 1}, ended_utc="2099-01-01T00:00:00+00:00", checks={"c": 1})
    assert report.check(run).status == "identical"
    assert main(["report", str(run), "--check"]) == 0 and "identical" in capsys.readouterr().out


def test_failed_and_interrupted_trials_are_named_never_compared_and_repetitions_that_differ_are_a_no(complete):
    def differ(records):
        second = next(r for r in records if r["kind"] == "generation" and r["trial_id"] == "P1-G-rep2")
        second["generated_ids"] = second["generated_ids"][:-1] + [second["generated_ids"][-1] % 50 + 1]
        return fail_generation(records, "P1-G-rep1")

    text = rendered(complete.rich(transform=lambda records: fail_generation(
        fail_generation(records, "P1-G-rep3"), "P1-S1-seed31")))
    p1 = table_rows(section(text, "Repeatability"))[1]
    assert p1[1:] == ["not decidable (2 of 3 recorded, 1 failed)", "yes; fresh cache: yes",
                      "S1 2/2 (1 failed), S2 3/3, S3 3/3", "1 of 10 (2 failed)"]
    trials = {row[1]: row for row in table_rows(section(text, "Generation trials"))}
    assert trials["`P1-G-rep3`"][2] == "failed (failed, F1)"
    assert table_rows(section(rendered(complete.rich(transform=differ)), "Repeatability"))[1][1] == \
        "**no** (2 of 3 recorded, 1 failed)"
    # an interrupted run names the cut trial and explains every missing record
    interrupted = {"interrupted": True, "signals": ["SIGINT"], "exit_status": 2, "stop_reason": "interrupted by SIGINT",
                   "exit_code_name": "INTERRUPTED"}
    text = rendered(complete.rich(transform=lambda records: interrupt_at_generation(records, "P2-G-rep1"),
                                  session_end=interrupted))
    trials = {row[1]: row for row in table_rows(section(text, "Generation trials"))}
    assert trials["`P2-G-rep1`"][2].startswith("interrupted (") and INTERRUPT_ERROR not in text.split("## Inputs")[0]
    assert trials["`P2-G-rep2`"][2] == "not run (not reached: the run was interrupted (SIGINT))"
    assert table_rows(section(text, "Repeatability"))[2][1:] == ["not decidable (0 of 3 recorded, 1 interrupted, "
                                                                 "2 not run)", "not run", "S1 not run, S2 not run, "
                                                                 "S3 not run", "0 of 0 (1 interrupted, 11 not run)"]
    assert "No `cache_criterion` record (not reached: the run was interrupted (SIGINT))." in text
    assert "no record and no outcome explains it" not in text


def test_probabilities_and_top_p_follow_the_labs_worked_example_and_the_pages_figures_its_tensors(rich_run, tmp_path):
    from safetensors.numpy import load_file


    vector = numpy.log(numpy.array([8.0, 4.0, 2.0, 1.0]))
    assert numpy.allclose(evidence.probabilities(vector), numpy.array([8, 4, 2, 1]) / 15)
    assert numpy.allclose(evidence.probabilities(vector, 0.5), numpy.array([64, 16, 4, 1]) / 85)
    # temperature one-half then top-p 3/4 leaves the first token; at temperature one top-p 3/4 keeps two
    assert evidence.top_p_kept(evidence.probabilities(vector, 0.5), 0.75) == 1
    assert evidence.top_p_kept(evidence.probabilities(vector), 0.75) == 2
    assert evidence.entropy_nats(evidence.probabilities(numpy.zeros(50304))) == pytest.approx(math.log(50304))
    # the page's first-step, cache and throughput figures, computed again from the tensors and records
    vector = load_file(str(rich_run / "tensors/first_step_logits.safetensors"))["P1/G"].astype(numpy.float64)
    probs = numpy.exp(vector - vector.max()) / numpy.exp(vector - vector.max()).sum()
    kept = int(numpy.searchsorted(numpy.cumsum(numpy.sort(probs)[::-1]), 0.8) + 1)  # smallest prefix reaching 0.8
    row = table_rows(section(page(rich_run), "First-step logits"))[1]
    assert row[2].startswith(f"{float(-(probs * numpy.log(probs)).sum()):.2f} / ")
    assert row[3].startswith(f"{int(vector.argmax())}: {probs.max():.3g} / ")
    assert row[4] == f"{kept:,} of {vector.size:,}"
    tensors = load_file(str(rich_run / "tensors/cache_logits.safetensors"))
    last = sorted(k for k in tensors if k.startswith("cached/"))[-1]
    a, b = tensors[last].astype(numpy.float64), tensors[last.replace("cached/", "uncached/")].astype(numpy.float64)
    assert table_rows(section(page(rich_run), "Cache: matched prefixes"))[-1][3] == \
        f"{float((abs(a - b) / (1e-5 + 1e-4 * abs(b))).max()):.3g}"
    missing = copy_run(rich_run, tmp_path / "no-tensors")
    (missing / "tensors/first_step_logits.safetensors").unlink()
    assert "not available: tensors/first_step_logits.safetensors [P1/G] is missing" in report.render_report(missing)
    trials = stats.measured(RunView.read(rich_run).kind("timing_trial"))[("P1", True)]  # throughput: per-trial values
    rates = [stats.throughput_including_prompt(t["token_times_s"]) for t in trials]
    row = next(r for r in table_rows(section(page(rich_run), "Timing")) if r[0] == "P1, cache on"
               and r[3].startswith("throughput 16/(t16 − t0)"))
    assert row[5] == f"{sorted(rates)[2]:.1f} [{min(rates):.1f}–{max(rates):.1f}]"


def test_the_run_table_shows_the_controls_and_what_a_forward_watch_saw(complete):
    def watched(records, broken=0):
        for record in records:
            if record["kind"] in ("generation", "timing_trial"):
                record["forward_mode"] = {"forwards": 16, "violation_count": 0, "violations": []}
        next(r for r in records if r["kind"] == "generation")["forward_mode"]["violation_count"] = broken
        return records

    rows = dict(row[:2] for row in table_rows(rendered(complete.rich(transform=watched))) if len(row) == 2)
    assert rows["every forward"].startswith("800 forwards in 50 records, each seen from inside it: all under")
    assert "14067712 parameters in float32 on cpu" in rows["model"]
    broken = rendered(complete.rich(transform=lambda records: watched(records, broken=3)))
    assert "**3 of 800 forwards broke the controls**" in broken


def test_blank_predictions_captured_warnings_and_a_real_specimen_are_said(rich_run, tmp_path):
    run = copy_run(rich_run, tmp_path / "blank")
    edit_manifest(run, predictions={"supplied": True, "copied_to": PREDICTIONS_FILE, "sha256": "e" * 64,
                                    "template_unanswered": True})
    text = report.render_report(run)
    assert f"[{PREDICTIONS_FILE}]({PREDICTIONS_FILE}), sha256 `{'e' * 16}`… — **still the blank template**" in text
    assert report.SYNTHETIC_BANNER in text.splitlines()[2]
    warned = next(r for r in RunView.read(run).records if r.get("warnings"))
    assert f"`{warned['kind']}` seq {warned['seq']}" in section(text, "Run status")
    assert report.SYNTHETIC_BANNER not in page(build_complete_run(tmp_path / "real", synthetic=False))


def test_partial_and_malformed_records_never_crash_the_page(tmp_path):
    odd = [{"kind": "generation", "test": "x::t[P1-G-rep1]", "seq": 0, "prompt_id": "P1", "trial_id": "P1-G-rep1",
            "generated_ids": None},
           {"kind": "timing_trial", "test": None, "seq": 1, "schedule_index": 2, "warmup": False, "token_times": None},
           {"kind": "cache_comparison", "test": None, "seq": 2, "prefix_length": 9,
            "tensors": {"cached": {"file": "../../etc/passwd", "key": "x"}}},
           {"kind": "memory", "test": None, "seq": 3, "measure": "unmeasured", "categories": ["activations"]}]
    (tmp_path / RECORDS_FILE).write_text("".join(dumps(r) + "\n" for r in odd) + "{not json\n", encoding="ascii")
    text = report.render_report(tmp_path)
    assert "records.jsonl:5: not a JSON object" in text and "- activations" in text
    assert "could not be rendered" not in text
    assert "The run did not finish" in report.render_report(tmp_path / "nothing-here")


@pytest.mark.parametrize("value, shown", [("a|b", '`"a\\|b"`'), ("x\ny\u2028", '`"x\\ny\\u2028"`'),
                                          ("a" + " " * 3 + "b", '`"a \\u0020\\u0020b"`'), ("", '`""`'),
                                          ("`", '``"`"``')])
def test_a_cell_keeps_pipes_line_breaks_and_runs_of_spaces_visible(value, shown):
    assert evidence.jstr(value) == shown and json.loads(evidence.visible_json(value)) == value

