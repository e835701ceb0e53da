"""report.md's questions table and its evidence of Parts 3 and 4 and the batching extension, and the Markdown cells
every section uses. Each section is a pure function of one run's view and of `why` (inferlab.report.Labels), which
says why a record is missing: a placeholder cell or a sentence, never an error.
"""

from __future__ import annotations

import collections
import json
import math
import re
import statistics
from typing import Any, Optional

import numpy

from inferlab import protocol
from inferlab.files import spelled
from inferlab.measure import stats
from inferlab.measure.stats import is_number
from inferlab.read.runview import RunView

MISSING = "(not recorded)"
LINE_BREAK = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")  # where str.splitlines() would end a row
INTERRUPTED = re.compile(r"^KeyboardInterrupt\b|\bSIG(INT|TERM|HUP|QUIT|KILL)\b")

# --- cells -----------------------------------------------------------------------------------------------------


def code(text: str, in_table: bool = True) -> str:
    """An inline code span; in a table cell pipes are escaped and line breaks written as escapes (\\n)."""
    if in_table:
        text = LINE_BREAK.sub(lambda m: {"\n": "\\n", "\r": "\\r"}.get(m.group(), f"\\u{ord(m.group()):04x}"),
                              text.replace("|", "\\|"))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def visible_json(value: Any) -> str:
    """ASCII JSON in which a run of spaces stays countable (each space after the first written \\u0020)."""
    return re.sub(r"(?<= ) ", r"\\u0020", json.dumps(value, ensure_ascii=True))


def jstr(value: Any, in_table: bool = True) -> str:
    """A value as visible ASCII JSON in a code span."""
    return code(visible_json(value), in_table)


def cell(value: Any) -> str:
    """Prose for a table cell: one line, pipes escaped; the placeholder for None."""
    return MISSING if value is None else " ".join(str(value).split()).replace("|", "\\|")


def num(value: Any, digits: int = 6) -> str:
    """A number with `digits` significant digits; anything else as a cell."""
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else repr(value)
    return str(value).lower() if isinstance(value, bool) else str(value) if is_number(value) else cell(value)


def ms(seconds: Any, decimals: int = 3) -> str:
    """Seconds as milliseconds."""
    return f"{seconds * 1e3:.{decimals}f}" if is_number(seconds) else cell(seconds)


def nbytes(value: Any) -> str:
    """Bytes with separators, and MiB from 1 MiB up."""
    if not is_number(value):
        return cell(value)
    return f"{int(value):,} B" + (f" ({value / 2**20:.2f} MiB)" if value >= 2**20 else "")


def yes_no(value: Any, alarm: bool = True) -> str:
    """yes / no (bold when alarm: a 'no' that is a failure) / the placeholder."""
    return "yes" if value is True else ("**no**" if alarm else "no") if value is False else cell(value)


def spread(values: list, scale=ms) -> str:
    """'median [min–max]' of the numbers among values, each through scale."""
    numbers = sorted(v for v in values if is_number(v))
    if not numbers:
        return MISSING
    return f"{scale(statistics.median(numbers))} [{scale(numbers[0])}–{scale(numbers[-1])}]"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def trial_state(record: Optional[dict]) -> str:
    """'ok', 'failed', 'interrupted' (cut off by a signal) or 'not run' for one trial's record."""
    if record is None:
        return "not run"
    if record.get("status", "ok") == "ok" and isinstance(record.get("generated_ids"), list):
        return "ok"
    return "interrupted" if INTERRUPTED.search(str(record.get("error") or "")) else "failed"


# --- the questions, and where their evidence is ------------------------------------------------------------

# Where each question's evidence is: (sections of report.md, record kinds and tensors)
WHERE = {1: ("Generation trials, Repeatability", "`generation` (G), `sampling_summary`"),
         2: ("Generation trials, Repeatability", "`generation` (S1, S2, S3 and the rerun), `sampling_summary`"),
         3: ("First-step logits, Generation trials", "`generation` `first_step_logits`, `first_step_logits_check`, "
             "`processed_scores_check`; tensors/first_step_logits.safetensors"),
         4: ("Cache: matched prefixes", "`cache_criterion`, `cache_comparison`, `cache_summary`, `cache_inspection`; "
             "tensors/cache_logits.safetensors"),
         5: ("Timing", "`timing_trial`, `timing_summary`, `timing_machine`, `cache_divergence`, `clock_overhead`"),
         6: ("Memory", "`memory`, `model_inspection`")}


def section_questions() -> list[str]:
    """The lab's questions, each with where its evidence is; the report asks them and answers none."""
    rows = [[str(n), cell(text), WHERE[n][0], WHERE[n][1]] for n, text in protocol.QUESTIONS.items()]
    rows.append(["7", "One conclusion about selection and one about computation that this run supports, and two "
                 "limitations", "every section below; Limitations of the procedure", "all of the above"])
    return ["## The questions, and where their evidence is", ""] + table(
        ["#", "the lab asks", "evidence in this report", "records (records.jsonl kinds; tensors)"], rows) + [
        "", f"Answer them in a copy of explanation.md and keep it with the run (`{spelled('attach DIR FILE')}`); "
        f"the tool's own reading of this evidence is then printed beside your answers by "
        f"`{spelled('report DIR --after')}`.", ""]


# --- Part 3: inputs and the generation trials ------------------------------------------------------------


def generations(view: RunView) -> dict[str, dict]:
    """The generation records by protocol trial id."""
    return {record.get("trial_id"): record for record in reversed(view.kind("generation"))}  # the first wins


def section_inputs(view: RunView, why) -> list[str]:
    """Each prompt as the model received it."""
    rows = []
    for r in view.kind("input"):
        ids = [str(i) for i in r.get("token_ids") or []]
        shown = " ".join(ids if len(ids) <= 16 else ids[:8] + ["…"] + ids[-4:])
        rows.append([cell(r.get("prompt_id")), jstr(r.get("source")), yes_no(r.get("serialized_matches_source")),
                     num(r.get("length")), code(shown), num(r.get("eos_token_id"))])
    return ["## Inputs", ""] + (table(["prompt", "source text (JSON)", "serialized = source", "tokens", "token ids",
                                       "EOS id"], rows) if rows else why.absent("input")) + [
        "", "Plain text, no chat template, `add_special_tokens=False`, batch size one, attention mask all ones; every "
        "id, piece, mask and UTF-8 byte is in the `input` records.", ""]


def section_trials(view: RunView, why) -> list[str]:
    """The conditions, then every generation trial in protocol order."""
    conditions = "; ".join(f"**{name}** " + (f"sampling, temperature {c.temperature:g}, top-p {c.top_p:g}, top-k "
                                             f"{c.top_k} (disabled)" if c.do_sample else "greedy")
                           for name, c in protocol.CONDITIONS.items())
    lines = ["## Generation trials", "", f"{conditions}. Seeds {', '.join(map(str, protocol.SEEDS))}, and "
             f"{protocol.RERUN_CONDITION} seed {protocol.RERUN_SEED} once more; G {protocol.GREEDY_REPETITIONS} times. "
             "Every trial: " + ", ".join(f"`{k}={v}`" for k, v in protocol.GENERATION_FIXED.items()) + ", EOS stops. "
             "*text* is the continuation decoded with special tokens hidden, as a JSON string; *same ids as* names "
             "the first trial that selected the same ids. A sampling trial resets the generator to its seed, so "
             "conditions run with one seed share their random draws. Every id and the full configs: the "
             "`generation` records." + ("" if view.synthetic else " The text is a base model's continuation of a plain "
                                        "prompt: data, which can be false, offensive or unsafe, kept exactly as "
                                        "generated; nothing in it is ever executed or followed."), ""]
    records, first, rows = generations(view), {}, []
    for trial in protocol.generation_trials():
        record, number = records.get(trial.test_id), str(trial.index + 1)
        state = trial_state(record)
        if state != "ok":
            rows.append([number, code(trial.test_id), f"{state} ({why.brief(view.outcome_of_param(trial.test_id))})",
                         MISSING, MISSING, MISSING, ""])
            continue
        ids = record["generated_ids"]
        same = first.setdefault(json.dumps(ids), number)
        shown = " ".join(map(str, ids[:3] + (["…"] + ids[-1:] if len(ids) > 4 else ids[3:])))
        rows.append([number, code(trial.test_id), cell(record.get("stop_reason")), str(len(ids)),
                     jstr(record.get("text")), code(shown), "" if same == number else f"#{same}"])
    return lines + table(["#", "trial", "stop", "tokens", "text", "ids", "same ids as"], rows) + [""]


def counted(states: list[str], joined: str = " (") -> str:
    """' (1 failed, 2 not run)' for the trials among states that produced nothing; '' when every one did."""
    counts = collections.Counter(states)
    found = ", ".join(f"{counts[s]} {s}" for s in ("failed", "interrupted", "not run") if counts[s])
    return f"{joined}{found}" + (")" if joined == " (" else "") if found else ""


def repeatability(view: RunView) -> list[dict]:
    """Per prompt, from the trials that produced ids only: greedy identity ('greedy': True, False, or None when the
    recorded repetitions cannot decide it), the seed rerun, distinct continuations and early EOS, each cell saying
    how many trials it rests on and what became of the others ('not run' when none ran)."""
    records, found = generations(view), []
    for prompt_id in protocol.PROMPTS:
        trials = [t for t in protocol.generation_trials() if t.prompt_id == prompt_id]
        state = {t.test_id: trial_state(records.get(t.test_id)) for t in trials}

        def rests_on(chosen) -> tuple[list[str], list[str]]:
            """The ids of the chosen trials that produced them, and every chosen trial's state."""
            ids = [json.dumps(records[t.test_id]["generated_ids"]) for t in chosen if state[t.test_id] == "ok"]
            return ids, [state[t.test_id] for t in chosen]

        greedy = [t for t in trials if t.condition == "G"]
        ids, states = rests_on(greedy)
        identical = len(set(ids)) == 1 if len(ids) == len(greedy) or len(set(ids)) > 1 else None
        word = yes_no(identical) if identical is not None else "not decidable"
        cells = [prompt_id, "not run" if set(states) == {"not run"} else
                 f"{word} ({len(ids)} of {len(greedy)} recorded{counted(states, ', ')})"]
        first = f"{prompt_id}-{protocol.RERUN_CONDITION}-seed{protocol.RERUN_SEED}"
        rerun = first + "-rerun"
        pair, cache = [state[first], state[rerun]], (records.get(rerun) or {}).get("generation_cache")
        if pair == ["ok", "ok"]:
            cells.append(yes_no(records[first]["generated_ids"] == records[rerun]["generated_ids"])
                         + (f"; fresh cache: {yes_no(cache.get('fresh'))}" if isinstance(cache, dict) else ""))
        else:
            cells.append("not run" if pair == ["not run"] * 2 else
                         f"not decidable: first run {pair[0]}, rerun {pair[1]}")
        distinct = []
        for condition in ("S1", "S2", "S3"):
            ids, states = rests_on([t for t in trials if t.condition == condition and not t.is_rerun])
            distinct.append(f"{condition} " + ("not run" if set(states) == {"not run"} else
                                               f"{len(set(ids))}/{len(ids)}{counted(states)}"))
        cells.append(", ".join(distinct))
        firsts = [t for t in trials if not t.is_rerun]
        _, states = rests_on(firsts)
        early = sum(1 for t in firsts if state[t.test_id] == "ok" and stats.stopped_early_on_eos(
            records[t.test_id], protocol.MAX_NEW_TOKENS))
        cells.append("not run" if set(states) == {"not run"} else f"{early} of {states.count('ok')}{counted(states)}")
        found.append({"prompt_id": prompt_id, "greedy": identical, "cells": cells})
    return found


def section_repeatability(view: RunView) -> list[str]:
    """Exact-id repeatability and distinct continuations, counted from the trials that produced ids."""
    header = ["prompt", "greedy repetitions: identical ids", f"{protocol.RERUN_CONDITION} seed {protocol.RERUN_SEED} "
              "rerun: identical ids", "distinct continuations / trials with ids",
              f"stopped at EOS before token {protocol.MAX_NEW_TOKENS} (first runs)"]
    return ["## Repeatability", ""] + table(header, [r["cells"] for r in repeatability(view)]) + [
        "", "A failed, interrupted or missing trial is named here, never compared.", ""]


# --- Part 3: the first-step logits -------------------------------------------------------------------------


def probabilities(logits, temperature: float = 1.0) -> numpy.ndarray:
    """softmax(logits / T) in float64."""
    scaled = numpy.asarray(logits, dtype=numpy.float64).reshape(-1) / temperature
    shifted = numpy.exp(scaled - scaled.max())
    return shifted / shifted.sum()


def entropy_nats(probs: numpy.ndarray) -> float:
    positive = probs[probs > 0]
    return float(-(positive * numpy.log(positive)).sum())


def top_p_kept(probs: numpy.ndarray, top_p: float) -> int:
    """How many ids top-p keeps (transformers' TopPLogitsWarper: the smallest most probable set whose mass
    reaches top_p, at least one)."""
    return max(1, len(probs) - int((numpy.cumsum(numpy.sort(probs)) <= 1 - top_p).sum()))


def first_step(view: RunView) -> list[dict]:
    """Per prompt, from its saved raw first-step logits: vocabulary size, top-1 id, entropy and top-1 probability
    at T=1 and 0.5, ids top-p keeps at T=1, P(EOS); and whether every condition's raw logits equal G's."""
    top_p, found = protocol.CONDITIONS["S3"].top_p, []
    eos = {r.get("prompt_id"): r.get("eos_token_id") for r in view.kind("input")}
    checks = {r.get("prompt_id"): r.get("comparisons") for r in view.kind("first_step_logits_check")}
    for prompt_id in protocol.PROMPTS:
        row: dict = {"prompt_id": prompt_id}
        source = next((r["first_step_logits"] for r in view.kind("generation") if r.get("prompt_id") == prompt_id
                       and isinstance(r.get("first_step_logits"), dict)), None)
        vector = None if source is None else view.tensors.get(source)
        vector = None if vector is None else numpy.asarray(vector, dtype=numpy.float64).reshape(-1)
        if vector is not None and vector.size and numpy.isfinite(vector).all():
            p1, p05, top1 = probabilities(vector), probabilities(vector, 0.5), int(vector.argmax())
            row.update(vocab=vector.size, top1=top1, entropy=(entropy_nats(p1), entropy_nats(p05)),
                       top1_p=(float(p1[top1]), float(p05[top1])), kept=top_p_kept(p1, top_p), top_p=top_p,
                       eos_p=float(p1[eos[prompt_id]]) if isinstance(eos.get(prompt_id), int)
                       and 0 <= eos[prompt_id] < vector.size else None)
        else:
            row["reason"] = ("no first-step logits were saved" if source is None else
                             f"{source.get('file')} [{source.get('key')}] is missing, unreadable or not finite")
        comparisons = checks.get(prompt_id)
        if isinstance(comparisons, dict):
            row["equal"] = all(isinstance(c, dict) and c.get("passed") is True for c in comparisons.values())
            row["max_diff"] = max((c["max_abs_diff"] for c in comparisons.values()
                                   if isinstance(c, dict) and is_number(c.get("max_abs_diff"))), default=None)
        found.append(row)
    return found


def section_first_step(view: RunView) -> list[str]:
    """What the selection settings acted on: the raw first-step logits, turned into probabilities here."""
    rows, found = [], first_step(view)
    for row in found:
        same = f"{yes_no(row['equal'])} (max diff {num(row.get('max_diff'), 3)})" if "equal" in row else MISSING
        rows.append([row["prompt_id"], same] + ([f"not available: {cell(row['reason'])}"] + [MISSING] * 4
                                                if "reason" in row else
                                                [f"{row['entropy'][0]:.2f} / {row['entropy'][1]:.2f}",
                                                 f"{row['top1']}: {row['top1_p'][0]:.3g} / {row['top1_p'][1]:.3g}",
                                                 f"{row['kept']:,} of {row['vocab']:,}", num(row["eos_p"], 3)]))
    vocab = next((row["vocab"] for row in found if "vocab" in row), None)
    return ["## First-step logits", "", "Each prompt's raw first-step logits (the `generation` records' "
            "`first_step_logits`, in tensors/first_step_logits.safetensors), as probabilities computed here in "
            "float64 at temperature 1 and 0.5. Top-p keeps the smallest set of most probable ids whose mass reaches p"
            + (f"; a uniform distribution over {vocab:,} ids has entropy {math.log(vocab):.2f} nats" if vocab else "")
            + ".", ""] + table(["prompt", "raw logits of G, S1, S2, S3 equal", "entropy (nats), T=1 / T=0.5",
                                "top-1 id: p at T=1 / T=0.5", f"ids top-p {protocol.CONDITIONS['S3'].top_p:g} keeps "
                                "at T=1", "P(EOS) at T=1"], rows) + [""]


# --- Part 4: the matched-prefix cache comparison ------------------------------------------------------------


def bound_ratios(view: RunView) -> list[dict]:
    """Per compared prefix: its record, and max |a-b| / (atol + rtol*|b|) over the saved vectors ('bound_ratio':
    1 is the criterion's edge; None without both vectors)."""
    criterion = view.first("cache_criterion") or {}
    atol = criterion.get("atol", protocol.CACHE_TOLERANCE.atol)
    rtol = criterion.get("rtol", protocol.CACHE_TOLERANCE.rtol)
    found = []
    for record in view.kind("cache_comparison"):
        tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
        a, b = view.tensors.get(tensors.get("cached")), view.tensors.get(tensors.get("uncached"))
        ratio = None
        if a is not None and b is not None and numpy.shape(a) == numpy.shape(b) and numpy.size(a):
            a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
            ratio = float((numpy.abs(a - b) / (atol + rtol * numpy.abs(b))).max())
        found.append({**record, "bound_ratio": ratio})
    return found


def section_cache(view: RunView, why) -> list[str]:
    """The declared criterion, the fixed continuation, one row per compared prefix, and the cache's tensors."""
    criterion, summary = view.first("cache_criterion"), view.first("cache_summary") or {}
    lines = ["## Cache: matched prefixes", ""] + (
        [f"Declared criterion (`cache_criterion` seq {criterion.get('seq')}, before any error was computed): "
         f"{code(str(criterion.get('rule')), False)}.", ""] if criterion else why.absent("cache_criterion"))
    if summary.get("available") is False:
        lines += [f"Comparison unavailable: {cell(summary.get('reason'))}.", ""]
    elif summary:
        lines += [f"Fixed continuation: the first {num(summary.get('m'))} ids of "
                  f"{code(str(summary.get('reference_trial')), False)} (stopped by "
                  f"{cell(summary.get('reference_stop_reason'))}); " + ("cache reuse exercised" if summary.get(
                      "cache_reuse_exercised") else "**prefill only: cache reuse not exercised**")
                  + f"; {num(summary.get('forward_count'))} forwards "
                  f"(expected {num(summary.get('forward_count_expected'))}).", ""]
    rows = []
    for number, r in enumerate(bound_ratios(view), start=1):
        argmax = f"{num(r.get('argmax_cached'))} / {num(r.get('argmax_uncached'))}"
        rows.append([str(number), f"{num(r.get('prefix_length'))} ({num(r.get('fed_continuation_tokens'))})",
                     num(r.get("max_abs_diff"), 3), num(r["bound_ratio"], 3), num(r.get("fail_fraction"), 3),
                     yes_no(r.get("bitwise_equal"), False), argmax if r.get("argmax_cached") == r.get(
                         "argmax_uncached") else f"**{argmax}**", num(r.get("top2_margin_uncached"), 4),
                     num(r.get("near_tie_allowance"), 3), yes_no(r.get("near_tie"), False), yes_no(r.get("passed"))])
    if not rows:
        return lines + why.absent("cache_comparison")
    layers = [layer for layer in (view.first("cache_inspection") or {}).get("layers") or [] if isinstance(layer, dict)]
    key = layers[0].get("key") if layers and isinstance(layers[0].get("key"), dict) else None
    return lines + table(["#", "prefix length (fed)", "max abs diff", "max error / bound", "fail fraction",
                          "bitwise equal", "argmax cached / uncached", "top-2 margin", "tie allowance", "near tie",
                          "within the criterion"], rows) + [
        "", "*(fed)*: continuation tokens fed after the prompt (0: the prompt alone; the cached path feeds each as one "
        "token). *max error / bound*: the largest |a−b| / (atol + rtol·|b|) over the vocabulary, from the saved "
        "vectors (below 1, every element is within the criterion). *Near tie*: the top-two margin is within the *tie "
        "allowance*, how far the criterion lets those two logits move towards each other."
        + (f" The cache after the last cached forward: {len(layers)} layers, keys {cell(key.get('dtype'))} on "
           f"{cell(key.get('device'))}, shape {jstr(key.get('shape'), False)}, logical length "
           f"{num(layers[0].get('logical_length_from_cache'))} (`cache_inspection`)." if key else "")
        + " Masks, positions and ids fed per prefix: the `cache_comparison` records.", ""]


# --- the optional batching extension -------------------------------------------------------------------


def section_batching(view: RunView, why) -> list[str]:
    """Each request alone against its row of the left-padded batch, in both orders."""
    calls = {r.get("call_index"): r for r in view.kind("batching") if r.get("record_type") == "call"}
    rows = [[cell(c.get("request_id")), "[" + ", ".join(map(str, (calls.get(c.get("batch_call_index")) or {}).get(
        "request_ids") or [])) + f"], row {num(c.get('row'))}", num(c.get("padding_columns")),
             num(c.get("first_step_max_abs_diff"), 3), yes_no(c.get("first_step_argmax_agree")),
             yes_no(c.get("generated_ids_identical"))]
            for s in view.kind("batching") if s.get("record_type") == "summary"
            for c in s.get("comparisons") or [] if isinstance(c, dict)]
    return ["## Batching (optional extension)", ""] + (table(
        ["request", "batch, row", "padding columns", "first-step max abs diff", "first-step argmax agrees",
         "generated ids identical"], rows) + ["", "Masks, positions and the row mapping: the `batching` records.", ""]
        if rows else why.absent("batching"))
