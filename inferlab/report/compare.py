"""Compare two finished record directories from their files alone (no model, no torch): `python -m inferlab
compare`. It reports and does not judge: exact-id agreement per generation and timing trial, the max abs
difference of every saved tensor, the ratio of the timing medians, and every difference of artifact hashes
and environment. Each run is read through its view (inferlab.read.runview).
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any, Union

from inferlab import protocol
from inferlab.base.records import MANIFEST_FILE, RECORDS_FILE
from inferlab.measure.summaries import first_divergence
from inferlab.read.runview import RunView, TensorFileError


def load_for_compare(record_dir: Path) -> RunView:
    """A run's view for compare; ValueError naming the file when its records or manifest cannot be read whole."""
    record_dir = Path(record_dir)
    if not (record_dir / RECORDS_FILE).is_file():
        raise ValueError(f"{record_dir / RECORDS_FILE}: missing")
    view = RunView.read(record_dir)
    for problem in view.problems_of(RECORDS_FILE):
        if problem.lost or problem.code == "not_ascii":
            line = "" if problem.line is None else f":{problem.line}"
            raise ValueError(f"{record_dir / RECORDS_FILE}{line}: {problem.what}")
    for problem in view.problems_of(MANIFEST_FILE):
        if problem.code != "missing":  # a run without a manifest is compared without its environment
            raise ValueError(f"{record_dir / MANIFEST_FILE}: {problem.what}")
    return view


def _id_agreement(rows_a: dict, rows_b: dict, order: list) -> list[dict]:
    result = []
    for key, label in order:
        a, b = rows_a.get(key), rows_b.get(key)
        ids_a = a.get("generated_ids") if a else None
        ids_b = b.get("generated_ids") if b else None
        if a is None or b is None or ids_a is None or ids_b is None:
            status = "missing in " + " and ".join(n for n, r in (("DIR1", ids_a), ("DIR2", ids_b)) if r is None)
            result.append({"trial": label, "equal": None, "first_difference": None, "status": status})
            continue
        difference = first_divergence(ids_a, ids_b)
        result.append({"trial": label, "equal": difference is None, "first_difference": difference,
                       "status": "equal" if difference is None else f"differ from index {difference}"})
    return result


def _tensor_agreement(view_a: RunView, view_b: RunView) -> list[dict]:
    import numpy

    rows = []
    for relative in sorted(set(view_a.tensor_files()) | set(view_b.tensor_files())):
        loaded, unreadable = [], []
        for name, view in (("DIR1", view_a), ("DIR2", view_b)):
            try:
                loaded.append(view.tensor_file(relative))
            except TensorFileError as error:  # reported as a row, not raised: compare reports
                loaded.append({})
                if error.code != "missing":
                    unreadable.append(f"{name}: {error.reason}")
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
                with numpy.errstate(invalid="ignore"):
                    # equal values (the same infinity included, e.g. a filtered -inf score) differ by 0
                    diff = numpy.where(x == y, 0.0, numpy.abs(x - y))
                row["max_abs_diff"] = float(numpy.nanmax(diff)) if diff.size and not numpy.isnan(diff).all() else \
                    (0.0 if not diff.size else float("nan"))
                row["nan_entries"] = int(numpy.isnan(diff).sum())
                row["bitwise_equal"] = a[key].tobytes() == b[key].tobytes()
                row["status"] = "bitwise equal" if row["bitwise_equal"] else "differ"
                if row["nan_entries"]:
                    row["status"] += f" ({row['nan_entries']} NaN entries left out of the max)"
            rows.append(row)
    return rows


TIMING_METRICS = ("prefill_s", "ttft_s", "mean_post_first_interval_s", "loop_s")


def _timing_medians(records: list[dict], uncontended_only: bool = False) -> dict:
    """Per (prompt, use_cache): the median of each metric over the measured (non-warmup) trials; with
    uncontended_only, over those the declared contention rule did not mark (a trial without evidence is left out)."""
    from inferlab.measure.summaries import trial_contended
    from inferlab.measure.summaries import median_min_max, post_first_interval

    values: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    for record in records:
        if record.get("kind") != "timing_trial" or record.get("warmup"):
            continue
        if uncontended_only and trial_contended(record) is not False:
            continue
        key = (record.get("prompt_id"), record.get("use_cache"))
        for metric in TIMING_METRICS:
            value = record.get(metric)
            if value is None and metric == "mean_post_first_interval_s":
                value = post_first_interval(record)
            if isinstance(value, (int, float)):
                values[key][metric].append(value)
    return {key: {m: median_min_max(v)["median"] for m, v in metrics.items() if v} for key, metrics in values.items()}


def field_differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field path, value in a, value in b) for every leaf where two JSON values differ; a dict is
    compared field by field, anything else whole."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for name in sorted(set(a) | set(b), key=str):
            found += field_differences(a.get(name), b.get(name), f"{path}.{name}" if path else str(name))
        return found
    return [] if a == b else [(path, a, b)]


def _environment_differences(manifest_a: dict, manifest_b: dict) -> list[dict]:
    rows = []

    def add(section, name, a, b):
        if a != b:
            rows.append({"section": section, "name": name, "dir1": a, "dir2": b})

    for section in ("platform", "distributions", "thread_environment", "git"):
        a, b = manifest_a.get(section) or {}, manifest_b.get(section) or {}
        for name in sorted(set(a) | set(b)):
            add(section, name, a.get(name), b.get(name))
    # The specimen spec is a large nested object: only the fields that differ are listed, each on its own row.
    for name, a, b in field_differences(manifest_a.get("specimen"), manifest_b.get("specimen")):
        add("specimen", name or "(whole)", a, b)
    for name in ("requirements_lock_sha256", "deviations_from_reference"):
        add("manifest", name, manifest_a.get(name), manifest_b.get(name))
    return rows


def run_state(view: RunView) -> str:
    """One phrase for how a run ended, so that a comparison with an unfinished, partial or unmeasured run says so."""
    from inferlab.report import acquisition_failure

    end = view.session_end
    if end is None:
        return "UNFINISHED: no session_end record (the session was killed or crashed); only what it recorded is compared"
    if end.get("interrupted") or end.get("stopped_early"):
        return f"did NOT finish ({end.get('stop_reason') or 'no reason recorded'}); only what it recorded is compared"
    if acquisition_failure(view) is not None:  # it reached its end, but had no specimen to measure
        return "the specimen was NOT acquired, so nothing was measured"
    if end.get("partial_reasons") or end.get("protocol_complete") is False:
        return "PARTIAL, not the complete protocol: " + "; ".join(map(str, end.get("partial_reasons") or []))
    return "finished, the complete protocol"


def specimen_of(view: RunView) -> dict:
    """The run's specimen as its manifest names it: {name, repo_id, revision, synthetic}."""
    specimen = view.manifest.get("specimen") if isinstance(view.manifest.get("specimen"), dict) else {}
    return {key: specimen.get(key) for key in ("name", "repo_id", "revision", "synthetic")}


def specimen_words(specimen: dict) -> str:
    """'standin (inferlab/standin at revision ..., SYNTHETIC)': a specimen named for the header."""
    synthetic = ", SYNTHETIC" if specimen.get("synthetic") else ""
    return f"{specimen.get('name')} ({specimen.get('repo_id')} at revision {specimen.get('revision')}{synthetic})"


def integrity_problems(view: RunView) -> list[str]:
    """What verify finds wrong with the run's files and records (a hash, a seq, a derived number): compare checks
    both runs first, so that an edited run is never reported as agreeing. How the run ended (unfinished, partial)
    is the header's business, not an integrity problem."""
    from inferlab.read.verify import verify_run

    return [line for line in verify_run(view)["problems"] if not line.startswith(("unfinished: ", "partial: "))]


def _artifact_rows(records: list[dict]) -> dict:
    """name -> the last artifact_file record's {sha256, size} (what the run verified, or found wrong)."""
    return {r.get("name"): {"sha256": r.get("sha256"), "size": r.get("size")}
            for r in records if r.get("kind") == "artifact_file"}


def _artifact_differences(records_a: list[dict], records_b: list[dict]) -> list[dict]:
    """Every artifact file of either run, with its hash and size in each and whether they are the same."""
    a, b = _artifact_rows(records_a), _artifact_rows(records_b)
    names = list(dict.fromkeys([*protocol.ALLOWLISTED_FILES, *sorted(n for n in {*a, *b} if n is not None)]))
    rows = []
    for name in names:
        x, y = a.get(name), b.get(name)
        if x is None and y is None:
            status = "no artifact_file record in either dir"
        elif x is None or y is None:
            status = "missing in " + ("DIR1" if x is None else "DIR2")
        elif x == y:
            status = "equal"
        else:
            status = "differ"
        rows.append({"file": name, "dir1": x, "dir2": y, "equal": status == "equal", "status": status})
    return rows


def _acquisition(records_a: list[dict], records_b: list[dict]) -> dict:
    """How each run got its files (reuse, a build, a download): not an artifact, so not counted with them."""
    methods = [next((r.get("acquisition") for r in reversed(records) if r.get("kind") == "artifact_acquisition"),
                    None) for records in (records_a, records_b)]
    return {"dir1": methods[0], "dir2": methods[1], "equal": methods[0] == methods[1]}


def compare(dir_a: Union[Path, RunView], dir_b: Union[Path, RunView]) -> dict:
    """Compare two record dirs: {generation, timing_ids, tensors, timing_ratios, environment} rows (reports only)."""
    a = dir_a if isinstance(dir_a, RunView) else load_for_compare(Path(dir_a))
    b = dir_b if isinstance(dir_b, RunView) else load_for_compare(Path(dir_b))

    def generation_rows(run: RunView):
        return {(r.get("prompt_id"), r.get("condition"), r.get("seed"), r.get("repetition")): r
                for r in run.kind("generation")}

    def timing_rows(run: RunView):
        return {r.get("schedule_index"): r for r in run.kind("timing_trial")}

    generation_order = [((t.prompt_id, t.condition, t.seed, t.repetition), t.test_id)
                        for t in protocol.generation_trials()]
    timing_order = [(t.schedule_index, t.test_id) for t in protocol.timing_schedule()]
    medians_a, medians_b = _timing_medians(a.records), _timing_medians(b.records)
    clean_a, clean_b = _timing_medians(a.records, True), _timing_medians(b.records, True)

    def ratio_of(x, y):
        return y / x if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x > 0 else None

    ratios = []
    for prompt_id, use_cache in dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()):
        key = (prompt_id, use_cache)
        for metric in TIMING_METRICS:
            x, y = medians_a.get(key, {}).get(metric), medians_b.get(key, {}).get(metric)
            cx, cy = clean_a.get(key, {}).get(metric), clean_b.get(key, {}).get(metric)
            ratios.append({"prompt_id": prompt_id, "use_cache": use_cache, "metric": metric,
                           "median_dir1": x, "median_dir2": y, "ratio_dir2_over_dir1": ratio_of(x, y),
                           "uncontended_median_dir1": cx, "uncontended_median_dir2": cy,
                           "uncontended_ratio_dir2_over_dir1": ratio_of(cx, cy)})
    specimens = {"dir1": specimen_of(a), "dir2": specimen_of(b)}
    return {
        "dir1": str(a.directory),
        "dir2": str(b.directory),
        "integrity": {"dir1": integrity_problems(a), "dir2": integrity_problems(b)},
        "specimens": {**specimens, "equal": specimens["dir1"] == specimens["dir2"]},
        "runs": {"dir1": run_state(a), "dir2": run_state(b)},
        "generation": _id_agreement(generation_rows(a), generation_rows(b), generation_order),
        "timing_ids": _id_agreement(timing_rows(a), timing_rows(b), timing_order),
        "tensors": _tensor_agreement(a, b),
        "timing_ratios": ratios,
        "timing_contention": {"dir1": _contention(a), "dir2": _contention(b)},
        "artifacts": _artifact_differences(a.records, b.records),
        "acquisition": _acquisition(a.records, b.records),
        "environment": _environment_differences(a.manifest, b.manifest),
        "cpu_kernels": _cpu_kernels(a.manifest, b.manifest),
    }


def _contention(view: RunView) -> dict:
    """Each run's contended trials under the declared rule (inferlab.measure.contention)."""
    from inferlab.measure import contention

    return contention.contention_counts(view.kind("timing_trial"))


def _cpu_kernels(manifest_a: dict, manifest_b: dict) -> dict:
    """Each run's CPU kernels as its manifest recorded them (environment.cpu_kernels), and whether they agree."""
    kernels = [(m.get("torch_build") or {}).get("cpu_kernels") if isinstance(m.get("torch_build"), dict) else None
               for m in (manifest_a, manifest_b)]
    return {"dir1": kernels[0], "dir2": kernels[1], "equal": kernels[0] == kernels[1]}


SHOWN_CHARS = 100  # a value longer than this is cut in the text (compare()'s result keeps it whole)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else repr(value)
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}… ({len(text)} chars)"


INTEGRITY_SHOWN = 5  # problem lines shown per run in the header (verify DIR lists them all)


def header_warnings(result: dict) -> list[str]:
    """What the reader must know before any row: a run whose files fail verify, and runs of two specimens."""
    from inferlab.base.commands import spelled

    lines = []
    for name in ("dir1", "dir2"):
        problems = (result.get("integrity") or {}).get(name) or []
        if problems:
            lines.append(f"INTEGRITY: {name.upper()} fails verify ({len(problems)} problem(s)): its files are not what "
                         f"its session wrote, so the rows below compare altered material; "
                         f"`{spelled('verify ' + result[name])}` lists every problem:")
            lines += [f"  {line}" for line in problems[:INTEGRITY_SHOWN]]
            if len(problems) > INTEGRITY_SHOWN:
                lines.append(f"  ... and {len(problems) - INTEGRITY_SHOWN} more")
    specimens = result.get("specimens") or {}
    if specimens and not specimens.get("equal"):
        lines.append(f"DIFFERENT SPECIMENS: DIR1 is of {specimen_words(specimens['dir1'])}, DIR2 of "
                     f"{specimen_words(specimens['dir2'])}: every difference below may be the specimens', not the "
                     f"machines' or the code's")
    return lines


def format_compare(result: dict) -> str:
    """A readable plain-text rendering of compare()'s result."""
    runs = result.get("runs") or {}
    lines = [f"compare: DIR1 = {result['dir1']}" + (f"  ({runs['dir1']})" if runs.get("dir1") else ""),
             f"         DIR2 = {result['dir2']}" + (f"  ({runs['dir2']})" if runs.get("dir2") else "")]
    lines += header_warnings(result) + [""]
    for title, rows in (("generation trials (exact generated ids)", result["generation"]),
                        ("timing trials (exact generated ids)", result["timing_ids"])):
        equal = sum(1 for r in rows if r["equal"])
        lines.append(f"{title}: {equal} of {len(rows)} equal")
        width = max((len(r["trial"]) for r in rows), default=5)
        lines += [f"  {r['trial']:<{width}}  {r['status']}" for r in rows]
        lines.append("")
    lines.append("tensors (max abs diff per key)")
    if not result["tensors"]:
        lines.append("  no tensor files in either dir")
    for row in result["tensors"]:
        lines.append(f"  {row['file']}[{row['key']}]  max_abs_diff={_fmt(row['max_abs_diff'])}  {row['status']}")
    lines += ["", "timing: per-condition medians of the measured trials, ratio DIR2/DIR1 (two runs of the same code "
              "differ by chance, more so on a shared machine: a ratio away from 1 is no finding by itself)"]
    contention = result.get("timing_contention") or {}
    for name in ("dir1", "dir2"):
        found = contention.get(name)
        if found:
            lines.append(f"  {name}: {found['contended']} of {found['trials']} timing trials contended, "
                         f"{found['without_evidence']} without CPU evidence"
                         + (f"; contended: {', '.join(found['contended_ids'])}" if found["contended_ids"] else ""))
    for row in result["timing_ratios"]:
        cache = "cache_on " if row["use_cache"] else "cache_off"
        lines.append(f"  {row['prompt_id']:<5} {cache} {row['metric']:<27} dir1={_fmt(row['median_dir1'])} s  "
                     f"dir2={_fmt(row['median_dir2'])} s  ratio={_fmt(row['ratio_dir2_over_dir1'])}  "
                     f"uncontended ratio={_fmt(row.get('uncontended_ratio_dir2_over_dir1'))}")
    artifacts = result.get("artifacts") or []
    equal = sum(1 for row in artifacts if row["equal"])
    lines += ["", f"artifacts (sha256 and size of every file each run verified): {equal} of {len(artifacts)} equal"]
    for row in artifacts:
        if row["equal"]:
            lines.append(f"  {row['file']}  equal  sha256={row['dir1']['sha256']}")
            continue
        lines.append(f"  {row['file']}  {row['status']}")
        if row["status"] == "differ":
            lines.append(f"    dir1: {_fmt(row['dir1'])}")
            lines.append(f"    dir2: {_fmt(row['dir2'])}")
    acquisition = result.get("acquisition")
    if acquisition:
        lines.append(f"acquisition (how each run got its files; not an artifact): dir1={_fmt(acquisition['dir1'])}  "
                     f"dir2={_fmt(acquisition['dir2'])}" + ("" if acquisition["equal"] else "  differ"))
    kernels = result.get("cpu_kernels")
    if kernels:
        from inferlab.host.environment import describe_kernels

        lines += ["", "CPU kernels (logits of other kernel sets differ by rounding; ids may then part at a near tie)"
                  + ("" if kernels["equal"] else ": DIFFER"),
                  f"  dir1: {describe_kernels(kernels['dir1'])}", f"  dir2: {describe_kernels(kernels['dir2'])}"]
    lines += ["", "environment differences"]
    if not result["environment"]:
        lines.append("  none (platform, distributions, thread environment, git, specimen, lock and deviations agree)")
    for row in result["environment"]:
        lines.append(f"  {row['section']}.{row['name']}: dir1={_fmt(row['dir1'])}  dir2={_fmt(row['dir2'])}")
    return "\n".join(lines) + "\n"

