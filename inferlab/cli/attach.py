"""`attach RUN_DIR FILE [--kind KIND]`: keep a file written after the run (by default the learner's explanation)
beside the run's records, as an addendum (inferlab.read.addenda); nothing the session wrote changes."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, spelled

NAME = "attach"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "attached", 1: "refused, nothing written: the content (empty, binary, not UTF-8, over 1 MB) or the run "
                            "(a plan, no manifest, a damaged ledger)",
         2: "usage, nothing written: FILE missing, a folder or FIFO, inside RUN_DIR; not a run; its session still "
            "running; RUN_DIR cannot be written"}
HELP = ("keep a file you wrote after the run (by default your explanation, a filled-in copy of explanation.md) in "
        "RUN_DIR/addenda/, with its size, SHA-256 and time in RUN_DIR/addenda.jsonl; no file the session wrote changes")
EXIT_REFUSED = EXIT_PROBLEMS
EXIT_CODES = """exit status:
  0  attached: the copy and its ledger line are written (a structure warning does not change this)
  1  refused, nothing written: FILE is empty, binary, not UTF-8 or over 1 MB; RUN_DIR holds a plan,
     has no manifest.json, or its addenda ledger is damaged
  2  usage, nothing written: FILE is missing, a folder, a FIFO or another special file, or inside
     RUN_DIR (report.md, manifest.json, anything of the run's); RUN_DIR is not a run's record dir, or
     its session is still running (its claim.json names a live process); a bad --kind; RUN_DIR cannot
     be written

Attaching again keeps every version (explanation.md, explanation.2.md, ...). An unfinished run whose
session is over (killed or crashed) is allowed, and the ledger and this output say it was unfinished.
`verify RUN_DIR` checks every addendum."""
TOOL = "inferlab attach"
KIND = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def kind(value: str) -> str:
    """An argparse type: a lower-case word, and not the kind only `revise` writes."""
    from inferlab.read.addenda import REVISED_KIND

    if not KIND.match(value):
        raise argparse.ArgumentTypeError(f"expected a lower-case word (a-z, 0-9, _; at most 40 characters, for "
                                         f"example explanation or notes), actual {value!r}")
    if value == REVISED_KIND:
        raise argparse.ArgumentTypeError(f"expected another kind than {value!r}: a revised criterion is written by "
                                         f"`revise RUN_DIR --cache-criterion ATOL,RTOL --justification TEXT`, from "
                                         f"the run's own tensors")
    return value


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXIT_CODES
    parser.add_argument("record_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("file", type=Path, metavar="FILE")
    parser.add_argument("--kind", type=kind, default="explanation",
                        help="what the file is (default: explanation, whose headings are checked against "
                             "explanation.md: a warning, never a refusal)")


def run(args) -> int:
    return run_attach(args.record_dir, args.file, args.kind)


def waiting(command: str, directory: Path):
    """The on_wait of addenda.store: one line saying why the command waits."""
    return lambda: print(f"{command}: waiting for another attach or revise in {directory} to finish", file=sys.stderr,
                         flush=True)


def refused(command: str, error) -> int:
    """Say why nothing was written; the exit code (2 for a usage error, else 1)."""
    print(f"{command}: {error}; nothing was written", file=sys.stderr)
    return EXIT_UNREADABLE if getattr(error, "usage", False) else EXIT_REFUSED


def cannot_write(command: str, directory: Path, error: OSError) -> int:
    """An OSError met while writing (after undoing what was written): the exit code 2."""
    from inferlab.base.records import os_error_words

    print(f"{command}: {directory} could not be written ({os_error_words(error)}); nothing was kept",
          file=sys.stderr)
    return EXIT_UNREADABLE


def state_lines(command: str, state, entry: dict) -> list[str]:
    """What every successful attach or revise says: where it was kept, bound to what, and the run's state."""
    lines = [f"{command}: kept {state.directory / entry['file']} ({entry['size']} bytes, sha256 "
             f"{entry['sha256'][:16]}..., addenda.jsonl seq {entry['seq']}), bound to this run's manifest.json "
             f"(sha256 {entry['manifest_sha256'][:16]}...)"]
    if not state.finished:
        lines.append(f"{command}: the run is {state.state}; the ledger labels this addendum so")
    return lines


def after_hint(command: str, directory: Path) -> str:
    """Where the kept addendum is shown beside what the session recorded."""
    where = shlex.quote(str(directory))
    return (f"{command}: `{spelled(f'report {where} --after')}` shows it beside what the session recorded; "
            f"`{spelled(f'verify {where}')}` checks it")


def run_attach(record_dir: Path, file: Path, kind_name: str) -> int:
    """`attach RUN_DIR FILE`: check both, keep the copy and its ledger line, say what was kept; the exit code."""
    from inferlab.read import addenda

    try:
        state = addenda.check_run(record_dir)
        addenda.refuse_run_file(file, record_dir)
        data = addenda.read_text_file(file)
        same = same_bytes_attached(record_dir, data, kind_name)
        if same is not None:
            print(f"{NAME}: {file} is byte for byte the {kind_name} already attached as {same['file']} "
                  f"({addenda.LEDGER_FILE} seq {same['seq']}); nothing was written")
            return EXIT_OK
        structure = None
        if kind_name == addenda.EXPLANATION_KIND:
            structure = explanation_structure(data.decode("utf-8"))
        entry = addenda.store(state, data, str(file), kind_name, TOOL, structure,
                                    on_wait=waiting(NAME, record_dir))
    except addenda.Refused as error:
        return refused(NAME, error)
    except OSError as error:
        return cannot_write(NAME, record_dir, error)
    for line in state_lines(NAME, state, entry):
        print(line)
    if structure is not None:
        print(structure_line(structure), file=sys.stderr if structure.get("ok") is False else sys.stdout)
    print(after_hint(NAME, record_dir))
    return EXIT_OK


def same_bytes_attached(record_dir: Path, data: bytes, kind_name: str):
    """The ledger entry of an earlier version with exactly these bytes, or None."""
    import hashlib

    from inferlab.read.runview import RunView

    digest = hashlib.sha256(data).hexdigest()
    view = RunView.read(record_dir)
    if view.addenda_problems:  # a damaged ledger is refused by the store, with its own message
        return None
    return next((e for e in view.addenda
                 if isinstance(e, dict) and e.get("kind") == kind_name and e.get("sha256") == digest), None)


def explanation_structure(text: str) -> dict:
    """The explanation's form against the template (inferlab.writing): headings missing, sections not written."""
    from inferlab import writing
    from inferlab.base.checkout import PROJECT_ROOT

    template = writing.template(PROJECT_ROOT, writing.EXPLANATION_TEMPLATE)
    if template is None:
        return {"template": writing.EXPLANATION_TEMPLATE, "ok": None,
                "note": f"the template {writing.EXPLANATION_TEMPLATE} was not found; not checked"}
    found = writing.sections_written(text, template)
    return {"template": writing.EXPLANATION_TEMPLATE, "ok": not found["missing"] and not found["empty"],
            "headings_present": found["written"] + list(found["empty"]), "headings_missing": found["missing"],
            "empty_sections": list(found["empty"])}


def structure_line(structure: dict) -> str:
    """The structure check in one line: a warning when headings are missing or sections empty."""
    template = structure.get("template")
    if structure.get("ok") is None:
        return f"{NAME}: {structure.get('note')}"
    if structure.get("ok"):
        return (f"{NAME}: the explanation has every heading of {template}, each with text of its own (its form only: "
                f"whether the content is right is for a person to judge)")
    missing, empty = structure.get("headings_missing") or [], structure.get("empty_sections") or []
    parts = ([f"missing heading(s): {'; '.join(missing)}"] if missing else []) + (
        [f"section(s) without text of your own (the template's guidance or placeholders only): {'; '.join(empty)}"]
        if empty else [])
    return (f"{NAME}: warning: the explanation does not have {template}'s structure: {'. '.join(parts)}. It was kept "
            f"as it is and the check is recorded with it; attach it again once it is complete (every version is kept)")
