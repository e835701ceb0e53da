"""The command line: one module per subcommand, each with NAME, HELP, add_arguments(parser) and run(args).

Readers of a finished run (verify, report, compare, grade, ...) never load a model and never open the network.
Exit codes: 0 success; 1 problems found (verify, check-artifacts) or report --check found a difference;
2 a usage error, a directory that could not be read, or one that is not a run's record dir; 3 report --check
met pages that another report renderer version wrote, so it did not compare their text (verify still checks
them against the manifest's hashes); 141 (128 + SIGPIPE) the reader of the output went away (`... | head`):
the command stops quietly. A subcommand may document further codes in its own help.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from pathlib import Path

from inferlab.base.commands import PROG, VENV_BIN, spelled  # noqa: F401 - spelled keeps its old path too

EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, EXIT_OTHER_RENDERER = 0, 1, 2, 3
EXIT_READER_GONE = 141  # what a shell reports for a command ended by SIGPIPE
DESCRIPTION = ("Check, grade, report and compare inferlab runs and keep what you write after one, from their files alone "
               "(no model, no network).")
EXIT_CODES = """exit status:
  0    success
  1    problems found (verify, check-artifacts), an item failed (grade), attach or revise refused the
       content (nothing written), or report --check found a difference
  2    a usage error, a folder that cannot be read, one that is not a run's record dir, or a Python
       without the project's packages (the message names the Python to use)
  3    an integrity problem (grade: the run fails verify or contradicts the course's run; compare:
       a run fails verify);
       report --check: the pages were written by another report renderer version (not compared)
  141  the reader of the output went away (... | head)"""
# The subcommands in the order --help lists them: modules of this package.
COMMANDS = ("verify", "report", "compare", "check_artifacts", "attach", "revise", "pack", "grade", "autograder")
# The one flag of every command that writes a file a user names: without it an existing file is refused.
REPLACE_HELP = "replace the output file if it exists (without this flag an existing file is refused and left as it is)"


# A value that reads as numbers, alone or comma-separated ("-1,0", "-1e-4,1e-3"). argparse takes a word that starts
# with '-' for an option unless it looks like a negative number, and its "negative number" is one integer or
# decimal: `--cache-criterion -1,0` then met "expected one argument" instead of the criterion's own message.
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
NUMBERS = re.compile(rf"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?:,{_NUMBER})*$")


def accept_dash_numbers(parser: argparse.ArgumentParser) -> None:
    """Let an option's value start with '-' when it reads as numbers (NUMBERS), so that the space form
    `--cache-criterion -1,0` reaches the option's own check as `--cache-criterion=-1,0` does. A word that does
    not read as numbers (`-x`) is still an option. argparse has no public setting for this: its matcher of negative
    numbers is replaced on this parser only (the parser then has no option that looks like a number, as before)."""
    parser._negative_number_matcher = NUMBERS


def directory(value: str) -> Path:
    """An argparse type: an existing directory, else a usage error naming the value."""
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is not a directory")
    return path


def refuse_non_run(command: str, *record_dirs: Path) -> bool:
    """Say so, and return True, when a folder is not a run's record dir or is a plan folder (--plan: no test ran):
    every command refuses both the same way, exit 2, and reads or writes nothing there."""
    from inferlab.read.runview import RunView, not_a_run_reason

    refused = False
    for record_dir in record_dirs:
        reason = not_a_run_reason(record_dir)
        if reason is None and RunView.read(record_dir).is_plan_folder:
            reason = (f"{record_dir} is a plan folder (written by --plan): no test ran, so there is no run to "
                      f"{command}; run the experiment without --plan")
        if reason:
            print(f"{command}: {reason}; nothing was read or written there", file=sys.stderr)
            refused = True
    return refused


def command_modules() -> list:
    """The subcommand modules, in COMMANDS order."""
    return [importlib.import_module(f"inferlab.cli.{name}") for name in COMMANDS]


def exit_code_table() -> str:
    """Every command's exit codes as one Markdown table, from each module's EXITS (docs/records.md holds it, and
    a test checks that it is this text); 141 is every command's."""
    rows = ["| command | exit | meaning |", "|---|---|---|"]
    for module in command_modules():
        rows += [f"| `{module.NAME}` | {code} | {meaning} |" for code, meaning in sorted(module.EXITS.items())]
    rows.append(f"| every command | {EXIT_READER_GONE} | the reader of the output went away (`... \\| head`): it stops "
                f"quietly |")
    return "\n".join(rows) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser with every subcommand of COMMANDS."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    accept_dash_numbers(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    for module in command_modules():
        sub = commands.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        accept_dash_numbers(sub)
        module.add_arguments(sub)
        if not sub.epilog:  # a command without its own exit-status text shows its EXITS
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
            sub.epilog = "exit status:\n" + "\n".join(f"  {code}  {meaning}"
                                                       for code, meaning in sorted(module.EXITS.items()))
        sub.set_defaults(run=module.run)
    return parser


def main(argv=None) -> int:
    """Parse the command line and run one subcommand; returns the exit code."""
    from inferlab.base.checkout import require_environment

    require_environment(PROG)
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (TypeError, AttributeError, KeyError, IndexError) as error:
        # A record of a shape no inferlab writer makes (a list where an id belongs, say) reaches code that reads
        # the shape the writers make. Say so in one line rather than a traceback; verify names the records.
        print(f"{PROG} {args.command}: stopped on a record it cannot read ({type(error).__name__}: {error}); "
              f"`{spelled('verify DIR')}` names the malformed records. If verify finds none, this is a bug in "
              f"inferlab: report it with this line.", file=sys.stderr)
        return EXIT_UNREADABLE


def run_command_line(argv=None) -> int:
    """main(), with its output flushed; a reader that closed the pipe (`| head`) ends it quietly."""
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Nothing more can reach the reader; point stdout at /dev/null so that the interpreter's own
        # flush at exit does not raise (and print) the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_READER_GONE
