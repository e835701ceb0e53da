"""Reading what was attached after a session: the ledger's format and the explanation's structure check."""

from __future__ import annotations

import json
from pathlib import Path

from inferlab.reading import addenda
from inferlab.reading.runview import RunView

from fixture_runs import runs  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = (ROOT / addenda.EXPLANATION_TEMPLATE).read_text(encoding="utf-8")
GUIDANCE = "What you predicted, what the run shows (which records), and what you now think."


def entry(seq: int, **fields) -> dict:
    base = {"schema": addenda.LEDGER_SCHEMA, "seq": seq, "kind": "explanation", "file": f"addenda/e{seq}.md",
            "original_name": "e.md", "size": 1, "sha256": "0" * 64, "attached_utc": "2026-12-01T00:00:00+00:00",
            "manifest_sha256": "1" * 64, "structure": None, "tool": "inferlab attach"}
    return {**base, **fields}


def test_the_blank_template_is_complete_in_form_but_every_answer_is_empty():
    structure = addenda.structure_of(TEMPLATE, TEMPLATE)
    assert structure["ok"] is False and not structure["headings_missing"]
    # the two headings that only group deeper ones need no text of their own
    assert "Predictions revisited" not in structure["empty_sections"] and "Limitations" not in structure["empty_sections"]
    assert "A conclusion about selection" in structure["empty_sections"] and len(structure["empty_sections"]) == 10


def test_an_answered_explanation_passes_and_a_missing_limitation_is_named():
    answered = TEMPLATE.replace(GUIDANCE, "Identical ids (records.jsonl seq 40, 41, 42).")
    for guidance in ("One conclusion about token selection that this run supports, and the records it rests on.",
                     "One thing this run cannot tell you, and why.", "Another thing this run cannot tell you, and why."):
        answered = answered.replace(guidance, "My own words, citing seq 139.")
    answered = answered.replace("One conclusion about repeated computation (the cache, prefill, decode steps) that "
                                "this run supports, and\nthe records it rests on.", "Cached logits agreed (seq 147).")
    assert addenda.structure_of(answered, TEMPLATE)["ok"] is True
    without = answered.replace("### Limitation 2\n", "")
    structure = addenda.structure_of(without, TEMPLATE)
    assert structure["ok"] is False and structure["headings_missing"] == ["Limitation 2"]


def test_without_a_template_the_structure_is_not_judged():
    assert addenda.structure_of("anything", None)["ok"] is None


def test_the_view_reads_the_ledger_apart_from_the_session_problems(runs, tmp_path):
    run = runs.copy("complete", tmp_path / "run")
    assert RunView.read(run).addenda == [] and RunView.read(run).addenda_problems == []
    lines = [json.dumps(entry(0)), "not json", json.dumps({"seq": 2}), json.dumps(entry(3))[:20]]
    (run / addenda.LEDGER_FILE).write_text("\n".join(lines))  # the last line torn (no newline)
    view = RunView.read(run)
    assert [e["seq"] for e in view.addenda] == [0, 2]
    problems = [str(p) for p in view.addenda_problems]
    assert problems[0].startswith("addenda.jsonl:2: not a JSON object")
    assert problems[1].startswith("addenda.jsonl:3: missing field(s) schema, kind")
    assert any("4: not a JSON object" in p for p in problems) and any("torn write" in p for p in problems)
    assert view.read_problems == []  # the session's own files are as they were
