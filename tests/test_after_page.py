"""`report DIR --after`: predictions (before) beside the attached explanation (after), a revised criterion beside the
declared one, each labelled; printed, never written into the run folder; report.md stays the session's page."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlab import report
from inferlab.__main__ import main
from inferlab.files import sha256_file
from inferlab.run.records import PREDICTIONS_FILE
from inferlab.read.runview import RunView

from fixtures_records import copy_run, edit_manifest, rerender
from fixture_runs import runs, fixture_runs  # noqa: F401 (runs is a fixture)
from test_addenda import tree
from test_addenda import aligned

ROOT = Path(__file__).resolve().parents[1]


def answered_explanation() -> str:
    """The template with every section answered in a line of its own."""
    lines = []
    for line in (ROOT / "explanation.md").read_text(encoding="utf-8").splitlines():
        lines.append(line)
        if line.startswith("### ") or line.startswith("## A conclusion"):
            lines.append("My answer, resting on records.jsonl seq 139.")
    return "\n".join(lines) + "\n"
PREDICTED = "Prediction: identical ids, every time"
EXACTNESS = "exactness, for the record: every logit of both paths must be the same number"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A complete run whose learner supplied predictions (copied into it, as a session does)."""
    run = fixture_runs(tmp_path_factory).copy("complete", tmp_path_factory.mktemp("after") / "built")
    text = (ROOT / PREDICTIONS_FILE).read_text().replace("Prediction:", PREDICTED, 1)
    (run / PREDICTIONS_FILE).write_text(text)
    edit_manifest(run, predictions={"supplied": True, "copied_to": PREDICTIONS_FILE,
                                    "sha256": sha256_file(run / PREDICTIONS_FILE),
                                    "source_mtime_utc": "2024-12-31T23:00:00+00:00",
                                    "copied_at_utc": "2025-01-01T00:00:00+00:00", "template_unanswered": False})
    return rerender(run)  # the report and the inventory as the session would have written them


@pytest.fixture
def run(built, tmp_path) -> Path:
    return copy_run(built, tmp_path / "run")


def after(run: Path, capsys, status: int = 0) -> str:
    before = tree(run)
    assert main(["report", str(run), "--after"]) == status  # 1 when an addendum changed since it was attached
    assert tree(run) == before  # printed, nothing written into the run folder
    return capsys.readouterr().out


def test_the_page_sets_each_prediction_beside_its_revisit_and_labels_both(run, tmp_path, capsys):
    aligned(run)  # the alignment checks revise requires (before anything is attached: it refreshes the inventory)
    explanation = tmp_path / "explanation.md"
    explanation.write_text(answered_explanation())
    assert main(["attach", str(run), str(explanation)]) == 0
    assert main(["revise", str(run), "--cache-criterion", "0,0", "--justification", EXACTNESS]) == 0
    capsys.readouterr()
    page = after(run, capsys)
    assert page.startswith(f"# Before and after the run: {run.name}\n")
    assert "**This is the after-run page, not the run's report.**" in page and "SYNTHETIC SPECIMEN" in page
    digest = sha256_file(run / PREDICTIONS_FILE)
    assert (f"**Written before the run:** `predictions.md`, copied into the run folder at 2025-01-01T00:00:00+00:00, "
            f"before any model computation") in page and f"`{digest[:16]}`…, the copy matches it" in page
    assert "**Written after the run:** the latest explanation, `addenda/explanation.md`" in page
    assert "now: intact" in page
    question = page[page.index("### 1. Will repeated greedy runs"):page.index("### 2.")]
    assert question.index("*Predicted before the run*") < question.index(f"> {PREDICTED}")
    assert question.index(f"> {PREDICTED}") < question.index("*Revisited after the run* (addenda/explanation.md)")
    assert "> My answer, resting on records.jsonl seq 139." in question
    assert "## Conclusions and limitations (written after the run)" in page and "### Limitation 2" in page
    criteria = page[page.index("## The cache criterion"):page.index("## Every addendum")]
    assert "| declared | `\\|a-b\\| <= 1e-05 + 0.0001*\\|b\\| (b = uncached reference)`" in criteria
    assert "| revised after the run (seq 1) | `\\|a-b\\| <= 0 + 0*\\|b\\|" in criteria
    assert EXACTNESS in criteria
    assert "| prefix length | declared (as recorded) | revised after" in criteria
    first, second = [r["prefix_length"] for r in RunView.read(run).kind("cache_comparison")][:2]
    assert f"| {first} | yes | yes |" in criteria and f"| {second} | yes | **no** |" in criteria  # bitwise, then not
    assert "| 0 | explanation | `addenda/explanation.md`" in page and "| 1 | revised_criterion |" in page
    assert "What `verify` says" not in page


def test_a_changed_explanation_is_labelled_and_verify_s_words_are_shown(run, tmp_path, capsys):
    explanation = tmp_path / "explanation.md"
    explanation.write_text(answered_explanation())
    assert main(["attach", str(run), str(explanation)]) == 0
    (run / "addenda/explanation.md").write_text(answered_explanation().replace("My answer", "A later answer"))
    capsys.readouterr()
    page = after(run, capsys, status=1)
    assert "now: **changed since it was attached**: addenda/explanation.md: size" in page
    assert "**What `verify` says of the addenda:**" in page and "(edited after it was attached)" in page


def test_without_an_explanation_the_page_says_how_to_attach_one(run, capsys):
    page = after(run, capsys)
    assert "no explanation is attached yet" in page and "`.venv/bin/inferlab attach DIR FILE`" in page
    assert "> " + PREDICTED in page and "*(not revisited in the explanation)*" in page
    assert "Nothing has been attached to this run." in page


def test_a_revised_criterion_of_the_run_stands_beside_the_declared_one(runs, capsys):
    run = runs.get("rich")
    page = after(run, capsys)
    assert "no predictions were supplied" in page
    assert ("| revised during the run | `\\|a-b\\| <= 0.0001 + 0.001*\\|b\\|` | --revised-cache-criterion, recorded by "
            "the session (cache_criterion_revised seq") in page and "a test justification" in page
    assert "| prefix length | declared (as recorded) | revised during the run |" in page


def test_a_plan_folder_has_no_after_run_page(runs, capsys):
    plan = runs.get("plan")
    assert main(["report", str(plan), "--after"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "is a plan folder" in captured.err


def test_report_md_says_where_the_after_run_page_comes_from_and_attaching_leaves_it_checkable(run, tmp_path, capsys):
    text = report.render_report(run)
    assert "`.venv/bin/inferlab attach DIR FILE`" in text and "`.venv/bin/inferlab report DIR --after`" in text
    explanation = tmp_path / "explanation.md"
    explanation.write_text(answered_explanation())
    assert main(["attach", str(run), str(explanation)]) == 0
    capsys.readouterr()
    assert main(["report", str(run), "--check"]) == 0  # the addenda are not the session's pages' input
    assert "regenerated text is identical" in capsys.readouterr().out


def test_a_ledger_entry_pointing_outside_addenda_is_never_read(run, tmp_path, capsys):
    import json

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
