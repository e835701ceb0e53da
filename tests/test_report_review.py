"""Issue 33 part 6, the report's share: what a careful reviewer found in the timing, weight-read and sampling parts of
report.md and report-details.md, each rendered from the shared fixture runs (no model)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from inferlab import report
from inferlab.run.records import RECORDS_FILE, REPORT_FILE
from inferlab.measure import stats

from fixture_runs import runs, shared  # noqa: F401 (fixtures)

DETAILS_FILE = report.DETAILS_FILE
REPO_ROOT = Path(__file__).resolve().parents[1]

rich_run = shared("rich_run", "rich", "The shared rich run (never change it).")


def page(run, name: str = REPORT_FILE) -> str:
    return (run / name).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]


def records_of(run, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / RECORDS_FILE).read_text().splitlines()) if r["kind"] == kind]


# --- c: the weight-read table's ratio ----------------------------------------------------------------------


def test_the_weight_read_table_sets_no_ratio_beside_the_step_times(rich_run):
    """An 'interval / pass' column reads like a bound on the step, and means nothing for a cache-off row (each of
    its steps feeds the whole sequence): the table gives the two measured columns only."""
    weights = section(page(rich_run), "Timing").split("### Reading the decode step's weights", 1)[1]
    header = next(row for row in table_rows(weights) if row[0] == "condition")
    assert header[1:] == ["mean post-first interval ms, median [min–max]", "one weight pass ms, median [min–max]"]
    assert "interval / pass" not in weights
    assert all(len(row) == 3 for row in table_rows(weights.split("\n\n### ", 1)[0]) if row[0].startswith("P1"))


# --- d: throughput shown in report.md with its convention --------------------------------------------------


def test_report_shows_throughput_per_condition_with_its_convention_named(rich_run):
    timing = section(page(rich_run), "Timing")
    assert "median of the per-trial values" in timing and "includes the prompt" in timing
    trials = [t for t in records_of(rich_run, "timing_trial") if not t["warmup"] and t["prompt_id"] == "P1"
              and t["use_cache"]]
    rates = [stats.throughput_including_prompt(t["token_times_s"]) for t in trials]
    line = next(line for line in timing.splitlines() if line.startswith("Throughput"))
    length = trials[0]["prompt_length"]  # the output length beside every number (issue 55)
    expected = (f"P1, cache on ({length} prompt tokens, 16 output tokens) {statistics.median(rates):.1f} "
                f"[{min(rates):.1f}–{max(rates):.1f}]")
    assert expected in line, line
    for condition in ("P1, cache off", "P1x8, cache on", "P1x8, cache off"):
        assert condition in line


# --- e: top-p's rule is the smallest set whose mass reaches p ----------------------------------------------


def test_top_p_is_described_as_reaching_p_in_the_report(rich_run):
    first_step = section(page(rich_run), "First-step distribution")
    assert "smallest set of most probable ids whose mass reaches p" in first_step
    assert "exceeds" not in first_step


def test_no_source_or_doc_says_the_top_p_mass_exceeds_p():
    """The library keeps the smallest most-probable set whose mass reaches top_p (analytic_tests check it)."""
    places = [REPO_ROOT / "README.md", *[path for folder in ("inferlab", "docs", "experiments", "analytic_tests")
                                         for path in (REPO_ROOT / folder).rglob("*") if path.suffix in (".py", ".md")]]
    wrong = [str(path.relative_to(REPO_ROOT)) for path in places
             if re.search(r"mass\s+exceeds", path.read_text(encoding="utf-8"))]
    assert not wrong, f"'mass exceeds' in {wrong}; the rule is the smallest set whose mass reaches p"


# --- f: conditions that share a seed share random draws ----------------------------------------------------


def test_trials_say_that_a_shared_seed_means_shared_random_draws(rich_run):
    trials = section(page(rich_run), "Generation trials")
    assert "share the random draws" in trials and "not because their settings agree" in trials
    details = section(page(rich_run, DETAILS_FILE), "Generation trials in full")
    assert "share the random draws" in details


# --- h: what a generation trial's timed generate() holds besides the forwards ----------------------------------


def test_generate_durations_say_what_they_hold_without_the_copy_claim(rich_run):
    """Issue 44: transformers 4.57.1 copies each step's last logits whether or not output_logits is asked, so that
    copy is not why a generate() takes longer than the loop: the pages name generate()'s own per-step work, point to
    the profile, and no longer give the copy as the reason."""
    details = section(page(rich_run, DETAILS_FILE), "Generation trials in full")
    limitations = section(page(rich_run), "Limitations")
    for text in (details, limitations):
        assert "`generate()`'s own work at every step" in text and "docs/timing.md" in text
        assert "`output_logits`" not in text and "copying every step's raw logits" not in text
