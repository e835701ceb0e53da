"""The class page: every submission's items in one table, what pairs of submissions share (a run, records, timing
stamps, weight-read samples, an explanation, predictions: inferlab.grading.likeness), and one plot of how the
same protocol's measurement spreads across the class's machines (the decode-step interval with the cache over
the one without, per prompt length, one point per submission), its caption counting the distinct machines.

review_class(grades, traits) compares the submissions and adds each shared pair to both grades as a finding;
write_class_page(grades, folder, review) writes class.md and its plot into `folder`, which is never a run
folder. The page is drawn from the grades and the review alone, so it shows what grade found and nothing else.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.grading.evidence import FAIL
from inferlab.grading.grade import RunGrade, worst
from inferlab.grading import wording
from inferlab.grading.likeness import SHARED_FINDING, Traits, distinct_machines, flag_grades, learner_facts, \
    pair_text, shared_pairs, wording_figures
from inferlab.base.records import write_text_atomic
from inferlab.grading.rubric import ITEM_NUMBERS

CLASS_PAGE = "class.md"
SPREAD_PLOT = "class_decode_interval_ratio.png"
STATUS_CELL = {"pass": "pass", "manual": "manual", "fail": "**fail**"}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def review_class(grades: list[RunGrade], traits: list[Traits]) -> dict:
    """Compare the submissions (traits[i] is grades[i]'s), put their learners and machine into the grades' facts
    and every shared pair into both grades' findings; returns the class's part of the JSON format:
    {"submissions", "machines" (distinct fingerprints), "machine_fingerprints", "shared": [pairs], "wording": the
    rule, threshold and every compared pair's similarity figures (likeness.wording_figures)}."""
    learner_facts(grades, traits)
    pairs = shared_pairs(traits)
    flag_grades(grades, pairs)
    return {"submissions": len(grades), "machines": distinct_machines(traits),
            "machine_fingerprints": sorted({t.machine for t in traits if t.machine}),
            "shared": pairs, "unread": {t.label: t.unread for t in traits if t.unread},
            "wording": {"rule": wording.rule_text(), "threshold": wording.ALIKE_THRESHOLD,
                        "shingle_words": wording.SHINGLE_WORDS, "pairs": wording_figures(traits)}}


def learner_cell(grade: RunGrade) -> str:
    """The learners a submission names ('-' when none)."""
    from inferlab.grading.formats import learner_text

    return learner_text(grade) or "-"


def ratio_points(grades: list[RunGrade]) -> list[tuple[int, str, int, float]]:
    """(submission number, timing prompt, its token length, cache-on/cache-off decode interval ratio) for every
    submission that measured it."""
    points = []
    for number, grade in enumerate(grades, start=1):
        lengths = grade.facts.get("prompt_lengths") or {}
        for prompt_id in protocol.TIMING_PROMPTS:
            ratio = grade.measurements.get(f"decode_interval_ratio_on_off_{prompt_id}")
            if isinstance(ratio, float) and isinstance(lengths.get(prompt_id), int):
                points.append((number, prompt_id, lengths[prompt_id], ratio))
    return points


def plotted_machines(grades: list[RunGrade]) -> Optional[int]:
    """How many distinct machine fingerprints the plotted submissions carry (None before review_class)."""
    plotted = {n for n, _, _, _ in ratio_points(grades)}
    if not all("machine_fingerprint" in grades[n - 1].facts for n in plotted):
        return None
    return len({grades[n - 1].facts["machine_fingerprint"] for n in plotted} - {None})


def draw_spread(grades: list[RunGrade], path: Optional[Path]):
    """The plot: per timing prompt (labelled with the token lengths the runs found), one point per submission at
    its cache-on/cache-off decode interval ratio (1 = the cache changed nothing); the caption counts the
    submissions and, when known, the distinct machine fingerprints among them."""
    from inferlab.report.plots import _figure, _save

    points = ratio_points(grades)
    figure = _figure(7.5, 5.0)
    axis = figure.subplots()
    prompts = list(protocol.TIMING_PROMPTS)
    labels = []
    for index, prompt_id in enumerate(prompts):
        chosen = [p for p in points if p[1] == prompt_id]
        # a fixed spread across the column keeps submissions apart and the picture deterministic
        width = 0.5 / max(len(chosen) - 1, 1)
        xs = [index + (i - (len(chosen) - 1) / 2) * width for i in range(len(chosen))]
        axis.scatter(xs, [p[3] for p in chosen], s=30, zorder=3, color=f"C{index}")
        for x, point in zip(xs, chosen):
            axis.annotate(str(point[0]), (x, point[3]), textcoords="offset points", xytext=(3, 4),
                          fontsize="x-small")
        lengths = "/".join(str(n) for n in sorted({p[2] for p in chosen})) or "-"
        labels.append(f"{prompt_id}\n{lengths} tokens\n{len(chosen)} submissions")
    axis.axhline(1.0, color="black", linestyle="--", linewidth=1, label="1 = the cache changed nothing")
    axis.set_xticks(range(len(prompts)))
    axis.set_xticklabels(labels)
    axis.set_xlim(-0.6, len(prompts) - 0.4)
    axis.set_ylim(bottom=0)
    axis.set_ylabel("median decode interval, cache on / cache off\n(axis from 0)")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(loc="best", fontsize="small")
    caption = spread_caption(len({p[0] for p in points}), plotted_machines(grades))
    figure.suptitle(caption + "\neach point one submission (its number in the table); below 1: each decode step was "
                    "faster with the cache", fontsize="medium")
    if path is not None:
        _save(figure, path)
    return figure


def spread_caption(submissions: int, machines: Optional[int]) -> str:
    """'The same protocol in 5 submissions from 3 distinct machines (by fingerprint)'."""
    if machines is None:
        return f"The same protocol in {submissions} submissions"
    return (f"The same protocol in {submissions} submissions from {machines} distinct machine"
            f"{'' if machines == 1 else 's'} (by fingerprint)")


def shared_lines(review: Optional[dict]) -> list[str]:
    """The page's section on what pairs of submissions share."""
    lines = ["## Submissions that share evidence", ""]
    if review is None:
        return lines + ["Not compared (the class view was not asked to compare these submissions).", ""]
    pairs = review["shared"]
    if not pairs:
        lines.append(f"No two of the {review['submissions']} submissions share a run id, records.jsonl, timing "
                     "stamps, weight-read samples, an explanation or a predictions file, or word them alike.")
    else:
        lines += ["Each pair below shares something that honest work on separate machines does not (a run id "
                  "alone can coincide when two sessions started in the same second). This is for a person to "
                  "look at: no point was taken and no status changed; each submission's grade lists it as a "
                  "finding.", ""]
        for pair in pairs:
            lines.append(f"- {pair['a']}. {_cell(pair['labels'][0])} and {pair['b']}. {_cell(pair['labels'][1])}: "
                         f"{_cell(pair_text(pair))}")
    for label, why in sorted((review.get("unread") or {}).items()):
        lines.append(f"- {_cell(label)}: not compared ({_cell(why)})")
    lines += ["", wording_line(review.get("wording"))]
    machines = review["machines"]
    lines += ["", f"Machines: {machines} distinct fingerprint{'' if machines == 1 else 's'} (OS, architecture, CPU "
              "model, logical CPUs) among the submissions' manifests; identical machines share one.", ""]
    return lines


def wording_line(figures: Optional[dict]) -> str:
    """What 'worded alike' means on the page, and the most alike pair that was compared."""
    if not figures:
        return "Wording: not compared."
    best = max(((max(v for v in (p["explanation"], p["predictions"]) if v is not None), p)
                for p in figures["pairs"]), default=None, key=lambda x: x[0])
    closest = (f" The most alike pair compared: {best[1]['a']} and {best[1]['b']} ({best[0]:.0%})." if best
               else " No two submissions had writing of their own long enough to compare.")
    return (f"Wording: explanations and predictions that are not the same text are compared by {figures['rule']}; "
            f"it sees copies with whitespace, line wrapping and a few words changed, never a paraphrase in other "
            f"words, and text quoted honestly from the same records counts as shared wording.{closest}")


def _shared_cell(grade: RunGrade) -> str:
    others = sorted({f["other"] for f in grade.findings if f.get("kind") == SHARED_FINDING})
    return ", ".join(f"**{n}**" for n in others) or "-"


def class_lines(grades: list[RunGrade], plot_written: bool, now: Optional[str] = None,
                review: Optional[dict] = None) -> list[str]:
    """class.md's lines."""
    now = now or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rubric = grades[0].rubric.describe() if grades and grades[0].rubric else {}
    lines = [f"# Class grades: {len(grades)} submissions", "",
             f"Graded {now} with the rubric {rubric.get('name')} ({rubric.get('file')}); exit status "
             f"{worst(g.exit_status for g in grades)} (the worst of the submissions). Items: pass, manual (written "
             "work there, for a person to grade), **fail**. Integrity: what `verify` (and a reference, when given) "
             "found; a submission with an integrity problem earns no automatic points.", ""]
    header = ["#", "submission", "verdict", "learner", "specimen", "complete", "integrity"] + [
        str(n) for n in ITEM_NUMBERS] + ["score"] + [f"ratio {p}" for p in protocol.TIMING_PROMPTS] + [
        "timing trials contended", "shares with"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for number, grade in enumerate(grades, start=1):
        facts = grade.facts
        statuses = {i.number: STATUS_CELL.get(i.status, i.status) for i in grade.items}
        integrity = "not a run" if grade.error else (
            f"**{len(grade.integrity_problems)} problem(s)**" if grade.integrity_problems else "ok")
        specimen = f"{facts.get('specimen')}" + (" (synthetic)" if facts.get("synthetic") else "")
        ratios = [grade.measurements.get(f"decode_interval_ratio_on_off_{p}") for p in protocol.TIMING_PROMPTS]
        row = [str(number), _cell(grade.label), grade.verdict, _cell(learner_cell(grade)),
               _cell(specimen) if not grade.error else "-",
               ("yes" if facts.get("complete") else "no") if not grade.error else "-", integrity]
        row += [statuses.get(n, "-") for n in ITEM_NUMBERS]
        row += [f"{grade.score:g}/{grade.max_score:g}" if not grade.error else "-"]
        row += [f"{r:.3f}" if isinstance(r, float) else "-" for r in ratios]
        contended = grade.measurements.get("timing_trials_contended")
        row += [f"**{contended}**" if isinstance(contended, int) and contended else
                str(contended) if isinstance(contended, int) else "unknown"]
        row += [_shared_cell(grade)]
        lines.append("| " + " | ".join(row) + " |")
    lines += [""] + shared_lines(review)
    lines += ["## How one measurement spreads across the class's machines", ""]
    if plot_written:
        lines += [f"![decode interval ratio per submission]({SPREAD_PLOT})", "",
                  spread_caption(len({p[0] for p in ratio_points(grades)}), plotted_machines(grades)) + ".",
                  "Each point is one submission: the median post-first-token interval with the cache divided by the "
                  "one without, for each timing prompt at the length that run tokenized it to. The protocol is the "
                  "same everywhere; the spread is the machines (and their load). Below 1 the cache made each decode "
                  "step faster. Stand-in runs measure the same arithmetic on constructed weights."]
    else:
        lines += ["No submission measured the timing trials, so there is nothing to plot."]
    lines += ["", "## What each submission has to fix", ""]
    for number, grade in enumerate(grades, start=1):
        if grade.error:
            lines.append(f"- {number}. {_cell(grade.label)}: not a run: {_cell(grade.error)}")
            continue
        failing = [f"item {i.number} ({'; '.join(c.name for c in i.checks if c.status == FAIL)})"
                   for i in grade.items if i.status == FAIL]
        problems = grade.integrity_problems
        text = "; ".join(failing) or "nothing"
        if problems:
            text += f"; integrity: {_cell(problems[0])}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                                                           else "")
        lines.append(f"- {number}. {_cell(grade.label)}: {text}")
    return lines + [""]


def write_class_page(grades: list[RunGrade], folder: Path, review: Optional[dict] = None) -> list[Path]:
    """Write class.md (and its plot, when any submission measured timing) into `folder`; returns the files.
    review: what review_class found (the pairs that share evidence, the machines)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    plot_written = bool(ratio_points(grades))
    if plot_written:
        draw_spread(grades, folder / SPREAD_PLOT)
        written.append(folder / SPREAD_PLOT)
    write_text_atomic(folder / CLASS_PAGE, "\n".join(class_lines(grades, plot_written, review=review)))
    written.insert(0, folder / CLASS_PAGE)
    return written
