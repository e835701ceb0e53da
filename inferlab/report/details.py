"""report-details.md: the records behind every section of report.md, for a grader or a curious learner.

Environment, artifacts, model inspection, input pieces, full configs, every trial, cache alignment
inputs, every timing trial, memory and batching records, run-level measurements, test outcomes and
warnings. report.md links each section by its heading's anchor (SECTIONS).
"""

from __future__ import annotations

import collections
import json
from typing import Any, Callable

from inferlab import protocol
from inferlab.report import measures, tables
from inferlab.report.fmt import (
    MISSING,
    code,
    first_message,
    flag,
    jstr,
    message_lines,
    ms,
    nbytes,
    num,
    slug,
    table,
    text_cell,
    yes_no,
)
from inferlab.read.runview import ENVELOPE_FIELDS, RunView, short_test

DETAILS_FILE = "report-details.md"
LONG_VALUE_CHARS = 200
KEY_DISTRIBUTIONS = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub", "huggingface_hub",
                     "numpy", "matplotlib", "pytest")
CONFIG_FIELDS = ("model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers",
                 "num_attention_heads", "intermediate_size", "rotary_pct", "rotary_emb_base", "use_parallel_residual",
                 "tie_word_embeddings", "attention_bias", "max_position_embeddings", "bos_token_id", "eos_token_id",
                 "pad_token_id", "dtype", "torch_dtype")
SECTIONS = ("Environment", "Artifacts", "Model load and inspection", "Inputs", "Generation configs",
            "Generation trials in full", "First-step logits", "Cache comparison in full", "Timing trials in full",
            "Memory records", "Batching details", "Run-level measurements", "Test outcomes", "Warnings")


def link(section: str) -> str:
    """A Markdown link from report.md to one section of this page."""
    if section not in SECTIONS:
        raise ValueError(f"details section: expected one of {SECTIONS}, got {section!r}")
    return f"[{section.lower()}]({DETAILS_FILE}#{slug(section)})"


def value_cell(value: Any, seq: Any = None) -> str:
    """Any record value for a table cell; long values are cut with a pointer to the full record."""
    text = json.dumps(value, ensure_ascii=True)
    if len(text) > LONG_VALUE_CHARS:
        return code(text[:LONG_VALUE_CHARS]) + f" … ({len(text)} chars; records.jsonl seq {seq})"
    return code(text)


def field_table(record: dict, skip: tuple = ()) -> list[str]:
    """Every field of a record but the envelope, one row each."""
    rows = [[code(name), value_cell(value, record.get("seq"))] for name, value in record.items()
            if name not in ENVELOPE_FIELDS and name not in skip]
    return table(["field", "value"], rows) if rows else ["(no fields)"]


def record_block(record: dict, skip: tuple = ()) -> list[str]:
    """A record's kind and seq, then its fields."""
    return [f"`{record.get('kind')}` (seq {record.get('seq')}, {code(short_test(record.get('test')), False)}):", ""] + \
        field_table(record, skip) + [""]


def collapsed(summary: str, body: list[str]) -> list[str]:
    """A collapsed HTML block around Markdown lines (blank lines keep tables rendering inside it)."""
    return [f"<details><summary>{summary}</summary>", ""] + body + ["", "</details>", ""]


def json_block(value: Any) -> list[str]:
    """A value as pretty ASCII JSON in a fenced block."""
    return ["```json", json.dumps(value, ensure_ascii=True, indent=1), "```"]


def absent(view: RunView, what: str, *also: str) -> list[str]:
    """'No X record (why).': why, from the tests that write X (or any of the kinds `also`)."""
    return [f"No {what} record ({tables.Labels(view).gap(what, *also)}).", ""]


# --- sections -------------------------------------------------------------------------------


def environment(view: RunView) -> list[str]:
    """Python, OS, CPU, key versions, lock, git, command, options, threads."""
    manifest = view.manifest
    platform = manifest.get("platform") if isinstance(manifest.get("platform"), dict) else {}
    distributions = manifest.get("distributions") if isinstance(manifest.get("distributions"), dict) else {}
    git = manifest.get("git") if isinstance(manifest.get("git"), dict) else {}
    command, source = view.command()
    rows = [
        ["Python", text_cell(f"{platform.get('python_implementation', '?')} {platform.get('python_version', '?')}")],
        ["OS / machine", text_cell(f"{platform.get('os', '?')} {platform.get('os_release', '')} "
                                   f"{platform.get('machine', '?')}")],
        ["CPU", text_cell(f"{platform.get('cpu_model', MISSING)}, {platform.get('logical_cpus', '?')} logical CPUs")],
    ]
    rows += [[code(name), code(str(distributions[name]))] for name in KEY_DISTRIBUTIONS if name in distributions]
    rows += [
        ["installed distributions", f"{len(distributions)} (all in manifest.json)"],
        ["requirements.lock sha256", code(str(manifest.get("requirements_lock_sha256", MISSING)))],
        ["git commit", code(str(git.get("commit"))) + (" (dirty)" if git.get("dirty") else "")],
        ["source files hashed", f"{len(manifest.get('source_sha256') or {})} (manifest.json `source_sha256`)"],
        ["command", (code(command) + f" ({source})") if command else MISSING],
        ["sys.argv", jstr(manifest.get("argv", MISSING))],
        ["options", jstr(manifest.get("options", MISSING))],
        ["thread environment", jstr(manifest.get("thread_environment", MISSING))],
        ["started (UTC)", text_cell(manifest.get("started_utc"))],
    ]
    for record in view.kind("thread_controls"):
        rows.append([f"torch threads (seq {record.get('seq')})",
                     f"requested {jstr(record.get('requested'))}, effective {jstr(record.get('effective'))}"])
    lines = table(["", ""], rows) + ["", "Deviations from the reference environment:", ""]
    deviations = manifest.get("deviations_from_reference")
    lines += [f"- {text_cell(d)}" for d in deviations or []] or ([f"- {MISSING}"] if deviations is None else ["- none"])
    return lines + [""]


def artifacts(view: RunView) -> list[str]:
    """The specimen, its acquisition and every allowlisted file with its hashes."""
    lines = []
    for record in view.kind("specimen"):
        lines += record_block(record, skip=("expected",))
    for record in view.kind("artifact_acquisition"):
        lines += record_block(record)
    files = {r.get("name"): r for r in view.kind("artifact_file")}
    if not files:
        return lines + absent(view, "artifact_file")
    rows = []
    for name in list(protocol.ALLOWLISTED_FILES) + sorted(n for n in files if n not in protocol.ALLOWLISTED_FILES):
        record = files.get(name)
        if record is None:
            rows.append([code(str(name))] + [MISSING] * 6)
            continue
        reference = record.get("reference") if isinstance(record.get("reference"), dict) else None
        reference_cell = (f"{text_cell(reference.get('status'))} ({text_cell(str(reference.get('revision'))[:8])})"
                          if reference else "-")
        size = ("absent at the revision" if record.get("absent_at_revision")
                else "missing from this copy" if record.get("present") is False else num(record.get("size")))
        rows.append([code(str(name)), size, code(str(record.get("sha256"))[:16]) + "…",
                     code(str(record.get("expected_sha256"))[:16]) + "…" if record.get("expected_sha256") else "-",
                     yes_no(record.get("ok")), reference_cell, text_cell(record.get("problem") or "")])
    lines += table(["file", "size (B)", "sha256", "pinned sha256", "ok", "published reference copy", "problem"], rows)
    lines += ["", "Full hashes are in the `artifact_file` records. The published reference column compares a small "
              "file with the copy published for a named revision: information only, never a refusal.", ""]
    for record in view.kind("artifact_directory"):
        lines += record_block(record)
    return lines


def model(view: RunView) -> list[str]:
    """How the model was loaded and what it is: config and named parameters."""
    lines = []
    for record in view.kind("model_load"):
        lines += record_block(record)
    inspection = view.first("model_inspection")
    if inspection is None:
        return lines + absent(view, "model_inspection", "model_load")
    lines += record_block(inspection, skip=("config", "parameters"))
    config = inspection.get("config") if isinstance(inspection.get("config"), dict) else {}
    if config:
        lines += ["Config as loaded (main fields):", ""]
        lines += table(["field", "value"], [[code(k), value_cell(config[k])] for k in CONFIG_FIELDS if k in config])
        lines += [""] + collapsed("the whole config as loaded", json_block(config))
    parameters = inspection.get("parameters")
    if isinstance(parameters, list):
        rows = [[str(i), code(str(p.get("name"))), jstr(p.get("shape")), num(p.get("numel")), text_cell(p.get("device")),
                 text_cell(p.get("dtype"))] for i, p in enumerate(parameters, start=1) if isinstance(p, dict)]
        lines += collapsed(f"{len(rows)} named parameters: name, shape, device, dtype",
                           table(["#", "name", "shape", "numel", "device", "dtype"], rows))
    return lines


def inputs(view: RunView) -> list[str]:
    """Each prompt as the model received it."""
    lines = ["Strings are JSON-escaped; a token id with no token has the piece `null`.", ""]
    records = {r.get("prompt_id"): r for r in view.kind("input")}
    if not records:
        return lines + absent(view, "input")
    shown = ("source", "serialized", "serialized_matches_source", "length", "token_ids", "token_pieces",
             "attention_mask")
    for prompt_id, record in records.items():
        rows = [[code(name), jstr(record.get(name)) if name != "serialized_matches_source"
                 else yes_no(record.get(name))] for name in shown]
        rows += [[code(k), value_cell(v, record.get("seq"))] for k, v in record.items()
                 if k not in shown and k not in ENVELOPE_FIELDS]
        lines += [f"### {prompt_id}", ""] + table(["field", "value"], rows) + [""]
    return lines


def config_differences(passed: Any, effective: Any) -> str:
    """The fields where generate()'s prepared config differs from the one passed, as 'name: passed -> used'."""
    if not isinstance(passed, dict) or not isinstance(effective, dict):
        return MISSING
    names = sorted(set(passed) | set(effective))
    changed = [f"{name}: {json.dumps(passed.get(name))} -> {json.dumps(effective.get(name))}" for name in names
               if passed.get(name) != effective.get(name)]
    return "; ".join(changed) or "none"


def generation_configs(view: RunView) -> list[str]:
    """The generation configs passed and used, grouped by condition."""
    records = view.kind("generation")
    if not records:
        return absent(view, "generation")
    lines = ["`generation_config` is what each trial passed (it replays the trial); `generation_config_effective` is "
             "the copy `generate()` prepared and used, shown as its differences from the passed one (both are complete "
             "in each `generation` record). Trials that share a config are listed together.", ""]
    for condition in dict.fromkeys(r.get("condition") for r in records):
        group = [r for r in records if r.get("condition") == condition]
        lines += [f"### {condition}", ""]
        passed: dict[str, list[str]] = collections.defaultdict(list)
        used: dict[str, list[str]] = collections.defaultdict(list)
        for record in group:
            passed[json.dumps(record.get("generation_config"), sort_keys=True)].append(str(record.get("trial_id")))
            used[config_differences(record.get("generation_config"), record.get("generation_config_effective"))
                 ].append(str(record.get("trial_id")))
        for text, trial_ids in passed.items():
            lines += collapsed(f"<code>generation_config</code> passed by {', '.join(trial_ids)}",
                               json_block(json.loads(text)))
        lines += table(["trials", "generation_config_effective differs in"],
                       [[text_cell(", ".join(ids)), code(diff)] for diff, ids in used.items()]) + [""]
        first = group[0]
        lines += [f"Processors `generate()` built: {jstr(first.get('processors'), False)}; stopping criteria: "
                  f"{jstr(first.get('stopping_criteria'), False)}; random generators reset (first trial): "
                  f"{jstr(first.get('rng_reset'), False)}.", ""]
    return lines


def generation_trials(view: RunView) -> list[str]:
    """Every generation trial's ids, text, EOS positions and cache freshness."""
    records = view.kind("generation")
    if not records:
        return absent(view, "generation")
    rows = []
    for number, record in enumerate(records, start=1):
        cache = record.get("generation_cache")
        cache_cell = f"{flag(cache.get('fresh'))}: {text_cell(cache.get('how'))}" if isinstance(cache, dict) else "-"
        rows.append([str(number), code(str(record.get("trial_id"))), text_cell(record.get("status")),
                     text_cell(record.get("stop_reason")), jstr(record.get("generated_ids")),
                     jstr(record.get("text_with_special")), jstr(record.get("eos_positions")),
                     ms(record.get("elapsed_s")), cache_cell, str(record.get("seq"))])
    return table(["#", "trial", "status", "stop", "generated ids", "text with special tokens", "EOS at", "generate ms",
                  "fresh generation cache", "seq"], rows) + ["", tables.shared_seed_sentence(), "",
                                                             GENERATE_MS_NOTE, ""]


GENERATE_MS_NOTE = (
    "*generate ms* is the wall clock around one whole `generate()` call: besides the forwards it holds "
    "`generate()`'s own work at every step (preparing the step's inputs, the stopping criteria, updating its "
    "arguments; a profile is in docs/timing.md). These durations are not Part 5's timing, and are not comparable "
    "with it.")


def first_step(view: RunView) -> list[str]:
    """The saved first-step logits and their checks across conditions."""
    lines = []
    rows = [[code(str(r.get("trial_id"))), code(str(r["first_step_logits"].get("file"))),
             code(str(r["first_step_logits"].get("key"))), jstr(r["first_step_logits"].get("shape")),
             code(str(r["first_step_logits"].get("sha256"))[:16]) + "…"]
            for r in view.kind("generation") if isinstance(r.get("first_step_logits"), dict)]
    if rows:
        lines += ["Saved raw first-step logits (`output_logits`, before any processor):", ""]
        lines += table(["trial", "file", "key", "shape", "sha256"], rows) + [""]
    rows = []
    for record in view.kind("first_step_logits_check"):
        for condition, stats in (record.get("comparisons") or {}).items():
            stats = stats if isinstance(stats, dict) else {}
            rows.append([text_cell(record.get("prompt_id")), f"{condition} vs {text_cell(record.get('reference'))}",
                         num(stats.get("max_abs_diff")), flag(stats.get("bitwise_equal")), yes_no(stats.get("passed"))])
    if rows:
        lines += ["Raw logits of each condition against G's:", ""]
        lines += table(["prompt", "condition", "max abs diff", "bitwise equal", "within tolerance"], rows) + [""]
    rows = []
    for record in view.kind("processed_scores_check"):
        for condition, row in (record.get("rows") or {}).items():
            row = row if isinstance(row, dict) else {}
            stats = row.get("scores_vs_raw") if isinstance(row.get("scores_vs_raw"), dict) else {}
            difference = stats.get("max_abs_diff")
            rows.append([text_cell(record.get("prompt_id")), text_cell(condition), num(row.get("temperature")),
                         "not finite (top-p sets filtered ids to -inf)" if difference is None else num(difference),
                         flag(stats.get("bitwise_equal"))])
    if rows:
        lines += ["Processed scores (after the processors) against the raw logits of the same step:", ""]
        lines += table(["prompt", "condition", "temperature", "max abs diff", "bitwise equal"], rows) + [""]
    return lines or absent(view, "first_step_logits_check")


def cache(view: RunView) -> list[str]:
    """The cache test's records: criterion, summary, alignment inputs and any revised evaluation."""
    lines = []
    for kind in ("cache_criterion", "cache_criterion_revised", "cache_summary", "cache_inspection"):
        for record in view.kind(kind):
            lines += record_block(record)
    comparisons = view.kind("cache_comparison")
    if not comparisons:
        return lines + absent(view, "cache_comparison")
    rows = []
    for number, record in enumerate(comparisons, start=1):
        checks = record.get("checks") if isinstance(record.get("checks"), dict) else {}
        rows.append([str(number), num(record.get("prefix_length")), jstr(record.get("prefix_ids")),
                     num(record.get("next_target_id")), num(record.get("cache_seq_length_after_forward")),
                     nbytes(record.get("cache_unique_bytes_after_forward")),
                     text_cell(", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items())),
                     str(record.get("seq"))])
    lines += ["Per prefix: the ids both paths saw, the next target, the cache after the cached forward, and the "
              "alignment checks:", ""]
    lines += table(["#", "prefix length", "prefix ids", "next target", "cache length", "cache bytes", "checks", "seq"],
                   rows) + [""]
    fed = [(number, r["fed_inputs"]) for number, r in enumerate(comparisons, start=1) if isinstance(r.get("fed_inputs"), dict)]
    if fed:
        rows = []
        for number, inputs_fed in fed:
            for path in ("uncached", "cached"):
                fields = inputs_fed.get(path) if isinstance(inputs_fed.get(path), dict) else {}
                rows.append([str(number), path, jstr(fields.get("attention_mask")), jstr(fields.get("position_ids")),
                             jstr(fields.get("cache_position"))])
        lines += ["What each path was fed (the alignment a grader can check):", ""]
        lines += table(["#", "path", "attention_mask", "position_ids", "cache_position"], rows) + [""]
    else:
        lines += ["The inputs each path was fed (`fed_inputs`) are not recorded in this run.", ""]
    revised = [r for r in comparisons if isinstance(r.get("revised"), dict)]
    if revised:
        lines += ["Revised evaluation per prefix (a second, labelled criterion):", ""]
        lines += table(["prefix length", "atol", "rtol", "passed", "fail count", "fail fraction"],
                       [[num(r.get("prefix_length")), num(r["revised"].get("atol")), num(r["revised"].get("rtol")),
                         yes_no(r["revised"].get("passed")), num(r["revised"].get("fail_count")),
                         num(r["revised"].get("fail_fraction"))] for r in revised]) + [""]
    return lines


def timing_trials(view: RunView) -> list[str]:
    """Every timing trial with every selection time, and the timing records."""
    records = {r.get("schedule_index"): r for r in view.kind("timing_trial")}
    if not records:
        return absent(view, "timing_trial")
    labels = tables.Labels(view)
    rows = []
    for planned in protocol.timing_schedule():
        record = records.get(planned.schedule_index)
        number = str(planned.schedule_index + 1)
        state = tables.trial_state(record, needs_ids=False)
        if state != "ok":
            rows.append([number, code(planned.test_id), labels.trial_cell(state, planned.test_id, record)]
                        + [MISSING] * 7)
            continue
        times = measures.token_times(record)
        rows.append([number, code(planned.test_id), "warmup" if record.get("warmup") else "measured",
                     num(record.get("prompt_length")), ms(record.get("prefill_s")), ms(record.get("ttft_s")),
                     ms(measures.post_first_interval(record)), ms(record.get("loop_s")),
                     jstr(record.get("eos_positions")),
                     code(" ".join(f"{t * 1e3:.2f}" for t in times)) if times else MISSING])
    lines = table(["#", "trial", "role", "prompt len", "prefill ms", "TTFT ms", "post-first ms", "loop ms", "EOS at",
                   f"selection times t1..t{protocol.TIMING_NEW_TOKENS} (ms from loop start)"], rows) + [""]
    for kind in ("timing_summary", "loop_vs_generate", "cache_divergence"):
        for record in view.kind(kind):
            lines += record_block(record)
    return lines


def memory(view: RunView) -> list[str]:
    """Every memory record."""
    records = view.kind("memory")
    if not records:
        return absent(view, "memory")
    lines = []
    for record in records:
        lines += record_block(record, skip=("per_layer",))
    return lines


def batching(view: RunView) -> list[str]:
    """The batching calls and their records."""
    records = view.kind("batching")
    if not records:
        return absent(view, "batching")
    calls = [r for r in records if r.get("record_type") == "call"]
    rows = [[str(i), text_cell(r.get("call_type")), jstr(r.get("request_ids")), jstr(r.get("row_to_request")),
             jstr(r.get("attention_mask")), jstr(r.get("prefill_position_ids_observed")), ms(r.get("elapsed_s"))]
            for i, r in enumerate(calls, start=1)]
    lines = table(["call", "type", "requests", "row to request", "attention mask", "prefill positions", "ms"], rows)
    lines += [""]
    for record in records:
        if record.get("record_type") != "call":
            lines += record_block(record, skip=("generation_config",))
            if isinstance(record.get("explanation"), str):
                lines += [f"Explanation recorded with the comparison: {text_cell(record['explanation'])}", ""]
    return lines


def run_level(view: RunView) -> list[str]:
    """The run-level records and the plan's totals."""
    lines = []
    # memory_bandwidth and benchmark_reference are what older runs recorded; they are shown when present.
    for kind in ("session_end", "plan", "offline_guard", "weight_read", "clock_overhead", "memory_bandwidth",
                 "benchmark_reference"):
        records = view.kind(kind)
        lines += [rec for record in records for rec in record_block(record)]
        if not records and kind not in ("memory_bandwidth", "benchmark_reference"):
            lines += [f"No `{kind}` record in this run.", ""]
    plan = view.plan or {}
    if plan:
        lines += [f"plan.json: {len(view.planned)} tests; totals {jstr(plan.get('totals'), False)}; cap violations "
                  f"{jstr(plan.get('cap_violations'), False)}; shortfalls {jstr(plan.get('shortfalls'), False)}.", ""]
    return lines


def outcomes(view: RunView) -> list[str]:
    """Outcomes per protocol part, each failure's message and longrepr, each skip's reason."""
    decisive = view.tests_by_outcome()
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for nodeid, outcome in decisive.items():
        counts[view.part_label(nodeid)][f"{view.check_kind(outcome)} {outcome.get('outcome')}"] += 1
    lines = table(["protocol part", "outcomes"],
                  [[part, ", ".join(f"{n} {k}" for k, n in sorted(c.items()))] for part, c in counts.items()]) + [""]
    for nodeid, outcome in decisive.items():
        if outcome.get("outcome") in ("failed", "error"):
            lines += [f"### {short_test(nodeid)}", "",
                      f"{outcome.get('outcome')} in {outcome.get('phase')} ({view.check_kind(outcome)}; seq "
                      f"{outcome.get('seq')}). Message:", "", "```text", *message_lines(outcome.get("longrepr")),
                      "```", ""]
            longrepr = str(outcome.get("longrepr") or "")
            if longrepr:
                lines += collapsed("the whole longrepr", ["```text", longrepr, "```"])
    skipped = [o for o in decisive.values() if o.get("outcome") == "skipped"]
    if skipped:
        lines += ["Skipped tests and their reasons:", ""]
        lines += table(["test", "kind", "reason"], [[code(short_test(o.get("test"))), view.check_kind(o),
                                                     text_cell(o.get("skip_reason") or first_message(o.get("longrepr")))]
                                                    for o in skipped]) + [""]
    return lines


def warnings(view: RunView) -> list[str]:
    """Every record that captured a warning or log message."""
    found = measures.warnings_by_record(view)
    if not found:
        return ["No record captured a warning or log message.", ""]
    rows = [[str(r.get("seq")), text_cell(r.get("kind")), code(short_test(r.get("test"))),
             text_cell(" / ".join(messages))] for r, messages in found]
    return table(["seq", "kind", "test", "messages"], rows) + [""]


BUILDERS: dict[str, Callable[[RunView], list[str]]] = {
    "Environment": environment, "Artifacts": artifacts, "Model load and inspection": model, "Inputs": inputs,
    "Generation configs": generation_configs, "Generation trials in full": generation_trials,
    "First-step logits": first_step, "Cache comparison in full": cache, "Timing trials in full": timing_trials,
    "Memory records": memory, "Batching details": batching, "Run-level measurements": run_level,
    "Test outcomes": outcomes, "Warnings": warnings,
}


def render(view: RunView) -> str:
    """report-details.md's Markdown for one run."""
    lines = ["# inferlab run details", "",
             "The records behind [report.md](report.md), section by section. `records.jsonl` seq numbers point to the "
             "full records.", ""]
    for problem in view.read_problems + view.tensor_read_problems():
        lines.append(f"- reading problem: {text_cell(problem)}")
    for section in SECTIONS:
        lines += [f"## {section}", ""]
        try:
            lines += BUILDERS[section](view)
        except Exception as error:  # one odd record must not cost the rest of the page
            lines += [f"**This section could not be rendered from these records: "
                      f"{text_cell(f'{type(error).__name__}: {error}')}.**", ""]
    return "\n".join(lines).rstrip("\n") + "\n"

