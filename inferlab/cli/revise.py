"""`revise RUN_DIR --cache-criterion ATOL,RTOL --justification TEXT`: the run's saved matched-prefix logits judged
again under a justified revised criterion, kept as an addendum (inferlab.read.addenda); the declared criterion and
its verdict stay as recorded."""

from __future__ import annotations

import json

from pathlib import Path

from inferlab.cli import EXIT_OK
from inferlab.cli.attach import after_hint, cannot_write, refused, state_lines, waiting

NAME = "revise"
EXITS = {0: "judged again and kept", 1: "refused, nothing written: a tensor fails its hash, no cache comparison, "
                                         "misaligned prefixes, no manifest, a damaged ledger",
         2: "usage, nothing written: a bad or vacuous criterion, a thin justification, not a run or a plan folder, "
            "its session still running"}
HELP = ("judge RUN_DIR's saved matched-prefix logits again under a justified revised cache criterion and keep both "
        "criteria, both verdicts per prefix and the justification as an addendum (no model is loaded)")


def add_arguments(parser) -> None:
    parser.add_argument("record_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--cache-criterion", required=True, metavar="ATOL,RTOL",
                        help="the revised criterion |a-b| <= ATOL + RTOL*|b| (b the uncached logits)")
    parser.add_argument("--justification", required=True, metavar="TEXT",
                        help="why this criterion is justified, in your words; kept with it")


def run(args) -> int:
    from inferlab.base.records import jsonable, utc_now
    from inferlab.read import addenda

    try:
        tolerance = addenda.parse_criterion(args.cache_criterion)
        state = addenda.check_run(args.record_dir)
        now = utc_now()
        document = addenda.revision(state, tolerance, args.justification, now)
        data = (json.dumps(jsonable(document), ensure_ascii=True, allow_nan=False, indent=2) + "\n").encode("ascii")
        entry = addenda.store(state, data, "revised_criterion.json", addenda.REVISED_KIND, addenda.REVISE_TOOL,
                              on_wait=waiting(NAME, args.record_dir), clock=lambda: now)
    except addenda.Refused as error:
        return refused(NAME, error)
    except OSError as error:
        return cannot_write(NAME, args.record_dir, error)
    word = {True: "passed", False: "FAILED"}
    print(f"{NAME}: the saved logits of {len(document['prefixes'])} prefix(es), each matching its recorded SHA-256, "
          f"judged again\n  declared (as recorded): {document['declared']['rule']}\n  revised (yours): "
          f"{document['revised']['rule']}\n  {'prefix length':>13}  {'declared':>9}  {'revised':>8}  fail fraction")
    for row in document["prefixes"]:
        print(f"  {row['prefix_length']!s:>13}  {word.get(row['declared']['passed'], 'unknown'):>9}  "
              f"{word[row['revised']['passed']]:>8}  {row['revised']['fail_fraction']:.3g}")
    print("  the declared criterion and its verdict stay as recorded in records.jsonl")
    for line in state_lines(NAME, state, entry) + [after_hint(NAME, args.record_dir)]:
        print(line)
    return EXIT_OK
