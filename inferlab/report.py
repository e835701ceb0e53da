"""report.md, written from a run's records alone (no model, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

from inferlab.records import REPORT_FILE, read_records, write_text_atomic


def render_report(record_dir: Path) -> str:
    """The report's Markdown text for a record directory."""
    records = read_records(record_dir)
    outcomes = [r for r in records if r["kind"] == "test_outcome"]
    lines = ["# inferlab run report", "", f"Record dir: `{record_dir}`", "", "## Test outcomes", ""]
    lines += ["| test | phase | outcome | reason |", "|---|---|---|---|"]
    for r in outcomes:
        reason = r.get("skip_reason") or ""
        lines.append(f"| `{r['test']}` | {r['phase']} | {r['outcome']} | {json.dumps(reason)[1:-1]} |")
    return "\n".join(lines) + "\n"


def write_report(record_dir: Path) -> Path:
    """Render and atomically write DIR/report.md."""
    path = Path(record_dir) / REPORT_FILE
    write_text_atomic(path, render_report(Path(record_dir)))
    return path
