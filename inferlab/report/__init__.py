"""The report of a run, from its record directory alone (no model, no torch): report.md and report-details.md.

report.md (page.py) is the page a learner reads: status and verdict first, then the tables of each
part; report-details.md (details.py) holds the records behind each section. The tables are pure
functions of the records (tables.py); the verdict separates harness-integrity checks from protocol
diagnostics and says first when a run did not finish or was partial (verdict.py).

render_report() and render_details() are pure functions of what the session has written by the
time it renders them: records.jsonl, plan.json, the manifest fields that do not change at session
end, and the tensors. So `python -m inferlab report DIR --check` reproduces both pages byte for byte.
The command line renders with after_session=True: then, and only then, whether the manifest was
finalised (its `files` inventory and status) enters the verdict, because the session itself renders
before it writes that manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from inferlab import plots
from inferlab.records import REPORT_FILE, write_text_atomic
from inferlab.report import details, page, tables
from inferlab.report.fmt import MISSING, code, jstr
from inferlab.report.verdict import Verdict, decide, partial_note
from inferlab.report.view import RunView

DETAILS_FILE = details.DETAILS_FILE
SYNTHETIC_BANNER = page.SYNTHETIC_BANNER
PAGES = (REPORT_FILE, DETAILS_FILE)

__all__ = ["DETAILS_FILE", "MISSING", "PAGES", "SYNTHETIC_BANNER", "Verdict", "check_pages", "code", "jstr",
           "render_details", "render_pages", "render_report", "verdict_of", "write_report"]


def verdict_of(record_dir: Path, after_session: bool = False) -> Verdict:
    """The run's verdict (its kind, headline and the other facts that apply); after_session as in render_pages."""
    return decide(RunView(Path(record_dir)), after_session)


def render_pages(record_dir: Path, plot_errors: Optional[dict] = None, after_session: bool = False) -> dict[str, str]:
    """{report.md: text, report-details.md: text} for a record dir.

    plot_errors maps a plot name to the error that kept write_report from drawing it. after_session=True is for
    a report made once the session is over (the command line): a manifest never finalised then means the run's
    final writes were abandoned. The session renders before its final manifest and keeps the default.
    """
    view = RunView(Path(record_dir))
    return {REPORT_FILE: page.render(view, decide(view, after_session), plot_errors),
            DETAILS_FILE: details.render(view)}


def render_report(record_dir: Path, plot_errors: Optional[dict] = None, after_session: bool = False) -> str:
    """report.md's text for a record dir; after_session as in render_pages."""
    view = RunView(Path(record_dir))
    return page.render(view, decide(view, after_session), plot_errors)


def render_details(record_dir: Path) -> str:
    """report-details.md's text for a record dir."""
    return details.render(RunView(Path(record_dir)))


def write_report(record_dir: Path, after_session: bool = False) -> Path:
    """Draw the plots, then render and atomically write both pages; returns report.md's path.

    after_session as in render_pages: the session calls write_report(dir); `report DIR --write` passes True.
    """
    record_dir = Path(record_dir)
    view = RunView(record_dir)
    results = plots.write_plots(record_dir, view.records, partial=partial_note(decide(view, after_session), view),
                                bound_ratios=tables.bound_ratios(view))
    errors = {r["name"]: r["error"] for r in results if r["error"]}
    for name, text in render_pages(record_dir, plot_errors=errors, after_session=after_session).items():
        write_text_atomic(record_dir / name, text)
    return record_dir / REPORT_FILE


def check_pages(record_dir: Path, after_session: bool = False) -> list[str]:
    """One line per page whose regenerated text differs from the file (or that is missing); empty when both agree.

    With after_session=True the pages of a run whose final writes were abandoned differ from a page that the
    session wrote before the abandonment, which is the point: that page no longer says what the folder holds.
    """
    record_dir = Path(record_dir)
    problems = []
    for name, text in render_pages(record_dir, after_session=after_session).items():
        path = record_dir / name
        if not path.is_file():
            problems.append(f"{path} does not exist")
            continue
        old_lines, new_lines = path.read_text(encoding="utf-8").splitlines(), text.splitlines()
        if old_lines == new_lines and path.read_text(encoding="utf-8") == text:
            continue
        first = next((i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b),
                     min(len(old_lines), len(new_lines)))
        problems.append(f"regenerated text differs from {path} from line {first + 1}")
    return problems
