"""The one writer of a run's documents: pure functions that return plain dicts (the pytest-json-report habit).

make_record      the envelope every record has: kind, test, seq, wall_time (and, from a live session,
                 perf_counter_ns), then its fields as strict JSON data
make_claim       claim.json, the first file a run writes into its folder
make_test_outcome, make_plan_record, make_session_end   the harness's own record kinds
make_plan        plan.json
make_manifest    manifest.json, at the start (complete false) and at the end
make_rename      the manifest's record_dir_rename

The plugin (through inferlab.run.lifecycle) and the tests' record builder both call these, so a run the
tests build can only differ from a real one in its values. Nothing here reads a clock, a file or pytest.
"""

from __future__ import annotations

from typing import Iterable, Optional

from inferlab import protocol
from inferlab.measure import usage as collector
from inferlab.base.records import CLAIM_FILE, PLAN_FILE, RECORD_SCHEMA, REPORT_RENDERER_VERSION, STAMP_FIELD, jsonable
from inferlab.run import session_status
from inferlab.run.plan import core_deselected, plan_totals

RESERVED_FIELDS = frozenset({"kind", "test", "seq", "wall_time", STAMP_FIELD})
STARTED_STATUS = ("started: this is the manifest written when the run began; if it still says so, the session "
                  "never reached its end (killed, or crashed)")
HARNESS_KINDS = frozenset({"plan", "test_outcome", "session_end", "report_error"})  # written by the harness itself


def make_record(kind: str, test: Optional[str], seq: int, wall_time: str, fields: dict,
                perf_counter_ns: Optional[int] = None) -> dict:
    """A record: the envelope (kind, test, seq, wall_time, and perf_counter_ns when given) and its fields as
    strict JSON data.

    A field that is not JSON data is kept as its repr and named in `serialisation_warnings`; a field
    that would overwrite the envelope is refused (ValueError).
    """
    clashing = RESERVED_FIELDS & set(fields)
    if clashing:
        raise ValueError(f"record {kind!r}: fields {sorted(clashing)} are reserved for the record envelope")
    warnings_seen = []
    record = {"kind": kind, "test": test, "seq": seq, "wall_time": wall_time}
    if perf_counter_ns is not None:
        record[STAMP_FIELD] = perf_counter_ns
    record.update(jsonable(fields, warnings_seen.append))
    if warnings_seen:
        record["serialisation_warnings"] = warnings_seen
    return record


def undeclared_kind(nodeid: str, kind: str, declared: Iterable[str]) -> Optional[str]:
    """Why a test may not write a record of this kind (it does not declare it), or None when it may."""
    declared = list(declared)
    if kind in declared:
        return None
    if not declared:
        return (f"{nodeid}: record kind {kind!r} is not declared on the test, which declares no record kinds "
                f"(add @pytest.mark.records({kind!r}))")
    return (f"{nodeid}: record kind {kind!r} is not declared on the test; expected one of {declared} "
            f"(add it to @pytest.mark.records)")


def make_claim(*, pid: int, hostname: str, claimed_utc: str, command: str) -> dict:
    """claim.json: who claimed the record dir, when, and with which command."""
    return {"pid": pid, "hostname": hostname, "claimed_utc": claimed_utc, "command": command}


def make_test_outcome(*, outcome: str, phase: str, duration: float, longrepr: Optional[str],
                      skip_reason: Optional[str], check_kind: str) -> dict:
    """A test_outcome record's fields: passed, failed, error or skipped, with its full text and reason."""
    return {"outcome": outcome, "phase": phase, "duration": duration, "longrepr": longrepr,
            "skip_reason": skip_reason, "check_kind": check_kind}


def make_plan(*, mode: str, entries: list[dict], parts: list[dict], collected: list[str], deselected: list[str],
              selection: dict, named_paths: list[str], named_tests: bool,
              collector_policy: str = collector.DEFAULT_POLICY) -> dict:
    """plan.json: the schedule, its totals against the caps, and every way it falls short of the protocol.

    parts: the experiment files on disk (session_status.experiment_parts); collected and deselected: node
    ids before and removed by selection; selection: the options that can shrink it (session_status.selection_reasons).
    """
    totals = plan_totals(entries)
    planned = [planned["test"] for planned in entries]
    counted = session_status.part_counts(parts, collected or planned, planned)
    shortfalls, optional_notes = session_status.plan_shortfalls(totals, counted, named_tests)
    left_out = core_deselected(deselected, counted)
    partial_reasons = session_status.selection_reasons(selection, len(left_out), named_paths) + shortfalls
    return {
        "schema": RECORD_SCHEMA,
        "mode": mode,
        "protocol": protocol.as_dict(),
        "collector": collector.declaration(collector_policy),
        "schedule": entries,
        "totals": totals,
        "caps": dict(protocol.CAPS),
        "cap_violations": protocol.cap_violations(totals),
        "shortfalls": shortfalls,
        "parts": counted,
        "selection": {**selection, "named_paths": named_paths, "deselected": len(deselected)},
        "protocol_complete": not partial_reasons,
        "partial_reasons": partial_reasons,
        "optional_left_out": optional_notes,
    }


def make_plan_record(plan: dict) -> dict:
    """The plan record's fields: where plan.json is and what it says of itself."""
    return {"file": PLAN_FILE, "totals": plan["totals"], "cap_violations": plan["cap_violations"],
            "shortfalls": plan["shortfalls"], "tests": len(plan["schedule"]), "mode": plan["mode"],
            "protocol_complete": plan["protocol_complete"], "partial_reasons": plan["partial_reasons"]}


def make_session_end(*, exit_status: int, exit_code_name: str, signals: list[str], collect_only: bool,
                     plan_only: bool, stopped_reason: Optional[str], planned: list[str], with_outcome: set,
                     partial_reasons: list[str], optional_notes: list[str], outcome_counts: dict,
                     failures_by_check_kind: Optional[dict] = None,
                     environment_changed: Iterable[str] = (), forward_reconciliation: Optional[dict] = None,
                     acquisition_failure: Optional[dict] = None) -> dict:
    """The session_end record's fields: how the session ended, whether that is the complete protocol, which kind
    of check failed, and the one line that says so (session_status.session_end_fields and status_line)."""
    end = session_status.session_end_fields(
        exit_status=exit_status, exit_code_name=exit_code_name, signals=signals, collect_only=collect_only,
        plan_only=plan_only, stopped_reason=stopped_reason, planned=planned, with_outcome=with_outcome,
        partial_reasons=partial_reasons, optional_notes=optional_notes, failures_by_check_kind=failures_by_check_kind,
        acquisition_failure=acquisition_failure, outcome_counts=dict(outcome_counts))
    end["environment_changed_during_run"] = list(environment_changed)  # what the report and verify say too
    if forward_reconciliation is not None:  # every forward of the session against the plan (session_status)
        end["forward_reconciliation"] = forward_reconciliation
    end["status"] = session_status.status_line(end, dict(outcome_counts))
    return end


def make_rename(*, old_name: str, new_name: Optional[str], suffix: str, error: Optional[str]) -> dict:
    """The manifest's record_dir_rename: the name a run made under --runs-dir got for how it ended, or why not."""
    return {"from": old_name, "to": new_name, "suffix": suffix, "renamed": new_name is not None, "error": error}


def make_manifest(*, invocation, started_utc: str, ended_utc: Optional[str], end: Optional[dict],
                  signals_during_finish: list[str], outcome_counts: dict, record_dir: str, rename: Optional[dict],
                  predictions: Optional[dict], network_blocked: bool, torch_threads: dict, torch_build: dict,
                  environment: dict, environment_changed: list[str], checks: dict) -> dict:
    """manifest.json without its file inventory: at the start (end None: complete false, status 'started') and
    at the end, with how the session ended. invocation: the session's lifecycle.Invocation; environment: the
    record taken at the start (environment.environment_record), whose fields are the manifest's own."""
    return {
        "schema": RECORD_SCHEMA,
        "report_renderer_version": REPORT_RENDERER_VERSION,
        "mode": invocation.mode,
        "complete": bool(end and end["complete"]),
        "status": end["status"] if end else STARTED_STATUS,
        "exit_status": end["exit_status"] if end else None,
        "exit_code_name": end["exit_code_name"] if end else None,
        "session_end": end,
        "signals_during_finish": list(signals_during_finish),
        "outcome_counts": dict(outcome_counts),
        "command": invocation.command,
        "command_reconstructed_from": invocation.command_how,
        "argv": list(invocation.argv),
        "invocation_dir": invocation.invocation_dir,
        "started_utc": started_utc,
        "ended_utc": ended_utc,
        "record_dir": record_dir,
        "record_dir_rename": rename,
        "claim": CLAIM_FILE,
        "specimen": invocation.specimen,
        "options": {
            "artifacts": invocation.options.get("artifacts"),
            "offline": invocation.options.get("offline"),
            "offline_from": invocation.options.get("offline_from"),  # --offline, or HF_HUB_OFFLINE=1
            "network_blocked_for_session": network_blocked,
            "plan": invocation.options.get("plan"),
            "collector_policy": invocation.options.get("collector_policy", collector.DEFAULT_POLICY),
        },
        "collector": collector.declaration(invocation.options.get("collector_policy", collector.DEFAULT_POLICY)),
        "predictions": predictions,
        "pytest": dict(invocation.pytest),
        "torch_threads": torch_threads,
        "torch_build": torch_build,
        **environment,
        "environment_changed_during_run": environment_changed,
        "checks": checks,
        "protocol": protocol.as_dict(),
    }
