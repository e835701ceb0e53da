"""`report DIR --after`: the learner's predictions (before) beside the attached explanation (after), and, once an
explanation is attached, the tool's own reading beside each answer; printed, never written into the run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlab import protocol
from inferlab.__main__ import main
from inferlab.files import sha256_file
from inferlab.measure import stats
from inferlab.run.records import PREDICTIONS_FILE
from inferlab.read.runview import RunView

from fixtures_records import copy_run, edit_manifest, rerender
from fixture_runs import fixture_runs
from grading_helpers import answered_explanation
from test_addenda import aligned, tree

ROOT = Path(__file__).resolve().parents[1]
PREDICTED = "Prediction: identical ids, every time"
EXACTNESS = "exactness, for the record: every logit of both paths must be the same number"
VERDICT_WORDS = {"faster": "faster with the cache", "slower": "slower with the cache",
                 "cannot_tell": "this run cannot tell"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A complete run whose learner supplied predictions (copied into it, as a session does)."""
    run = fixture_runs(tmp_path_factory).copy("complete", tmp_path_factory.mktemp("after") / "built")
    (run / PREDICTIONS_FILE).write_text((ROOT / PREDICTIONS_FILE).read_text().replace("Prediction:", PREDICTED, 1))
    edit_manifest(run, predictions={"supplied": True, "copied_to": PREDICTIONS_FILE,
                                    "sha256": sha256_file(run / PREDICTIONS_FILE), "template_unanswered": False,
                                    "source_mtime_utc": "2024-12-31T23:00:00+00:00",
                                    "copied_at_utc": "2025-01-01T00:00:00+00:00"})
    return rerender(run)  # the report and the inventory as the session would have written them


@pytest.fixture
def run(built, tmp_path) -> Path:
    return copy_run(built, tmp_path / "run")


def after(run: Path, capsys, status: int = 0) -> str:
    before = tree(run)
    assert main(["report", str(run), "--after"]) == status  # 1 when an addendum changed since it was attached
    assert tree(run) == before  # printed, nothing written into the run folder
    return capsys.readouterr().out


def attach(run: Path, tmp_path: Path, text: str) -> None:
    explanation = tmp_path / "explanation.md"
    explanation.write_text(text)
    assert main(["attach", str(run), str(explanation)]) == 0


def test_after_attaching_the_tools_reading_stands_beside_each_answer(run, tmp_path, capsys):
    aligned(run)  # the alignment checks revise requires (before anything is attached: it refreshes the inventory)
    attach(run, tmp_path, answered_explanation())
    assert main(["revise", str(run), "--cache-criterion", "0,0", "--justification", EXACTNESS]) == 0
    assert main(["report", str(run), "--check"]) == 0  # the addenda are not the session's page's input
    capsys.readouterr()
    page = after(run, capsys)
    assert page.startswith(f"# Before and after the run: {run.name}\n") and "SYNTHETIC SPECIMEN" in page
    assert ("**Written before the run:** `predictions.md`, copied into the run folder at 2025-01-01T00:00:00+00:00, "
            "before any model computation") in page and "the copy matches it" in page
    assert "**Written after the run:** the latest explanation, `addenda/explanation.md`" in page
    for number, question in protocol.QUESTIONS.items():  # predicted, then answered, then the tool's reading
        part = page[page.index(f"### {number}. {question}"):].split("\n### ")[0]
        order = [part.index(mark) for mark in ("*Predicted before the run*", "*Answered after the run* (addenda/"
                                               "explanation.md)", "> My own words on", "*The tool's reading:*")]
        assert order == sorted(order) and part.split("*The tool's reading:*")[1].strip().startswith("- ")
    assert f"> {PREDICTED}" in page[page.index("### 1."):page.index("### 2.")]
    timing = page[page.index("### 5."):page.index("### 6.")].split("*The tool's reading:*")[1]
    for verdict in stats.cache_verdicts(RunView.read(run).kind("timing_trial"))["verdicts"]:
        assert f"{verdict['prompt_id']}, " in timing and f"**{VERDICT_WORDS[verdict['verdict']]}**" in timing
    conclusions = page[page.index("## Conclusions and limitations"):page.index("## The cache criterion")]
    assert conclusions.index("### Limitation 2") < conclusions.index("*The tool's reading*, for comparison")
    assert "- On selection:" in conclusions and "- Three seeds per condition" in conclusions
    criteria = page[page.index("## The cache criterion"):page.index("## Every addendum")]
    assert "| revised after the run (seq 1) | `\\|a-b\\| <= 0 + 0*\\|b\\|" in criteria
    first, second = [r["prefix_length"] for r in RunView.read(run).kind("cache_comparison")][:2]
    assert f"| {first} | yes | yes |" in criteria and f"| {second} | yes | **no** |" in criteria  # bitwise, then not


def test_before_an_explanation_is_attached_the_page_holds_no_reading_and_once_it_changes_it_is_labelled(run, tmp_path,
                                                                                                          capsys):
    page = after(run, capsys)
    assert "no explanation is attached yet" in page and "`.venv/bin/inferlab attach DIR FILE`" in page
    assert "*The tool's reading" not in page and "this run cannot tell" not in page
    assert f"> {PREDICTED}" in page and "*(not answered in the explanation)*" in page
    assert "Nothing has been attached to this run." in page
    attach(run, tmp_path, answered_explanation())
    (run / "addenda/explanation.md").write_text(answered_explanation().replace("My own words", "A later answer"))
    capsys.readouterr()
    page = after(run, capsys, status=1)
    assert "now: **changed since it was attached**: addenda/explanation.md: size" in page
    assert "**What `verify` says of the addenda:**" in page and "(edited after it was attached)" in page


def test_a_ledger_entry_pointing_outside_addenda_is_never_read(run, tmp_path, capsys):
    secret = tmp_path / "secret.md"
    secret.write_text("## 1. Will repeated greedy runs\nnot for this page\n")
    (run / "addenda").mkdir()
    (run / "addenda/link.md").symlink_to(secret)
    base = {"schema": 1, "kind": "explanation", "original_name": "x.md", "size": 1, "sha256": "0" * 64,
            "attached_utc": "2025-01-02T00:00:00+00:00", "manifest_sha256": "0" * 64, "structure": None,
            "tool": "inferlab attach"}
    lines = [{**base, "seq": 0, "file": f"../../{secret.name}"}, {**base, "seq": 1, "file": "addenda/link.md"}]
    (run / "addenda.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = after(run, capsys, status=1)
    assert "not for this page" not in page and "**What `verify` says of the addenda:**" in page
