"""`replay RUN_DIR (--artifacts DIR | --specimen NAME)`: every deterministic computation of a run, done again on
the grader's own verified copy of the specimen with plain transformers calls, and compared with the records."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from inferlab.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, directory, refuse_non_run, spelled

NAME = "replay"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "the run agrees with every compared output",
         1: "the run contradicts the replay, fails verify, or is unfinished or partial (said first)",
         2: "cannot replay: another specimen, a copy that fails its pins, a plan folder, not a run"}
SHOWN_PROBLEMS = 8
HELP = ("re-execute a run's deterministic computations (prompt ids, the 26 generations with their seeds, first-step "
        "logits, matched prefixes, timing ids, batching) on your own verified copy of the specimen and compare "
        "them with the records; loads the model (the one command that does), writes nothing into the run; first "
        "checks the run (verify) and that the copy is the run's specimen, before anything is loaded; exit 0 when "
        "the run agrees with every compared output, 1 when it contradicts one or the run fails verify (an "
        "unfinished or partial run is replayed as far as it went, said at the top, and exits 1), 2 when it cannot "
        "replay (another specimen, a plan folder)")


def add_arguments(parser) -> None:
    parser.add_argument("record_dir", type=run_or_archive, metavar="RUN_DIR",
                        help="a run's record folder, or an archive `pack` made of one (read as grade reads it)")
    copy = parser.add_mutually_exclusive_group(required=True)
    copy.add_argument("--artifacts", metavar="DIR",
                      help="your own copy of the run's specimen, verified against its pins before anything is loaded")
    copy.add_argument("--specimen", metavar="NAME",
                      help="a specimen of this checkout's artifacts/ (the stand-in is built or reused in the project "
                           "cache)")


def verify_lines(record_dir) -> tuple[list[str], list[str]]:
    """(verify's integrity problems of the run, its lines for an unfinished or partial run): what such a run
    recorded is replayed, as grade grades it, under a note at the top, and the exit is 1."""
    from inferlab.grading.grade import split_verify
    from inferlab.verify import verify_run

    return split_verify(verify_run(record_dir))


def integrity_problems(record_dir) -> list[str]:
    """verify's integrity problems of the run (its one line for an unfinished or partial run is not one)."""
    return verify_lines(record_dir)[0]


def plan_refusal(record_dir) -> bool:
    """Say so, and return True, when the folder holds a plan (--plan): no test ran, so nothing is replayed."""
    from inferlab.reading.runview import RunView

    if not RunView.read(record_dir).is_plan_folder:
        return False
    print(f"replay: {record_dir} is a plan folder (written by --plan): no test ran, so there is nothing to replay "
          f"and nothing was loaded; run the experiment without --plan and replay that run folder", file=sys.stderr)
    return True


def run_or_archive(value: str) -> Path:
    """An argparse type: an existing directory, or a file `pack` made (an archive); else a usage error."""
    from inferlab.submission.archive import is_archive

    path = Path(value)
    if path.is_file() and is_archive(path):
        return path
    return directory(value)


def run(args) -> int:
    """Replay a run folder, or the run inside a `pack` archive (unpacked into a temporary folder, removed after)."""
    import tarfile

    from inferlab.submission.archive import UnsafeArchive, is_archive, unpack

    if not is_archive(args.record_dir):
        return replay_folder(args, args.record_dir)
    try:
        unpacked = unpack(args.record_dir)
    except UnsafeArchive as error:
        print(f"replay: {args.record_dir}: refused: {error}; nothing was extracted outside a temporary folder",
              file=sys.stderr)
        return EXIT_UNREADABLE
    except (OSError, tarfile.TarError, EOFError) as error:
        print(f"replay: {args.record_dir}: not a readable archive ({str(error).splitlines()[0]})", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        print(f"replay: {args.record_dir}: the `pack` archive of run {unpacked.run_dir.name}, unpacked into "
              f"{unpacked.temp_dir} (removed afterwards)")
        return replay_folder(args, unpacked.run_dir)
    finally:
        unpacked.remove()


def replayed(args) -> Optional[dict]:
    """The run replayed (replay_run's result), said with where it was made: in a child under the run's recorded
    kernel settings where any differs from this process's (inferlab.recheck.elsewhere, offline, as grade --replay
    makes it: torch reads them only at its start), else here. None, said on stderr, when it cannot be made."""
    from inferlab.reading.runview import RunView
    from inferlab.recheck.elsewhere import replay_in_child, settings_to_match
    from inferlab.recheck.replay import ReplayError, replay_run

    view = RunView.read(args.record_dir)
    settings, name = settings_to_match(view.manifest), args.specimen or view.specimen_spec().get("name")
    if settings is not None and isinstance(name, str) and name:
        result = replay_in_child(args.record_dir, name, args.artifacts, settings)
        if not result["made"]:
            print(f"replay: {result['reason']}", file=sys.stderr)
            return None
        where = "in a process of its own under the run's kernel settings: " + ", ".join(
            f"{k}={v if v is not None else '(unset)'}" for k, v in sorted(settings.items()))
    else:
        try:
            result = replay_run(args.record_dir, specimen=args.specimen, artifacts=args.artifacts)
        except ReplayError as error:
            print(f"replay: {error}", file=sys.stderr)
            return None
        where = f"{result['acquisition']}: {result['directory']}"
    print(f"replay of {args.record_dir} on {result['specimen']} ({where})")
    return result


def replay_folder(args, record_dir: Path) -> int:
    """`replay` of one run folder; the exit code."""
    args.record_dir = record_dir
    if refuse_non_run("replay", args.record_dir) or plan_refusal(args.record_dir):
        return EXIT_UNREADABLE
    problems, partial = verify_lines(args.record_dir)
    if problems:  # checked before any specimen is acquired or model loaded
        for line in problems[:SHOWN_PROBLEMS]:
            print(f"replay: {line}", file=sys.stderr)
        more = f" ({len(problems) - SHOWN_PROBLEMS} more)" if len(problems) > SHOWN_PROBLEMS else ""
        print(f"replay: not replayed: {args.record_dir} fails verify, {len(problems)} integrity problem(s){more}, so "
              f"its records are not a record of one session to compare with; nothing was loaded "
              f"(`{spelled('verify RUN_DIR')}` names each)", file=sys.stderr)
        return EXIT_PROBLEMS
    for line in partial:  # said first: the comparison below covers only what the run recorded
        print(f"replay: {line}")
        print(f"replay: {args.record_dir} fails verify as unfinished or partial: only what it recorded is replayed, "
              f"and the exit is 1 whatever agrees (`{spelled('verify RUN_DIR')}` says what is missing)")
    result = replayed(args)
    if result is None:
        return EXIT_UNREADABLE
    comparison = result["comparison"]
    for line in format_comparison(comparison, result["rule"]):
        print(line)
    contradictions = len(comparison.contradictions)
    verdict = ("the run agrees with the replay in every compared output" if result["agree"] else
               f"{contradictions} contradiction(s) of the run with the replay" if contradictions else
               "nothing of the run could be compared")
    print(f"replay: {verdict} ({result['elapsed_s']:.1f} s)")
    if partial:
        print(f"replay: {args.record_dir} is unfinished or partial: exit 1 (see the first line)")
        return EXIT_PROBLEMS
    return EXIT_OK if result["agree"] else EXIT_PROBLEMS


SHOWN_CONTRADICTIONS = 20  # the count says how many more
# What each count of inferlab.recheck.trusted's comparison stands for, in the order the replay computes them.
COUNTED = (("pins", "specimen pins"), ("prompts", "prompts' ids"), ("generation", "generation trials' ids"),
           ("first_step", "first-step logits' top values"), ("cache_prefixes", "matched prefixes"),
           ("timing", "timing trials' ids"), ("batching", "batching calls' ids"), ("tensors", "saved tensors"))


def format_comparison(comparison, rule) -> list[str]:
    """The run's comparison with its replay (inferlab.recheck.trusted.Comparison) as the command prints it: what
    was compared of each computation and by which rule, then the contradictions (the first few) and the notes."""
    counts = comparison.compared
    compared = ", ".join(f"{counts[key]} {words}" for key, words in COUNTED if key in counts)
    lines = [f"compared with the replay ({rule.describe('the replayed value') if rule else 'exactly'}): {compared}"]
    inexact = rule.not_checked("the run", "the replay") if rule else None
    lines += [f"  not checked: {inexact}"] if inexact else []
    lines += [f"  contradiction: {line}" for line in comparison.contradictions[:SHOWN_CONTRADICTIONS]]
    if len(comparison.contradictions) > SHOWN_CONTRADICTIONS:
        lines.append(f"  ... and {len(comparison.contradictions) - SHOWN_CONTRADICTIONS} more")
    return lines + [f"  note: {note}" for note in comparison.notes]
