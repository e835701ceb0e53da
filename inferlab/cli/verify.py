"""`verify DIR`: re-hash every file against the manifest and check the records are complete for the protocol."""

from __future__ import annotations

from inferlab.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, directory, refuse_non_run

NAME = "verify"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "no problem found", 1: "problems found, one line each",
         2: "not a run's record dir, a plan folder, or a Python without the project's packages"}
HELP = ("re-hash every file against the manifest, check the records are complete for the protocol and the report "
        "pages say what the records say (as grade does); one line per problem")


def add_arguments(parser) -> None:
    parser.add_argument("record_dir", type=directory, metavar="DIR")
    parser.add_argument("--all-passed", action="store_true",
                        help="also count every failed, errored or skipped test as a problem (default: a gap with "
                             "recorded evidence is not a problem)")


def run(args) -> int:
    return run_verify(args.record_dir, args.all_passed)


def run_verify(record_dir, all_passed: bool) -> int:
    """`verify DIR`: one line per problem, one per check the files did not allow, then the verdict line; the exit
    code."""
    from inferlab.read.verify import verify_run

    if refuse_non_run("verify", record_dir):
        return EXIT_UNREADABLE
    result = verify_run(record_dir)
    problems = list(result["problems"])
    if all_passed and not result["all_tests_passed"]:
        problems.append(f"not every test passed: {counts_text(result['outcome_counts'])}")
    for line in problems:
        print(line)
    print_not_checked(result)  # before the verdict, so that the verdict is always the last line
    if problems:
        unlisted = ""
        incomplete = "" if result["complete"] or result["plan_folder"] else "; NOT the complete protocol"
        print(f"verify: {len(problems)} problem(s) in {record_dir}{unlisted}{incomplete}{findings_clause(result)}")
        return EXIT_PROBLEMS
    count = result["addenda"]
    attached = f"; {count} {'addendum' if count == 1 else 'addenda'} added after the session, intact" if count else ""
    if result["plan_folder"]:
        print(f"verify: OK, a PLAN folder ({result['planned_tests']} tests planned, {result['files_checked']} files): "
              f"no test ran and nothing was measured{attached}")
        return EXIT_OK
    gaps = len(result["explained_gaps"])
    tail = "" if result["all_tests_passed"] else (
        f"; not every test passed ({counts_text(result['outcome_counts'])}), and each of the {gaps} gap(s) this "
        f"leaves (a record or outcome the protocol expects that is not there) has its recorded evidence")
    print(f"verify: OK ({result['records']} records, {result['files_checked']} files){tail}{attached}"
          f"{findings_clause(result)}")
    return EXIT_OK


def counts_text(counts: dict) -> str:
    """Test outcomes as words, "1 failed, 3 passed, 111 skipped", never a Python dict."""
    return ", ".join(f"{number} {outcome}" for outcome, number in sorted(counts.items())) or "no test outcome"


def print_not_checked(result: dict) -> None:
    """The consistency checks the run's files did not allow, one line each: never passed in silence."""
    for line in result.get("not_checked", []):
        print(f"not checked: {line}")


def findings_clause(result: dict) -> str:
    """What the failed tests were, from their recorded check kinds: the harness failed, or the protocol ran and
    found something (failed protocol diagnostics only); empty when no test failed."""
    failing = result.get("failures_by_check_kind") or {}
    acquisition = result.get("acquisition_failure") or {}
    if acquisition and not failing.get("diagnostic") and failing.get("integrity") == acquisition.get("failed_tests"):
        return (f"; nothing was measured: the specimen could not be acquired ({acquisition.get('cause')}), which is "
                f"no harness fault (its reason and next steps: the report)")
    if failing.get("integrity"):
        return (f"; the harness failed: {failing['integrity']} harness-integrity check(s) failed or errored"
                + (f" (and {failing['diagnostic']} protocol diagnostic(s))" if failing.get("diagnostic") else ""))
    if failing.get("diagnostic"):
        return (f"; the protocol ran and found {failing['diagnostic']} finding(s) (failed protocol diagnostics, "
                f"kept with their evidence); no harness-integrity check failed")
    return ""
