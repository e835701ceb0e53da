"""The command line, one table of subcommands: for the learner verify, report, compare, check-artifacts, attach,
revise and pack; for the instructor grade and autograder. Every command first checks that this Python has the
project's packages (exit 2, one line naming the Python to use), reads files only (no model, no network), writes
nothing into a run but `attach`'s and `revise`'s addenda, and refuses an existing output file unless --replace.
Each command's exit statuses are in COMMANDS (docs/records.md holds them as a table: exit_code_table).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import sys
from pathlib import Path

from inferlab.files import PROG, spelled

EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, EXIT_INTEGRITY, EXIT_READER_GONE = 0, 1, 2, 3, 141
REPLACE_HELP = "replace the output file if it exists (without this flag an existing file is refused and kept)"
NUMBERS = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?:,[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)*$")


def directory(value: str) -> Path:
    if not Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"{value} is not a directory")
    return Path(value)


def say(command: str, message: str, code: int = EXIT_UNREADABLE) -> int:
    print(f"{command}: {message}", file=sys.stderr)
    return code  # the exit status the message goes with


def refuse_non_run(command: str, *record_dirs: Path) -> bool:
    """Say so (and True) when a folder is not a run's record dir, or is a plan folder: every command refuses both
    the same way, exit 2, reading or writing nothing there."""
    from inferlab.read.parse import not_a_run_reason
    from inferlab.read.runview import RunView

    refused = False
    for record_dir in record_dirs:
        reason = not_a_run_reason(record_dir)
        if reason is None and RunView.read(record_dir).is_plan_folder:
            reason = (f"{record_dir} is a plan folder (written by --plan): no test ran, so there is no run to "
                      f"{command}; run the experiment without --plan")
        if reason:
            refused = bool(say(command, f"{reason}; nothing was read or written there"))
    return refused


# --- the learner's commands ----------------------------------------------------------------------------------


def verify(args) -> int:
    from inferlab.read.verify import verify_run

    if refuse_non_run("verify", args.record_dir):
        return EXIT_UNREADABLE
    result = verify_run(args.record_dir)
    counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(result["outcome_counts"].items())) or "no test outcome"
    problems = result["problems"] + ([f"not every test passed: {counts}"]
                                     if args.all_passed and not result["all_tests_passed"] else [])
    for line in problems + [f"not checked: {line}" for line in result["not_checked"]]:
        print(line)
    failing, acquisition = result["failures_by_check_kind"], result.get("acquisition_failure") or {}
    if acquisition and not failing.get("diagnostic") and failing.get("integrity") == acquisition.get("failed_tests"):
        found = (f"; nothing was measured: the specimen could not be acquired ({acquisition.get('cause')}), which is "
                 "no harness fault (its reason and next steps: the report)")
    elif failing.get("integrity"):
        found = f"; the harness failed: {failing['integrity']} harness-integrity check(s) failed or errored"
    elif failing.get("diagnostic"):
        found = (f"; the protocol ran and found {failing['diagnostic']} finding(s) (failed protocol diagnostics, "
                 "kept with their evidence); no harness-integrity check failed")
    else:
        found = ""
    if problems:
        incomplete = "" if result["complete"] else "; NOT the complete protocol"
        print(f"verify: {len(problems)} problem(s) in {args.record_dir}{incomplete}{found}")
        return EXIT_PROBLEMS
    gaps = "" if result["all_tests_passed"] else (
        f"; not every test passed ({counts}), and each of the {len(result['explained_gaps'])} gap(s) this leaves "
        "(a record the protocol expects that is not there) has its recorded evidence")
    added = result["addenda"]
    attached = f"; {added} {'addendum' if added == 1 else 'addenda'} added after the session, intact" if added else ""
    print(f"verify: OK ({result['records']} records, {result['files_checked']} files){gaps}{attached}{found}")
    return EXIT_OK


def report(args) -> int:
    from inferlab import report as pages
    from inferlab.read.runview import RunView

    if refuse_non_run("report", args.record_dir):
        return EXIT_UNREADABLE
    view = RunView.read(args.record_dir)
    if view.session_end is None:
        how = "it is still running" if view.claimant_live else "it never reached its end (killed or crashed)"
        say("report", f"{args.record_dir} has no session_end record ({how}): the run is not complete")
    if args.after:
        from inferlab.report import after

        page = after.AfterPage(view)
        sys.stdout.write(page.render())
        if page.problems:
            return say("report", f"{len(page.problems)} problem(s) with the addenda of {args.record_dir} (an addendum "
                                 "changed, removed or not listed since it was attached; the page's last section names "
                                 "each): exit 1", EXIT_PROBLEMS)
        return EXIT_OK
    if not args.check:
        sys.stdout.write(pages.render_report(view, after_session=True))
        return EXIT_OK
    checked = pages.check(view, after_session=True)
    for line in checked.lines:
        print(f"report: {line}")
    if checked.status != "identical":
        return EXIT_INTEGRITY if checked.status == "other_renderer" else EXIT_PROBLEMS
    print(f"report: regenerated text is identical to {', '.join(pages.PAGES)} in {args.record_dir}")
    return EXIT_OK


def compare(args) -> int:
    from inferlab.read.verify import verify_run
    from inferlab.report.compare import compare as compared, format_compare

    if refuse_non_run("compare", args.dir1, args.dir2):
        return EXIT_UNREADABLE
    if args.dir1.resolve() == args.dir2.resolve():
        return say("compare", f"DIR1 and DIR2 are the same run folder ({args.dir1}); give two runs")
    short = {name: verify_run(d)["completeness"] for name, d in (("DIR1", args.dir1), ("DIR2", args.dir2))}
    result = compared(args.dir1, args.dir2)
    for name, lines in short.items():  # said first: the rows below cover only what such a run recorded
        for line in lines:
            print(f"compare: {name} fails verify as unfinished or partial: {line}")
    if any(short.values()):
        print(f"compare: the rows below compare only what each run recorded, and the exit is {EXIT_PROBLEMS} "
              f"(`{spelled('verify DIR')}` says what is missing)")
    sys.stdout.write(format_compare(result))
    if any(result["integrity"].values()):
        return EXIT_INTEGRITY
    return EXIT_PROBLEMS if any(short.values()) else EXIT_OK


def check_artifacts(args) -> int:
    from inferlab import specimen

    try:
        lines, ok = specimen.checked_copy_lines(args.artifacts_dir, args.specimen)
    except specimen.SpecimenError as error:
        return say("check-artifacts", str(error))
    print("\n".join(lines))
    return EXIT_OK if ok else EXIT_PROBLEMS


def _kept(command: str, state, entry: dict) -> None:
    """What every successful attach or revise says: where it was kept, bound to what, how to see it."""
    where = shlex.quote(str(state.directory))
    print(f"{command}: kept {state.directory / entry['file']} ({entry['size']} bytes, sha256 "
          f"{entry['sha256'][:16]}..., addenda.jsonl seq {entry['seq']}), bound to this run's manifest.json (sha256 "
          f"{entry['manifest_sha256'][:16]}...)" + ("" if state.finished else f"; the run is {state.state}"))
    print(f"{command}: `{spelled(f'report {where} --after')}` shows it beside what the session recorded; "
          f"`{spelled(f'verify {where}')}` checks it")


def _kept_or_refused(command: str, keep) -> int:
    """Run keep(): Refused (nothing written) is exit 1 or 2, an OSError while writing (undone) exit 2."""
    from inferlab.read.addenda import Refused

    try:
        return keep()
    except Refused as error:
        return say(command, f"{error}; nothing was written", EXIT_UNREADABLE if error.usage else EXIT_PROBLEMS)
    except OSError as error:
        return say(command, f"{getattr(error, 'filename', None) or 'the run'} could not be written "
                            f"({error.strerror or error}); nothing was kept")


def attach(args) -> int:
    from inferlab import writing
    from inferlab.files import PROJECT_ROOT, sha256_bytes
    from inferlab.read import addenda

    if args.kind == addenda.REVISED_KIND or not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", args.kind):
        return say("attach", f"--kind {args.kind!r}: expected a lower-case word other than {addenda.REVISED_KIND} "
                             "(which revise writes)")

    def keep() -> int:
        state = addenda.check_run(args.record_dir)
        addenda.refuse_run_file(args.file, args.record_dir)
        data = addenda.read_text_file(args.file)
        digest = sha256_bytes(data)
        same = next((e for e in state.view.addenda if e.get("kind") == args.kind and e.get("sha256") == digest), None)
        if same is not None and not state.view.addenda_problems:
            print(f"attach: {args.file} is byte for byte the {args.kind} already attached as {same['file']} "
                  f"(addenda.jsonl seq {same['seq']}); nothing was written")
            return EXIT_OK
        structure = writing.structure(data.decode("utf-8"), writing.template(
            PROJECT_ROOT, writing.EXPLANATION_TEMPLATE)) if args.kind == addenda.EXPLANATION_KIND else None
        entry = addenda.store(state, data, str(args.file), args.kind, "inferlab attach", structure,
                              on_wait=lambda: say("attach", "waiting for another attach or revise to finish"))
        _kept("attach", state, entry)
        if structure is not None and structure["ok"] is not False:
            print(f"attach: the explanation has every heading of {writing.EXPLANATION_TEMPLATE}, each with text of "
                  f"your own (its form only: whether the content is right is for a person to judge)")
        elif structure is not None:
            gaps = structure["headings_missing"] + structure["empty_sections"]
            say("attach", f"warning: not yet written in your own words: {'; '.join(gaps)}. It was kept as it is; "
                          "attach it again once it is complete (every version is kept)", EXIT_OK)
        return EXIT_OK

    return _kept_or_refused("attach", keep)


def revise(args) -> int:
    import json

    from inferlab.files import jsonable
    from inferlab.run.records import utc_now
    from inferlab.read import addenda

    def keep() -> int:
        tolerance = addenda.parse_criterion(args.cache_criterion)
        state = addenda.check_run(args.record_dir)
        now = utc_now()
        document = addenda.revision(state, tolerance, args.justification, now)
        data = (json.dumps(jsonable(document), ensure_ascii=True, allow_nan=False, indent=2) + "\n").encode("ascii")
        entry = addenda.store(state, data, "revised_criterion.json", addenda.REVISED_KIND, addenda.REVISE_TOOL,
                              clock=lambda: now)
        word = {True: "passed", False: "FAILED"}
        print(f"revise: the saved logits of {len(document['prefixes'])} prefix(es), each matching its recorded "
              f"SHA-256, judged again\n  declared (as recorded): {document['declared']['rule']}\n  revised (yours): "
              f"{document['revised']['rule']}\n  {'prefix length':>13}  {'declared':>9}  {'revised':>8}  fail fraction")
        for row in document["prefixes"]:
            print(f"  {row['prefix_length']!s:>13}  {word.get(row['declared']['passed'], 'unknown'):>9}  "
                  f"{word[row['revised']['passed']]:>8}  {row['revised']['fail_fraction']:.3g}")
        print("  the declared criterion and its verdict stay as recorded in records.jsonl")
        _kept("revise", state, entry)
        return EXIT_OK

    return _kept_or_refused("revise", keep)


def pack(args) -> int:
    from inferlab.grade.archive import ArchiveError, pack as packed
    from inferlab.read.runview import RunView
    from inferlab.read.verify import verify_run

    if refuse_non_run("pack", args.record_dir):
        return EXIT_UNREADABLE
    view = RunView.read(args.record_dir)
    try:
        done = packed(view, args.output, learner=args.learner, replace=args.replace)
    except ArchiveError as error:
        return say("pack", str(error))
    print(f"pack: {done['archive']}: run {done['run']}, {done['files']} files, {done['bytes']} bytes"
          + (f", learner {args.learner.strip()}" if args.learner else ", no learner id (--learner ID)"))
    problems = verify_run(view)["problems"]
    for line in problems:
        print(f"  {line}")
    if problems:
        print(f"pack: verify found {len(problems)} problem(s) in the run; grade will report them")
    return EXIT_PROBLEMS if problems else EXIT_OK


# --- the table -----------------------------------------------------------------------------------------------


def _command_of(module: str):
    """A subcommand run by a module's command(args), imported only when it runs."""
    return lambda args: importlib.import_module(module).command(args)


RUN_DIR = (("record_dir",), {"type": directory, "metavar": "DIR"})
REPLACE = (("--replace",), {"action": "store_true", "help": REPLACE_HELP})
ARGUMENTS = {  # each command's arguments: (names, argparse settings)
    "verify": [RUN_DIR, (("--all-passed",), {"action": "store_true", "help": "also count a failed or skipped test"})],
    "report": [RUN_DIR, (("--check",), {"action": "store_true", "help": "compare with DIR's pages instead of "
                                        "printing: exit 1 if they differ"}),
               (("--after",), {"action": "store_true", "help": "the after-run page: your predictions beside your "
                               "explanation, the tool's reading beside both; exit 1 if an addendum changed"})],
    "compare": [(("dir1",), {"type": directory, "metavar": "DIR1"}),
                (("dir2",), {"type": directory, "metavar": "DIR2"})],
    "check-artifacts": [(("artifacts_dir",), {"type": directory, "metavar": "DIR"}),
                        (("--specimen",), {"metavar": "NAME", "help": "artifacts/NAME.json (default: pythia-14m)"})],
    "attach": [(("record_dir",), {"type": Path, "metavar": "RUN_DIR"}), (("file",), {"type": Path, "metavar": "FILE"}),
               (("--kind",), {"default": "explanation", "help": "what the file is (default: explanation, whose "
                              "headings are checked against explanation.md: a warning, never a refusal)"})],
    "revise": [(("record_dir",), {"type": Path, "metavar": "RUN_DIR"}),
               (("--cache-criterion",), {"required": True, "metavar": "ATOL,RTOL",
                                         "help": "|a-b| <= ATOL + RTOL*|b| (b the uncached logits)"}),
               (("--justification",), {"required": True, "metavar": "TEXT", "help": "why, in your words"})],
    "pack": [(("record_dir",), {"type": directory, "metavar": "RUN_DIR"}),
             (("-o", "--output"), {"type": Path, "required": True, "metavar": "FILE.tar.gz"}),
             (("--learner",), {"metavar": "ID", "help": "who hands it in: your id in the course"}), REPLACE],
    "grade": [(("runs",), {"nargs": "+", "type": Path, "metavar": "RUN_OR_ARCHIVE"}),
              (("--against",), {"type": Path, "action": "append", "metavar": "COURSE_RUN", "help": "the course's own "
                                "run: items 2 to 6 are earned only where the run agrees with it (exact where both "
                                "computed under the same conditions, within the declared tolerance otherwise)"}),
              (("--rubric",), {"type": Path, "metavar": "FILE", "help": "points per item (TOML)"}),
              (("--format",), {"choices": ("text", "json", "junit", "gradescope"), "default": "text"}),
              (("--out",), {"type": Path, "metavar": "FILE", "help": "write the format's output to FILE"}),
              (("--csv",), {"type": Path, "metavar": "FILE", "help": "also write one CSV row per submission"}),
              REPLACE],
    "autograder": [(("platform",), {"choices": ("gradescope",)}),
                   (("-o", "--output"), {"type": Path, "required": True, "metavar": "autograder.zip"}),
                   (("--specimen",), {"metavar": "NAME", "help": "built offline: standin (default) or replica"}),
                   (("--artifacts",), {"type": Path, "metavar": "DIR", "help": "your verified copy of pythia-14m"}),
                   (("--rubric",), {"type": Path, "metavar": "FILE", "help": "your rubric (TOML), put into the zip"}),
                   REPLACE],
}


# name: (what it does, its exit statuses, what runs it)
COMMANDS = {
    "verify": ("check a run folder against its manifest and the protocol, one line per problem",
               {0: "no problem found", 1: "problems found, one line each", 2: "not a run or a plan folder"}, verify),
    "report": ("print report.md's text rendered again from the records (--check: compare; --after: the after-run page)",
               {0: "printed, or --check found the pages identical", 1: "--check found a difference, or --after an "
                "addendum changed", 2: "not a run or a plan folder", 3: "--check: another renderer wrote the pages"},
               report),
    "compare": ("what two runs agree on, trial by trial: ids, tensors, timing ratios, environments",
                {0: "compared: both runs pass verify", 1: "compared, but a run is unfinished or partial",
                 2: "not a run, a plan folder, or the same folder twice", 3: "compared, but a run fails verify"},
                compare),
    "check-artifacts": ("check a folder of specimen files (for --artifacts) against the specimen's pins",
                        {0: "a valid copy", 1: "not a valid copy (another specimen's valid copy is named)",
                         2: "an unknown specimen or a folder that does not exist"}, check_artifacts),
    "attach": ("keep a file you wrote after the run (your explanation) beside it, with its hash: never over the run",
               {0: "attached (or the same bytes already were)", 1: "refused, nothing written: the content or the run",
                2: "usage, nothing written: the file, the folder, or a session still running"}, attach),
    "revise": ("judge the run's saved cache logits again under a justified revised criterion, kept beside it",
               {0: "judged again and kept", 1: "refused, nothing written: a tensor, the prefixes, the ledger",
                2: "usage, nothing written: a bad or vacuous criterion, a thin justification, not a run"}, revise),
    "pack": ("bundle a run and what was attached to it into one .tar.gz to hand in",
             {0: "written, and the run verifies", 1: "written, but verify found problems (listed)",
              2: "nothing written: not a run, a plan, still being written, or an output that exists"}, pack),
    "grade": ("the lab's checklist item by item for runs or pack archives; with --against, on the course's own run",
              {0: "every required item passes", 1: "an item fails", 2: "a usage error, or a source that is not a run",
               3: "a run fails verify or contradicts the course's run"}, _command_of("inferlab.grade.formats")),
    "autograder": ("write a Gradescope autograder zip that makes the course's run and grades each submission on it",
                   {0: "the zip was written", 2: "a usage error, or an output that exists"},
                   _command_of("inferlab.grade.bundle")),
}


def exit_code_table() -> str:
    """Every command's exit codes as a Markdown table (docs/records.md holds it)."""
    rows = ["| command | exit | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {code} | {meaning} |" for name, (_, exits, _) in COMMANDS.items()
             for code, meaning in sorted(exits.items())]
    return "\n".join(rows + [f"| every command | {EXIT_READER_GONE} | the reader of the output went away "
                                  "(`... \\| head`): it stops quietly |"]) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (words, exits, run) in COMMANDS.items():
        sub = commands.add_parser(name, help=words, description=words,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog="exit status:\n" + "\n".join(f"  {c}  {m}" for c, m in sorted(exits.items())))
        sub._negative_number_matcher = NUMBERS  # `--cache-criterion -1,0` reaches the criterion's own message
        for names, settings in ARGUMENTS[name]:
            sub.add_argument(*names, **settings)
        sub.set_defaults(run=run)
    return parser


def main(argv=None) -> int:
    """Check the Python, parse the command line and run one subcommand; the exit code."""
    from inferlab.files import require_environment

    require_environment(PROG)
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (TypeError, AttributeError, KeyError, IndexError) as error:  # a record of a shape no writer makes
        return say(f"{PROG} {args.command}", f"stopped on a record it cannot read ({type(error).__name__}: {error}); "
                                             f"`{spelled('verify DIR')}` names the malformed records")


def run_command_line(argv=None) -> int:
    """main(), its output flushed; a reader that closed the pipe (`| head`) ends it quietly."""
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # nothing more can reach the reader; stdout to /dev/null so the exit's flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_GONE
