"""The report of a run, from its record directory alone (no model, no torch): report.md and report-details.md.

report.md (page.py, sections.py) is the page a learner reads: status and verdict first, then the tables of
each part; report-details.md (details.py) holds the records behind each section. The tables are pure
functions of one run's view (tables.py, measures.py; the view is inferlab.read.runview.RunView); the verdict
separates harness-integrity checks from protocol diagnostics and says first when a run did not finish or
was partial (verdict.py).

render_report() and render_details() are pure functions of what the session has written by the
time it renders them: records.jsonl, plan.json, the manifest fields that do not change at session
end, and the tensors. So `python -m inferlab report DIR --check` reproduces both pages byte for byte.
The command line renders with after_session=True: then, and only then, whether the manifest was
finalised (its `files` inventory) enters the verdict, because the session itself renders before it
writes that manifest.

RENDERER_VERSION names the text this renderer produces. The session records it in the manifest (field
inferlab.read.runview.RENDERER_VERSION_FIELD; a run without it was rendered by version 1), and check() does not
compare pages that another version rendered: it says so, and verify's hashes of the pages still hold.
Raise it whenever the text rendered from the same files changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from inferlab.files import write_text_atomic
from inferlab.run.records import REPORT_FILE, REPORT_RENDERER_VERSION
from inferlab.read.runview import RunView
from inferlab.report import plots
from inferlab.report import details, measures, page
from inferlab.report.fmt import MISSING, code, jstr
from inferlab.report.verdict import Verdict, decide, partial_note

RENDERER_VERSION = REPORT_RENDERER_VERSION
DETAILS_FILE = details.DETAILS_FILE
SYNTHETIC_BANNER = page.SYNTHETIC_BANNER
PAGES = (REPORT_FILE, DETAILS_FILE)
Run = Union[Path, str, RunView]  # a record dir, or a view of one already read

__all__ = ["DETAILS_FILE", "MISSING", "PAGES", "PageCheck", "RENDERER_VERSION", "SYNTHETIC_BANNER", "Verdict",
           "check", "check_pages", "code", "jstr", "render_details", "render_pages", "render_report", "verdict_of",
           "write_report"]


def _view(run: Run) -> RunView:
    return run if isinstance(run, RunView) else RunView.read(Path(run))


def verdict_of(run: Run, after_session: bool = False) -> Verdict:
    """The run's verdict (its kind, headline and the other facts that apply); after_session as in render_pages."""
    return decide(_view(run), after_session)


def _render(view: RunView, verdict: Verdict, plot_errors: Optional[dict]) -> dict[str, str]:
    # report.md first: the details page lists the tensor files it could not read
    report_text = page.render(view, verdict, plot_errors)
    return {REPORT_FILE: report_text, DETAILS_FILE: details.render(view)}


def render_pages(run: Run, plot_errors: Optional[dict] = None, after_session: bool = False) -> dict[str, str]:
    """{report.md: text, report-details.md: text} for a record dir (or a view of one).

    plot_errors maps a plot name to the error that kept write_report from drawing it. after_session=True is for
    a report made once the session is over (the command line): a manifest never finalised then means the run's
    final writes were abandoned. The session renders before its final manifest and keeps the default.
    """
    view = _view(run)
    return _render(view, decide(view, after_session), plot_errors)


def render_report(run: Run, plot_errors: Optional[dict] = None, after_session: bool = False) -> str:
    """report.md's text for a record dir; after_session as in render_pages."""
    view = _view(run)
    return page.render(view, decide(view, after_session), plot_errors)


def render_details(run: Run) -> str:
    """report-details.md's text for a record dir."""
    return details.render(_view(run))


def write_report(run: Run, after_session: bool = False) -> Path:
    """Draw the plots, then render and atomically write both pages into the record dir; returns report.md's path.

    The run is read once, and its verdict decided once, for the plots and both pages. after_session as in
    render_pages: the session calls write_report(dir); `report DIR --write` passes True.
    """
    view = _view(run)
    record_dir = view.directory
    verdict = decide(view, after_session)
    results = plots.write_plots(record_dir, view.records, partial=partial_note(verdict, view),
                                bound_ratios=measures.bound_ratios(view))
    errors = {r["name"]: r["error"] for r in results if r["error"]}
    for name, text in _render(view, verdict, errors).items():
        write_text_atomic(record_dir / name, text)
    return record_dir / REPORT_FILE


@dataclass
class PageCheck:
    """The pages against their regenerated text: 'identical', 'differs' (lines say where), or 'other_renderer'
    (another renderer version wrote them, so their text is not compared)."""

    status: str
    lines: list[str] = field(default_factory=list)
    renderer_version: int = RENDERER_VERSION


def check(run: Run, after_session: bool = False) -> PageCheck:
    """Regenerate both pages and compare them with the files, unless another renderer version wrote them.

    With after_session=True the pages of a run whose final writes were abandoned differ from a page that the
    session wrote before the abandonment, which is the point: that page no longer says what the folder holds.
    """
    view = _view(run)
    record_dir = view.directory
    if view.renderer_version != RENDERER_VERSION:
        return PageCheck("other_renderer", [
            f"{record_dir}: its pages were rendered by report renderer version {view.renderer_version}, and this "
            f"inferlab renders version {RENDERER_VERSION}, so their text is not compared: they are neither called "
            f"identical nor different. `verify` still checks {REPORT_FILE} and {DETAILS_FILE} against the "
            f"manifest's SHA-256"], view.renderer_version)
    problems = []
    for name, text in render_pages(view, after_session=after_session).items():
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
    return PageCheck("differs" if problems else "identical", problems, view.renderer_version)


def check_pages(run: Run, after_session: bool = False) -> list[str]:
    """One line per page whose regenerated text differs from the file (or that is missing), or the one line that
    says another renderer version wrote them; empty when both agree (see check)."""
    return check(run, after_session).lines
