"""grade's `report --check`: the run's report.md and report-details.md against the pages rendered again from its
records (inferlab.report.check). A page that differs says something the records do not, so it is an integrity
problem, like a record verify cannot reconcile: a learner who edits the records and re-hashes the manifest but
leaves the old report, or edits the report and re-hashes it, is caught here.

What is not compared, and why:
  - a view with no folder (nothing to read);
  - pages another renderer version wrote (report.check says their text is not compared; verify still checks
    their hashes);
  - a run without report.md (killed before its end, or the page removed: verify names it), and a page
    that does not exist (the inventory names it): neither is said twice.
A run whose final writes were abandoned is compared as its session rendered it (before the manifest that was
never finalised); every other run as `report DIR --check` compares it.
"""

from __future__ import annotations

from inferlab.base.records import REPORT_FILE
from inferlab.reading.runview import RunView

STALE = "stale"


def stale_report_problems(view: RunView) -> list[str]:
    """One integrity line per report page that differs from its text rendered again from the records."""
    if view.directory is None or not (view.directory / REPORT_FILE).is_file():
        return []  # no report to be stale: verify says whether one should exist
    from inferlab import report
    from inferlab.base.commands import spelled

    checked = report.check(view, after_session=view.final_manifest_written)
    if checked.status != "differs":
        return []
    return [f"{line}: the report is {STALE}, it says what the records do not (`{spelled('report DIR --check')}` "
            f"compares it; only the records count)" for line in checked.lines if not line.endswith("does not exist")]
