"""Two finished runs side by side, from their files alone (no model): `inferlab compare DIR1 DIR2`. It reports and
does not judge (ids, saved tensors, timing medians, artifact hashes, environments), and checks each run by verify
first, so that an edited or damaged run is never reported as agreeing.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Union

from inferlab import protocol
from inferlab.files import spelled
from inferlab.measure import usage
from inferlab.measure.stats import TIMING_METRICS, first_divergence, is_number, measured, trial_contended
from inferlab.read.runview import RunView, TensorFileError

SHOWN_CHARS = 100  # a value longer than this is cut in the text (compare()'s result keeps it whole)
INTEGRITY_SHOWN = 5  # problem lines shown per run in the header (verify DIR lists them all)


def id_agreement(a: dict, b: dict, order: list) -> list[dict]:
    """Per trial (key, label) of order: whether both runs' generated ids are equal, or where they part."""
    result = []
    for key, label in order:
        ids = [(run.get(key) or {}).get("generated_ids") for run in (a, b)]
        if None in ids:
            missing = " and ".join(name for name, found in zip(("DIR1", "DIR2"), ids) if found is None)
            result.append({"trial": label, "equal": None, "first_difference": None, "status": f"missing in {missing}"})
            continue
        difference = first_divergence(*ids)
        result.append({"trial": label, "equal": difference is None, "first_difference": difference,
                       "status": "equal" if difference is None else f"differ from index {difference}"})
    return result


def tensor_agreement(view_a: RunView, view_b: RunView) -> list[dict]:
    """Per saved tensor of either run: the max abs difference (NaN entries left out, and counted), bitwise equality."""
    import numpy

    rows = []
    for relative in sorted(set(view_a.tensors.files()) | set(view_b.tensors.files())):
        loaded, unreadable = [], []
        for name, view in (("DIR1", view_a), ("DIR2", view_b)):
            try:
                loaded.append(view.tensors.load(relative))
            except TensorFileError as error:  # reported as a row, not raised: compare reports
                loaded.append({})
                unreadable += [f"{name}: {error.reason}"] if error.code != "missing" else []
        if unreadable:
            rows.append({"file": relative, "key": "*", "max_abs_diff": None, "bitwise_equal": None,
                         "status": "unreadable in " + "; ".join(unreadable)})
        a, b = loaded
        for key in sorted(set(a) | set(b)):
            row = {"file": relative, "key": key, "max_abs_diff": None, "bitwise_equal": None}
            if key not in a or key not in b:
                row["status"] = "missing in " + ("DIR1" if key not in a else "DIR2")
            elif a[key].shape != b[key].shape:
                row["status"] = f"shapes differ {list(a[key].shape)} vs {list(b[key].shape)}"
            else:
                x, y = a[key].astype(numpy.float64), b[key].astype(numpy.float64)
                with numpy.errstate(invalid="ignore"):  # equal values (the same infinity too) differ by 0
                    diff = numpy.where(x == y, 0.0, numpy.abs(x - y))
                nan = int(numpy.isnan(diff).sum())
                row.update(max_abs_diff=0.0 if not diff.size else float("nan") if nan == diff.size else
                           float(numpy.nanmax(diff)), nan_entries=nan,
                           bitwise_equal=a[key].tobytes() == b[key].tobytes())
                row["status"] = ("bitwise equal" if row["bitwise_equal"] else "differ") + (
                    f" ({nan} NaN entries left out of the max)" if nan else "")
            rows.append(row)
    return rows


def timing_medians(records: list[dict], uncontended_only: bool = False) -> dict:
    """Per (prompt, use_cache): each metric's median over the measured trials (with uncontended_only, over those
    the declared contention rule did not mark; a trial without evidence is left out then)."""
    medians = {}
    for key, trials in measured([r for r in records if r.get("kind") == "timing_trial"]).items():
        kept = [t for t in trials if not uncontended_only or trial_contended(t) is False]
        values = {metric: [t[metric] for t in kept if is_number(t.get(metric))] for metric in TIMING_METRICS}
        medians[key] = {metric: statistics.median(v) for metric, v in values.items() if v}
    return medians


def field_differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field path, value in a, value in b) for every leaf where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for name in sorted(set(a) | set(b), key=str)
                for d in field_differences(a.get(name), b.get(name), f"{path}.{name}" if path else str(name))]
    return [] if a == b else [(path, a, b)]


ENVIRONMENT = ("platform", "distributions", "thread_environment", "git", "torch_build", "specimen",
               "requirements_lock_sha256", "deviations_from_reference")


def environment_differences(a: dict, b: dict) -> list[dict]:
    """Every field, by its dotted path, that differs between the manifests' ENVIRONMENT entries."""
    return [{"field": name, "dir1": x, "dir2": y} for name, x, y in
            field_differences({k: a.get(k) for k in ENVIRONMENT}, {k: b.get(k) for k in ENVIRONMENT})]


def run_state(view: RunView) -> str:
    """One phrase for how a run ended, so that a comparison with an unfinished, partial or unmeasured run says so."""
    from inferlab.report import acquisition_failure

    end = view.session_end
    if end is None:
        return ("UNFINISHED: no session_end record (the session was killed or crashed); only what it recorded is "
                "compared")
    if end.get("interrupted") or end.get("stopped_early"):
        return f"did NOT finish ({end.get('stop_reason') or 'no reason recorded'}); only what it recorded is compared"
    if acquisition_failure(view) is not None:
        return "the specimen was NOT acquired, so nothing was measured"
    if end.get("partial_reasons") or end.get("protocol_complete") is False:
        return "PARTIAL, not the complete protocol: " + "; ".join(map(str, end.get("partial_reasons") or []))
    return "finished, the complete protocol"


def artifacts(records_a: list[dict], records_b: list[dict]) -> list[dict]:
    """Every artifact file of either run, with its hash and size in each and whether they are the same."""
    a, b = ({r.get("name"): {"sha256": r.get("sha256"), "size": r.get("size")} for r in records
             if r.get("kind") == "artifact_file"} for records in (records_a, records_b))
    rows = []
    for name in dict.fromkeys([*protocol.ALLOWLISTED_FILES, *sorted(n for n in {*a, *b} if n is not None)]):
        x, y = a.get(name), b.get(name)
        status = ("no artifact_file record in either dir" if x is None and y is None else
                  "missing in " + ("DIR1" if x is None else "DIR2") if x is None or y is None else
                  "equal" if x == y else "differ")
        rows.append({"file": name, "dir1": x, "dir2": y, "equal": status == "equal", "status": status})
    return rows


def compare(dir_a: Union[Path, RunView], dir_b: Union[Path, RunView]) -> dict:
    """Two record folders compared: the rows format_compare prints (it reports, and judges nothing)."""
    from inferlab.read.verify import verify_run

    a, b = (d if isinstance(d, RunView) else RunView.read(Path(d)) for d in (dir_a, dir_b))
    generation_order = [((t.prompt_id, t.condition, t.seed, t.repetition), t.test_id)
                        for t in protocol.generation_trials()]
    medians = [timing_medians(v.records, clean) for clean in (False, True) for v in (a, b)]
    ratios = []
    for key in dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()):
        for metric in TIMING_METRICS:
            x, y, cx, cy = (m.get(key, {}).get(metric) for m in medians)
            ratios.append({"prompt_id": key[0], "use_cache": key[1], "metric": metric, "median_dir1": x,
                           "median_dir2": y, "ratio_dir2_over_dir1": y / x if x and y is not None else None,
                           "uncontended_ratio_dir2_over_dir1": cy / cx if cx and cy is not None else None})
    acquisitions = [next((r.get("acquisition") for r in reversed(v.records) if r.get("kind") == "artifact_acquisition"),
                         None) for v in (a, b)]
    specimens = {name: {key: (v.manifest.get("specimen") or {}).get(key) for key in ("name", "repo_id", "revision",
                                                                              "synthetic")}
                 for name, v in (("dir1", a), ("dir2", b))}
    return {
        "dir1": str(a.directory), "dir2": str(b.directory),
        # how a run ended is the header's business, not an integrity problem
        "integrity": {name: [p for p in verify_run(v)["problems"] if not p.startswith(("unfinished: ", "partial: "))]
                      for name, v in (("dir1", a), ("dir2", b))},
        "specimens": {**specimens, "equal": specimens["dir1"] == specimens["dir2"]},
        "runs": {"dir1": run_state(a), "dir2": run_state(b)},
        "generation": id_agreement(*({(r.get("prompt_id"), r.get("condition"), r.get("seed"), r.get("repetition")): r
                                      for r in v.kind("generation")} for v in (a, b)), generation_order),
        "timing_ids": id_agreement(*({r.get("schedule_index"): r for r in v.kind("timing_trial")} for v in (a, b)),
                                   [(t.schedule_index, t.test_id) for t in protocol.timing_schedule()]),
        "tensors": tensor_agreement(a, b),
        "timing_ratios": ratios,
        "timing_contention": {"dir1": usage.contention_counts(a.kind("timing_trial")),
                              "dir2": usage.contention_counts(b.kind("timing_trial"))},
        "artifacts": artifacts(a.records, b.records),
        "acquisition": {"dir1": acquisitions[0], "dir2": acquisitions[1], "equal": acquisitions[0] == acquisitions[1]},
        "environment": environment_differences(a.manifest, b.manifest),
    }


def shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else repr(value)
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}… ({len(text)} chars)"


def format_compare(result: dict) -> str:
    """compare()'s result as plain text, after what the reader must know before any row: a run whose files fail
    verify, and runs of two specimens."""
    runs, specimens = result["runs"], result["specimens"]
    lines = [f"compare: DIR1 = {result['dir1']}  ({runs['dir1']})",
             f"         DIR2 = {result['dir2']}  ({runs['dir2']})"]
    for name, problems in result["integrity"].items():
        if problems:
            lines.append(f"INTEGRITY: {name.upper()} fails verify ({len(problems)} problem(s)): its files are not what "
                         "its session wrote, so the rows below compare altered material; "
                         f"`{spelled('verify ' + result[name])}` lists every problem:")
            lines += [f"  {line}" for line in problems[:INTEGRITY_SHOWN]]
            lines += [f"  ... and {len(problems) - INTEGRITY_SHOWN} more"] if len(problems) > INTEGRITY_SHOWN else []
    if not specimens["equal"]:
        words = [f"{s.get('name')} ({s.get('repo_id')} at revision {s.get('revision')}"
                 f"{', SYNTHETIC' if s.get('synthetic') else ''})" for s in (specimens["dir1"], specimens["dir2"])]
        lines.append(f"DIFFERENT SPECIMENS: DIR1 is of {words[0]}, DIR2 of {words[1]}: every difference below may be "
                     "the specimens', not the machines' or the code's")
    lines.append("")
    for title, rows in (("generation trials (exact generated ids)", result["generation"]),
                        ("timing trials (exact generated ids)", result["timing_ids"])):
        width = max((len(r["trial"]) for r in rows), default=5)
        lines += [f"{title}: {sum(1 for r in rows if r['equal'])} of {len(rows)} equal"]
        lines += [f"  {r['trial']:<{width}}  {r['status']}" for r in rows] + [""]
    lines.append("tensors (max abs diff per key)")
    lines += [f"  {r['file']}[{r['key']}]  max_abs_diff={shown(r['max_abs_diff'])}  {r['status']}"
              for r in result["tensors"]] or ["  no tensor files in either dir"]
    lines += ["", "timing: per-condition medians of the measured trials, ratio DIR2/DIR1 (two runs of the same code "
              "differ by chance, more so on a shared machine: a ratio away from 1 is no finding by itself)"]
    for name, found in result["timing_contention"].items():
        lines.append(f"  {name}: {found['contended']} of {found['trials']} timing trials contended, "
                     f"{found['without_evidence']} without CPU evidence"
                     + (f"; contended: {', '.join(found['contended_ids'])}" if found["contended_ids"] else ""))
    lines += [f"  {r['prompt_id']:<5} {'cache_on ' if r['use_cache'] else 'cache_off'} {r['metric']:<27} "
              f"dir1={shown(r['median_dir1'])} s  dir2={shown(r['median_dir2'])} s  "
              f"ratio={shown(r['ratio_dir2_over_dir1'])}  uncontended ratio="
              f"{shown(r.get('uncontended_ratio_dir2_over_dir1'))}" for r in result["timing_ratios"]]
    rows = result["artifacts"]
    lines += ["", f"artifacts (sha256 and size of every file each run verified): {sum(r['equal'] for r in rows)} of "
              f"{len(rows)} equal"]
    for row in rows:
        if row["equal"]:
            lines.append(f"  {row['file']}  equal  sha256={row['dir1']['sha256']}")
            continue
        lines.append(f"  {row['file']}  {row['status']}")
        if row["status"] == "differ":
            lines += [f"    dir1: {shown(row['dir1'])}", f"    dir2: {shown(row['dir2'])}"]
    acquisition = result["acquisition"]
    lines.append(f"acquisition (how each run got its files; not an artifact): dir1={shown(acquisition.get('dir1'))}  "
                 f"dir2={shown(acquisition.get('dir2'))}" + ("" if acquisition.get("equal") else "  differ"))
    lines += ["", "environment differences (another torch build or CPU kernel set changes logits by rounding; ids "
              "may then part at a near tie)"]
    lines += [f"  {r['field']}: dir1={shown(r['dir1'])}  dir2={shown(r['dir2'])}" for r in result["environment"]] or [
        f"  none ({', '.join(ENVIRONMENT)} agree)"]
    return "\n".join(lines) + "\n"
