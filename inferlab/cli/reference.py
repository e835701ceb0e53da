"""`reference RUN_DIR -o REF.json`: an instructor's reference from a run they trust, for `grade --reference`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, directory, refuse_non_run

NAME = "reference"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "the reference was written", 1: "the run is not one to trust (verify found problems, or it is not the "
                                                   "complete protocol): nothing written",
         2: "a usage error, a folder that is not a run, an output that exists or lies inside the run folder"}
HELP = ("an instructor's reference from a trusted run: the specimen's pins, the experiment's source hashes and every "
        "deterministic output, with a declared tolerance (keep it out of learners' reach)")
EPILOG = """exit status:
  0  the reference was written
  1  the run is not one to trust: verify found problems, or it is not the complete protocol (nothing written)
  2  a usage error, a folder that is not a run, or an output file that exists or lies inside the run folder"""


def add_arguments(parser) -> None:
    from inferlab.grading.reference import DEFAULT_ATOL, DEFAULT_RTOL

    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("record_dir", type=directory, metavar="RUN_DIR")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="REF.json", help="the file to write (new)")
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL,
                        help=f"absolute logit tolerance declared in the reference (default {DEFAULT_ATOL:g})")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL,
                        help=f"relative logit tolerance declared in the reference (default {DEFAULT_RTOL:g})")


def run(args) -> int:
    from inferlab.base.outputs import OutputPathError, output_kind
    from inferlab.base.records import write_json_atomic
    from inferlab.grading.reference import make_reference
    from inferlab.host.environment import describe_kernels
    from inferlab.reading.runview import RunView
    from inferlab.verify import verify_run

    if refuse_non_run("reference", args.record_dir):
        return EXIT_UNREADABLE
    target, run_dir = args.output, args.record_dir.resolve()
    if target.resolve() == run_dir or run_dir in target.resolve().parents:
        print(f"reference: {target} lies inside the run folder; nothing is written into a run folder", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        output_kind(target, replace=False)  # a file there is never replaced; a device or a FIFO is written through
    except OutputPathError as error:
        print(f"reference: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    if not (args.atol >= 0 and args.rtol >= 0):
        print(f"reference: --atol and --rtol must be >= 0, got {args.atol:g} and {args.rtol:g}", file=sys.stderr)
        return EXIT_UNREADABLE
    view = RunView.read(args.record_dir)
    result = verify_run(view)
    if result["problems"] or result["plan_folder"]:
        for line in result["problems"] or ["a plan folder: nothing was run"]:
            print(line)
        print(f"reference: {args.record_dir} is not a run to trust (verify: {len(result['problems'])} problem(s)); "
              "no reference written")
        return EXIT_PROBLEMS
    reference = make_reference(view, atol=args.atol, rtol=args.rtol)
    try:
        write_json_atomic(target, reference, replace=False)
    except OutputPathError as error:
        print(f"reference: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    outputs = reference["outputs"]
    print(f"reference: {target} from {args.record_dir} (specimen {reference['specimen'].get('name')}"
          f"{', SYNTHETIC' if reference['specimen'].get('synthetic') else ''}): {len(reference['sources'])} source "
          f"hashes, {len(outputs['generation'])} generation and {len(outputs['timing'])} timing trials, "
          f"{len(outputs['first_step'])} first-step logit summaries; tolerance {reference['tolerance']['rule']}; "
          f"the run used {describe_kernels(reference['from_run'].get('cpu_kernels'))}")
    return EXIT_OK
