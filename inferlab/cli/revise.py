"""`revise RUN_DIR --cache-criterion ATOL,RTOL --justification TEXT`: the run's saved matched-prefix logits judged
again under a justified revised criterion (inferlab.recheck.revise), kept as an addendum; the declared criterion and its
verdict stay as recorded."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_UNREADABLE
from inferlab.cli.attach import after_hint, cannot_write, refused, state_lines, waiting
from inferlab.measure.revised_criterion import MIN_DISTINCT_WORDS, MIN_WORDS

NAME = "revise"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "judged again and kept", 1: "refused, nothing written: a tensor fails its hash, no cache comparison, "
                                         "misaligned prefixes, a plan, no manifest, a damaged ledger",
         2: "usage, nothing written: a bad or vacuous criterion, a thin or placeholder justification, not a run, its "
            "session still running, RUN_DIR cannot be written"}
HELP = ("judge RUN_DIR's saved matched-prefix logits again under a justified revised cache criterion and keep the "
        "result (both criteria, both verdicts per prefix, the justification, the time) as an addendum; the declared "
        "criterion and its verdict stay as recorded")
EXIT_CODES = f"""exit status:
  0  judged again and kept as RUN_DIR/addenda/revised_criterion.json (a new name each time)
  1  refused, nothing written: a saved tensor is missing or fails its recorded SHA-256 or shape; the run
     has no cache comparison, or a prefix's alignment checks did not all pass; RUN_DIR holds a plan, has
     no manifest.json, or its addenda ledger is damaged
  2  usage, nothing written: a bad ATOL,RTOL (RTOL must be below 1), or one under which every cached
     vector within the range of the run's own logits passes; no or a blank --justification, or one of
     fewer than {MIN_WORDS} words ({MIN_DISTINCT_WORDS} of them different) once placeholders (lorem, TODO,
     ...) are left out; RUN_DIR not a run's record dir,
     or its session still running; RUN_DIR cannot be written

No model is loaded: the logits are the ones the run saved in tensors/, checked against their hashes first."""


def add_arguments(parser) -> None:
    from inferlab.measure.revised_criterion import parse_criterion

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXIT_CODES
    parser.add_argument("record_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--cache-criterion", type=parse_criterion, required=True, metavar="ATOL,RTOL",
                        help="the revised criterion |a-b| <= ATOL + RTOL*|b| (b the uncached logits)")
    parser.add_argument("--justification", required=True, metavar="TEXT",
                        help="why this criterion is justified, in your words; kept with it")


def run(args) -> int:
    return run_revise(args.record_dir, args.cache_criterion, args.justification)


def run_revise(record_dir: Path, criterion, justification: str) -> int:
    """`revise RUN_DIR ...`: check, judge again, keep, and print both verdicts per prefix; the exit code."""
    from inferlab.base.records import jsonable, utc_now
    from inferlab.measure.revised_criterion import RevisedCriterion, justification_problem
    from inferlab.reading import addenda_store
    from inferlab.reading.addenda import REVISED_KIND
    from inferlab.recheck import revise

    if not justification.strip():
        print(f"{NAME}: --justification {justification!r}: expected a sentence saying why "
              f"{criterion.tolerance.describe()} is justified, actual a blank text; nothing was written",
              file=sys.stderr)
        return EXIT_UNREADABLE
    thin = justification_problem(justification) or placeholder_problem(justification)
    if thin is not None:
        print(f"{NAME}: --justification: {thin}; nothing was written", file=sys.stderr)
        return EXIT_UNREADABLE
    revised = RevisedCriterion(tolerance=criterion.tolerance, justification=justification.strip())
    try:
        state = addenda_store.check_run(record_dir)
        now = utc_now()
        document = revise.revision(state, revised, now)
        data = (json.dumps(jsonable(document), ensure_ascii=True, allow_nan=False, indent=2) + "\n").encode("ascii")
        entry = addenda_store.store(state, data, revise.DOCUMENT_NAME, REVISED_KIND, revise.TOOL,
                                    on_wait=waiting(NAME, record_dir), clock=lambda: now)
    except addenda_store.Refused as error:
        return refused(NAME, error)
    except OSError as error:
        return cannot_write(NAME, record_dir, error)
    for line in verdict_lines(document) + state_lines(NAME, state, entry):
        print(line)
    print(after_hint(NAME, record_dir))
    return EXIT_OK


def placeholder_problem(text: str):
    """Why a justification is only placeholders (lorem ipsum, TODO, ...: the list every learner text is judged
    by, inferlab.base.learner_text), or None: it must still have substance once they are left out."""
    from inferlab.base.learner_text import is_placeholder
    from inferlab.measure.revised_criterion import WORD, justification_problem

    found = WORD.findall(text)
    placeholders = [word for word in found if is_placeholder(word)]
    if not placeholders or justification_problem(" ".join(w for w in found if not is_placeholder(w))) is None:
        return None
    return (f"expected a sentence saying why the criterion is justified, in your words; actual {text!r}, whose "
            f"words {', '.join(sorted(set(placeholders)))} stand in for text without being any (without them it has "
            f"{len(found) - len(placeholders)} word(s), fewer than {MIN_WORDS} or fewer than {MIN_DISTINCT_WORDS} "
            f"different)")


def verdict_lines(document: dict) -> list[str]:
    """Both criteria and both verdicts per prefix, as a small table."""
    def word(value) -> str:
        return {True: "passed", False: "FAILED"}.get(value, "not recorded")

    declared, revised = document["declared"], document["revised"]
    count = len(document["prefixes"])
    lines = [f"{NAME}: the saved logits of {count} {'prefix' if count == 1 else 'prefixes'}, each matching its "
             f"recorded SHA-256, judged again",
             f"  declared ({declared['recorded_in']}, as recorded): {declared['rule']}",
             f"  revised (yours, with your justification):  {revised['rule']}",
             f"  {'prefix length':>13}  {'declared':>12}  {'revised':>8}  revised fail fraction"]
    for row in document["prefixes"]:
        lines.append(f"  {row['prefix_length']!s:>13}  {word(row['declared']['passed']):>12}  "
                     f"{word(row['revised']['passed']):>8}  {row['revised']['fail_fraction']:.3g}")
    summary = document["revised_evaluation"]
    failing = summary["failing_prefix_lengths"]
    lines.append(f"  under the revised criterion every prefix is within it: {'yes' if not failing else 'no'}"
                 + (f" (failing prefix lengths {failing})" if failing else ""))
    if document["declared_recomputed_disagrees_at"]:
        lines.append(f"  note: recomputed from the tensors, the declared verdict differs from the recorded one at "
                     f"prefix lengths {document['declared_recomputed_disagrees_at']}: `verify` the run")
    lines.append("  the declared criterion and its verdict stay as recorded in records.jsonl")
    return lines
