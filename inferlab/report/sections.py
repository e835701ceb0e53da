"""report.md's sections of a run that measured something: conditions, trials, repeatability, the first-step
distribution, cache, timing and the weight read, memory, batching and limitations. Their tables come from
tables.py and measures.py; page.py puts them in order.
"""

from __future__ import annotations

from inferlab import protocol
from inferlab.report import measures, tables, timing_evidence
from inferlab.report.details import link as details_page_link
from inferlab.report.fmt import (
    DASH,
    MISSING,
    bullet_list,
    code,
    jstr,
    nbytes,
    num,
    table,
    text_cell,
    yes_no,
)
from inferlab.read.runview import RunView

see = details_page_link

BASE_MODEL_TEXT = (
    "**This is a base model's text**: the continuation of a plain prompt by a checkpoint trained only to predict "
    "text, so it can be false, offensive or unsafe. It is kept here as data, exactly as generated, and nothing in "
    "it is ever executed or followed. Do not read truthfulness or quality into it."
)
RSS_WARNING = (
    "Do not subtract these RSS values to get \"model + cache\": the difference also holds allocator retention, "
    "loading copies, library pages first touched later and Python objects, and a peak never falls."
)



# --- the full page ----------------------------------------------------------------------------------


def section_conditions(view: RunView) -> list[str]:
    """The conditions table and what every trial shares."""
    header, rows = tables.conditions_table(view)
    fixed = tables.recorded_protocol(view).get("generation_fixed") or protocol.GENERATION_FIXED
    return ["## Conditions", ""] + table(header, rows) + [
        "", "*Inactive*: greedy passes no sampling argument. Every trial: "
        + ", ".join(f"`{k}={v}`" for k, v in fixed.items()) + ", normal EOS stopping, plain text with "
        "`add_special_tokens=False`. The complete configs each trial passed and used: " + see("Generation configs")
        + ".", ""]


def section_trials(view: RunView, labels: tables.Labels) -> list[str]:
    """Every generation trial in protocol order."""
    count = len(protocol.generation_trials())
    lines = ["## Generation trials", "",
             f"All {count} trials in protocol order. Text is the decoded continuation with special tokens hidden, "
             "as a JSON string (so spaces, newlines and an empty result are visible); *same ids as* names the first "
             "trial that selected identical ids; ids are abbreviated (every id: " + see("Generation trials in full")
             + ")." + (" The text is made up by construction (a synthetic specimen)." if view.synthetic else
                       " " + BASE_MODEL_TEXT), ""]
    lines += table(["#", "trial", "stop", "tokens", "same ids as", "text", "ids"], tables.trial_rows(view, labels))
    return lines + ["", tables.shared_seed_sentence(), ""]



def section_repeatability(view: RunView) -> list[str]:
    """Greedy identity, the seed rerun, distinct continuations and early EOS, per prompt."""
    lines = ["## Repeatability", ""]
    lines += table(["prompt", "greedy repetitions identical", f"{protocol.RERUN_CONDITION} seed "
                    f"{protocol.RERUN_SEED} rerun identical", "distinct continuations / seeds recorded",
                    f"early EOS (before token {protocol.MAX_NEW_TOKENS}, first runs)"], tables.repeatability_rows(view))
    return lines + ["", "Counted here from the generation records, comparing only trials that produced ids (a failed, "
                    "interrupted or missing trial is named, never compared). Three seeds neither estimate the output "
                    "distribution nor pick a best temperature, and different seeds may select the same tokens.", ""]


def section_first_step(view: RunView) -> list[str]:
    """The first-step distribution computed from the saved raw logits."""
    import math

    lines = ["## First-step distribution", "",
             "What the selection settings acted on: the raw first-step logits the run saved "
             "(`tensors/first_step_logits.safetensors`, G's trial per prompt), turned into probabilities here in "
             "float64. Top-p keeps the smallest set of most probable ids whose mass reaches p "
             "(at least p; the id that brings it there is the last one kept).", ""]
    distribution = tables.first_step_distribution(view)
    rows, vocab = [], None
    for row in distribution:
        same = (f"{yes_no(row['equal_across_conditions'])} (max diff {num(row.get('max_diff_across_conditions'), 3)})"
                if "equal_across_conditions" in row else MISSING)
        if not row.get("usable"):
            rows.append([row["prompt_id"], same, f"not available: {text_cell(row.get('reason'))}"] + [MISSING] * 4)
            continue
        vocab = row["vocab"]
        rows.append([row["prompt_id"], same, f"{row[1.0]['entropy']:.2f}", f"{row[0.5]['entropy']:.2f}",
                     f"{row['top1_id']}: {row[1.0]['top1_p']:.3g} / {row[0.5]['top1_p']:.3g}",
                     f"{row['top_p_kept']:,} of {row['vocab']:,}", num(row.get("eos_p"), 3)])
    top_p = distribution[0]["top_p"] if distribution else 0.8
    lines += table(["prompt", "raw logits equal for G/S1/S2/S3", "entropy T=1 (nats)", "entropy T=0.5",
                    "top-1 id: p at T=1 / T=0.5", f"ids top-p {top_p:g} keeps (T=1)", "P(EOS) at T=1"], rows)
    if vocab:
        lines += ["", f"A uniform distribution over {vocab:,} ids has entropy ln {vocab} = {math.log(vocab):.2f} nats. "
                  "Tensor references and the processed scores: " + see("First-step logits") + "."]
    return lines + [""]


def _plot(spec: dict, plot_errors: dict) -> list[str]:
    if not spec["available"]:
        return [f"Plot not drawn ({spec['title']}): {spec['reason']}.", ""]
    if plot_errors.get(spec["name"]):
        return [f"Plot could not be drawn ({spec['title']}): {text_cell(plot_errors[spec['name']])}.", ""]
    return [f"![{spec['title']}]({spec['file']})", ""]


def _plots(view: RunView, section: str, plot_errors: dict) -> list[str]:
    from inferlab.report import plots

    lines = []
    for spec in plots.plot_specs(view.records):
        if spec["section"] == section:
            lines += _plot(spec, plot_errors)
    return lines


def section_cache(view: RunView, labels: tables.Labels, plot_errors: dict) -> list[str]:
    """The declared (and any revised) criterion, the matched-prefix table and its plot."""
    lines = ["## Cache: matched prefixes", ""]
    criterion = view.first("cache_criterion")
    rule = (criterion or {}).get("rule") or (criterion or {}).get("criterion") or protocol.CACHE_TOLERANCE.describe()
    lines.append(f"Declared criterion (seq {criterion.get('seq')}, before any error was computed): "
                 f"{code(str(rule), False)}." if criterion else
                 f"No `cache_criterion` record ({labels.gap('cache_criterion')}).")
    revised = view.first("cache_criterion_revised")
    summary = view.first("cache_summary") or {}
    if revised:
        evaluation = summary.get("revised_evaluation") if isinstance(summary.get("revised_evaluation"), dict) else {}
        lines += ["", f"**Revised criterion, declared after the errors were seen** (seq {revised.get('seq')}): "
                  f"{code(str(revised.get('rule')), False)}; justification: {text_cell(revised.get('justification'))}. "
                  f"Under it every prefix is within tolerance: {yes_no(evaluation.get('all_within_tolerance'))}. It "
                  "is a second, labelled evaluation: the declared criterion keeps its own verdict (column *passed "
                  "(declared)*)."]
    if summary.get("available") is False:
        lines += ["", f"Comparison unavailable: {text_cell(summary.get('reason'))}.", ""]
    elif summary:
        reuse = ("cache reuse exercised" if summary.get("cache_reuse_exercised")
                 else "**prefill only: cache reuse not exercised**")
        keep = summary.get("prefill_logits_to_keep")
        keep_text = f"; prefill logits shapes {jstr(keep, False)}" if keep is not None else ""
        lines += ["", f"Fixed continuation: the first {num(summary.get('m'))} ids of "
                  f"{code(str(summary.get('reference_trial', MISSING)), False)} (stopped by "
                  f"{text_cell(summary.get('reference_stop_reason'))}); {reuse}; "
                  f"{num(summary.get('forward_count'))} forwards counted (expected "
                  f"{num(summary.get('forward_count_expected'))}){keep_text}."]
    header, rows, _ = measures.cache_rows(view)
    lines += [""]
    if rows:
        lines += table(header, rows)
        lines += ["", "*prefix length (fed)*: the tokens of the compared prefix, and in brackets how many of them are "
                  "fed continuation tokens (0 is the prompt alone; the cached path fed each later one as a single "
                  "token). *max error / bound* is the largest |a−b| / (atol + rtol·|b|) over the vocabulary, from "
                  "the saved logit vectors: below 1 every element passes. " + near_tie_sentence(view) +
                  " Alignment inputs, cache shapes and every field: " + see("Cache comparison in full") + "."]
    else:
        lines.append(f"No `cache_comparison` record ({labels.gap('cache_comparison')}).")
    return lines + [""] + _plots(view, "cache", plot_errors)


LEGACY_NEAR_TIE_FACTOR = 10  # the rule runs recorded before they recorded near_tie_allowance


def near_tie_sentence(view: RunView) -> str:
    """How this run's records flagged a near tie: the criterion's rule, or the older rule they were made under."""
    if any("near_tie_allowance" in r for r in view.kind("cache_comparison")):
        return ("A prefix is *near a tie* when its top-two margin is within the *tie allowance*, what the declared "
                "criterion lets those two uncached logits move together: (atol + rtol·|top1|) + (atol + rtol·|top2|). "
                "There the criterion itself would accept a cached argmax that differs, whatever error this run "
                "happened to observe.")
    return (f"*Near a tie* is as these records flagged it, under the rule of the inferlab that wrote them: a top-two "
            f"margin below {LEGACY_NEAR_TIE_FACTOR}× the observed max abs diff, which never flags a bitwise-equal "
            "prefix (current runs compare the margin with what the criterion allows instead).")


def section_timing(view: RunView, labels: tables.Labels, plot_errors: dict) -> list[str]:
    """The timing table, the weight read beside it, phases, loop against generate, divergence, plots."""
    recorded = tables.recorded_protocol(view)
    n = protocol.TIMING_NEW_TOKENS
    lines = ["## Timing", "",
             f"**Stopping rule:** {text_cell(recorded.get('timing_stopping_rule', protocol.TIMING_STOPPING_RULE))}. "
             "These ids are execution samples, not responses.", "",
             "All on `time.perf_counter_ns` from loop start: prefill ends when the next-token logits exist; local TTFT "
             "ends at the first selection (no loading, tokenization, network or queue); mean post-first interval = "
             f"(t{n} − t1)/{n - 1}; throughput = {n}/(t{n} − t0) includes the prompt (its reciprocal is not an "
             "inter-token latency). Warmups are excluded (listed with every timestamp on "
             + see("Timing trials in full") + ").",
             ""]
    rows = measures.timing_rows(view)
    lines += timing_evidence.contention_lines(view)
    if rows:
        lines += table(["condition", "prompt len", "output len", "metric (ms unless noted)",
                        f"samples in schedule order ({measures.CONTENDED_MARK}: contended)",
                        f"median [min{DASH}max], all samples", f"median [min{DASH}max], uncontended only"], rows)
    else:
        lines.append(f"No measured timing trial ({labels.gap('timing_trial')}).")
    lines += [""]
    throughput = measures.throughput_line(view)
    against = timing_evidence.prefill_vs_decode_text(view)
    if throughput or against:  # one paragraph: each is a figure per condition
        lines += [" ".join(text for text in (throughput, against) if text), ""]
    lines += timing_evidence.verdict_lines(view)
    lines += section_weight_read(view)
    phases = measures.phase_rows(view)
    if phases:
        lines += ["Phases timed apart from the loop (ms):", ""]
        lines += table(["phase", "elapsed ms", "boundary"], phases) + [""]
    check = view.first("loop_vs_generate")
    if check:
        lines.append(f"- Loop against `generate()` for {text_cell(check.get('prompt_id'))} (greedy, cache on): equal "
                     f"over {num(check.get('compared_length'))} ids: {yes_no(check.get('equal'))}"
                     + (f", first difference at token {check['first_difference'] + 1}"
                        if isinstance(check.get("first_difference"), int) else "") + ".")
        lines += measures.loop_inputs_lines(check)
    for record in view.kind("cache_divergence"):
        lines.append(f"- Free-running cache on vs off, {text_cell(record.get('prompt_id'))}: "
                     + (f"**diverged**, first at token {record['first_divergence'] + 1}; these timings then no longer "
                        "compare identical prefixes" if isinstance(record.get("first_divergence"), int)
                        else f"identical ids in all {num(record.get('pairs_compared'))} measured pairs") + ".")
    return lines + [""] + _plots(view, "timing", plot_errors)


def section_weight_read(view: RunView) -> list[str]:
    """The time one pass reading the decode step's own weights took, beside the step times; no gap is explained."""
    record, rows = measures.weight_read_rows(view)
    if record is None:
        if view.first("memory_bandwidth"):
            return ["### Reading the decode step's weights", "",
                    "This run recorded a copy bandwidth (`memory_bandwidth`, on " + see("Run-level measurements") +
                    "), not the time to read the step's own weights, so nothing is set beside the step times here: a "
                    "copy rate divided into the step's bytes bounds nothing (the weights may sit in a CPU cache, and "
                    "copying is not reading).", ""]
        return []
    fits = record.get("fits_in_largest_cache")
    largest = (record.get("caches") or {}).get("largest_bytes") if isinstance(record.get("caches"), dict) else None
    levels = [e for e in ((record.get("caches") or {}).get("levels") or []) if isinstance(e, dict)
              and e.get("bytes") == largest and e.get("type") != "Instruction"]
    shared = f", shared with CPUs {text_cell(levels[0].get('shared_cpu_list'))}" if levels else ""
    fit_text = ("unknown (the cache sizes are not known)" if not isinstance(fits, bool)
                else f"{'yes' if fits else 'no'}: {nbytes(record.get('bytes'))} against the largest level's "
                     f"{nbytes(largest)}{shared}, as the kernel lists it; on a virtual machine that level can be "
                     "the host's, shared with other guests, so how much of it this run had is not known")
    left_out = ", ".join(f"{text_cell(item.get('name'))} ({text_cell(item.get('why'))})"
                         for item in record.get("left_out") or [] if isinstance(item, dict)) or "nothing"
    lines = ["### Reading the decode step's weights", "",
             f"One pass over the {num(record.get('tensor_count'))} weight tensors a decode step reads whole "
             f"({nbytes(record.get('bytes'))}; left out: {left_out}) took the times below over "
             f"{num(record.get('passes'))} passes: {text_cell(record.get('method'))}; threads "
             f"{jstr(record.get('threads'), False)}. This machine's CPU caches: "
             f"{measures.cache_levels(record.get('caches'))}. The weights fit in the largest level listed: {fit_text}. "
             f"{text_cell(record.get('note'))}.", "",
             "Nothing in this run measures where the rest of a step's time goes, so this report does not explain "
             "the difference between the two columns, and sets no ratio of them: it would bound nothing (a "
             "cache-off step feeds the whole sequence, not one token).", ""]
    lines += table(["condition", f"mean post-first interval ms, median [min{DASH}max]",
                    f"one weight pass ms, median [min{DASH}max]"], rows)
    return lines + [""]


def section_memory(view: RunView, labels: tables.Labels) -> list[str]:
    """Tensor payloads with their formula checks, per-prefix cache bytes, RSS and what is unmeasured."""
    lines = ["## Memory", "",
             "Tensor payloads counted exactly (unique storage, shared storage counted once); they are not process "
             "memory.", ""]
    rows = measures.memory_rows(view)
    if rows:
        lines += table(["what", "bytes", "check", "note"], rows)
    else:
        lines.append(f"No memory record ({labels.gap('memory')}).")
    per_prefix = measures.per_prefix_cache_bytes(view)
    if per_prefix:
        lines += ["", f"KV cache held after each cached forward of the cache test, by length: {per_prefix}."]
    rss = measures.rss_rows(view)
    if rss:
        lines += ["", "Process memory (RSS), process-wide. The baseline was taken before the model was loaded, in a "
                  "process that had already imported the interpreter's and the experiment's libraries (torch among "
                  "them), so it already includes them:", ""]
        lines += table(["point", "current", "lifetime peak (freeing objects does not lower it)", "source"], rss)
        lines += ["", f"**{RSS_WARNING}**"]
    categories = measures.unmeasured(view)
    if categories:
        lines += ["", "Not measured:", ""] + bullet_list(text_cell(c) for c in categories)
    return lines + [""]


def section_batching(view: RunView, labels: tables.Labels) -> list[str]:
    """Each request alone against its row of the padded batch."""
    lines = ["## Batching (optional extension)", ""]
    rows = measures.batching_rows(view)
    if not rows and view.kind("batching"):
        return lines + ["The batching records hold no singleton-against-batch comparison: "
                        + see("Batching details") + ".", ""]
    if not rows:
        return lines + [f"Not run ({labels.gap('batching')}).", ""]
    summary = next((r for r in view.kind("batching") if r.get("record_type") == "summary"), {})
    lines += [f"Each request alone against its row of a left-padded two-row batch, in both orders "
              f"({num(summary.get('generate_calls'))} `generate()` calls, pad id {num(summary.get('pad_token_id'))}). "
              "A correctness demonstration, not a throughput benchmark.", ""]
    lines += table(["request", "batch order, row", "padding columns", "first-step max abs diff",
                    "first-step argmax agrees", "unpadded prompt matches", "generated ids identical"], rows)
    return lines + ["", "Why rounding differs in a batch, the calls, masks and positions: " + see("Batching details") +
                    ".", ""]


def section_limitations(view: RunView) -> list[str]:
    """What this run cannot show, with its own clock overhead and benchmark."""
    inputs = {r.get("prompt_id"): r.get("length") for r in view.kind("input")}
    lengths = ", ".join(f"{p} {n}" for p, n in inputs.items() if n is not None) or MISSING
    clock = measures.clock_overhead_line(view)
    items = []
    if view.synthetic:
        items.append("The specimen is synthetic: nothing here describes Pythia or any trained model.")
    items += [
        "The instrumentation (clock reads, usage reads, a collection watch, and a hook on every forward that checks "
        "inference mode and the model's training flag) adds time, the same code on both cache paths, and none of "
        "it is subtracted. This run's own measurement: " +
        (clock if clock else "its size was not measured in this run (no `clock_overhead` record).") +
        measures.benchmark_line(view),
        f"A tiny CPU test: one small model, batch 1, {protocol.INTRA_OP_THREADS} thread, prompts of {lengths} tokens. "
        "Nothing follows for larger models, GPUs, long contexts or concurrent serving.",
        "Three seeds per condition neither estimate the output distribution nor pick a best temperature.",
        "The cache tolerance is a diagnostic for this backend and dtype, not a universal guarantee.",
        "RSS is process-wide; the lifetime peak does not fall when Python objects are freed (Linux can reset it, "
        "this run never does) and isolates no cache increment.",
        "The profiling loop keeps selecting after EOS; those ids are not responses.",
        "A generation trial's `generate()` duration (" + see("Generation trials in full") + ") is the wall clock "
        "around a whole call: besides the forwards it holds `generate()`'s own work at every step (preparing the "
        "step's inputs, the stopping criteria, updating its arguments; a profile is in docs/timing.md), so it is no "
        "measurement of generation speed; Part 5's instrumented loop is.",
    ]
    return ["## Limitations", ""] + bullet_list(items) + [""]


