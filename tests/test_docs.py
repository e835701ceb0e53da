"""The README fits a learner's time and follows the lab's order; every reference page says who it is for and
every link resolves; docs/options.md names every option of the run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferlab.run.session import OPTIONS

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
MAX_LINES, MAX_WORDS = 180, 1800  # about ten minutes of reading, a sixth of the lab's 60 to 90 minutes


def test_the_readme_fits_a_learners_reading_time():
    text = README.read_text(encoding="utf-8")
    lines, words = len(text.splitlines()), len(text.split())
    assert lines <= MAX_LINES, f"README.md has {lines} lines, over {MAX_LINES}: move reference material to docs/"
    assert words <= MAX_WORDS, f"README.md has {words} words, over {MAX_WORDS}: move reference material to docs/"


# Phrases that would answer one of predictions.md's six questions (greedy repeats, seeds, temperature against
# top-p, cached against uncached logits, whether the cache is faster, what a parameter count leaves out).
ANSWERING = ("not the logits", "change the logits", "changes the logits", "floating-point", "bitwise", "identical",
             "always differ", "faster", "slower", "leaves out", "agree to", "differ by")


def test_the_readme_answers_no_prediction_before_step_one_asks_for_it():
    text = README.read_text(encoding="utf-8")
    opening = text[:text.find("cp predictions.md my_predictions.md")].lower()
    assert opening, "the README has no predictions step"
    found = [phrase for phrase in ANSWERING if phrase in opening]
    assert not found, f"README.md answers a prediction before step 1 asks for it: {found}"


def test_the_readme_walks_the_lab_in_its_order():
    text = README.read_text(encoding="utf-8")
    steps = ["cp predictions.md my_predictions.md", 'make run ARGS="--specimen standin --predictions my_predictions.md',
             "--artifacts", "report.md", "cp explanation.md my_explanation.md",
             "inferlab attach RUN_DIR my_explanation.md", "inferlab revise RUN_DIR --cache-criterion ATOL,RTOL "
             "--justification TEXT", "inferlab verify RUN_DIR",
             "inferlab grade RUN_DIR", "inferlab pack RUN_DIR -o submission.tar.gz", "make test",
             "## When the first run fails", "## How to read the report", "## What the tool cannot tell you",
             "docs/README.md"]
    at = [text.find(step) for step in steps]
    assert -1 not in at, f"README.md lacks {[s for s, i in zip(steps, at) if i < 0]}"
    assert at == sorted(at), f"README.md has them out of the lab's order: {[s for _, s in sorted(zip(at, steps))]}"
    assert text.find("make run") == at[1], "the first `make run` must come after the predictions' copy and pass it"
    # the environment, and without it
    assert ". .venv/bin/activate" in text and "cannot import torch: it is not the project's environment" in text


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda page: page.name)
def test_every_reference_page_starts_with_who_it_is_for(page):
    paragraphs = page.read_text(encoding="utf-8").split("\n\n")
    assert paragraphs[0].startswith("# ") and paragraphs[1].startswith("**For:**"), \
        f"{page.relative_to(REPO_ROOT)}: expected a title, then a paragraph starting '**For:**'"


def test_every_link_between_the_pages_resolves_the_index_lists_every_page_and_options_md_every_option():
    broken = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            resolved = (page.parent / target).resolve()
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO_ROOT)} -> {target}")
    assert not broken, f"links to nothing: {broken}"
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and f"]({p.name})" not in index]
    assert not unlisted, f"docs/README.md does not list {unlisted}"
    page = (DOCS / "options.md").read_text(encoding="utf-8")
    assert [flag for flag in OPTIONS if f"`{flag}" not in page] == [], "docs/options.md lacks an option of the run"
