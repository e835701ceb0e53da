"""Runs for the grading tests, built in memory with the harness's writers (tests/fixtures_records.py), and the
written work a learner adds: predictions and an attached explanation.

`attach` does not exist on this branch yet (issue 23 builds it), so attach_file() writes the addenda ledger
and its file exactly as /work/plan/ADDENDA-CONTRACT.md (and inferlab.reading.addenda's docstring) describe: the file
under addenda/, one ledger line with its size, SHA-256, the manifest's SHA-256 and the structure check of
inferlab.reading.addenda.structure_of. When the real attach is merged these tests read what it writes through the
same reader (RunView.addenda).

A fixture run's manifest says no predictions were supplied (its builder starts the session without them);
give_predictions() does what the session start does for --predictions (copy the file, record its hash and the
template check in the manifest) and refreshes the inventory, so the run stays self-consistent.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path
from typing import Optional

from inferlab.files import sha256_file
from inferlab.run.records import MANIFEST_FILE, PREDICTIONS_FILE, RECORDS_FILE
from inferlab.host import environment
from inferlab import writing
from inferlab.read import addenda
from inferlab.read.verify import verify_run

from fixtures_records import REPO_ROOT, _envelope, build_rich_run, edit_manifest, rerender

TEMPLATE = (REPO_ROOT / writing.EXPLANATION_TEMPLATE).read_text(encoding="utf-8")
PREDICTIONS_TEMPLATE = (REPO_ROOT / writing.PREDICTIONS_TEMPLATE).read_text(encoding="utf-8")


def answered_predictions() -> str:
    """The predictions template with every answer field filled in."""
    lines = []
    for line in PREDICTIONS_TEMPLATE.splitlines():
        match = writing.FIELD.match(line)
        lines.append(f"{match.group(1)}: my answer, written before the run" if match else line)
    return "\n".join(lines) + "\n"


def answered_explanation(skip: tuple[str, ...] = ()) -> str:
    """The explanation template with text of its own under every answer heading, except the headings in
    `skip` (left with the template's guidance only)."""
    out, current = [], None  # current: the heading above, None under the page's title
    for line in TEMPLATE.splitlines():
        match = writing.HEADING.match(line)
        if match:
            current = match.group(2).strip() if len(match.group(1)) > 1 else None
            out.append(line)
        elif line.strip() and current is not None and current not in skip:
            out.append(f"My own words on {current}, resting on records.jsonl seq 40 and 139.")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def give_predictions(run_dir: Path, text: str) -> Path:
    """Put a predictions file into a built run as the session start would have (see the module docstring)."""
    target = Path(run_dir) / PREDICTIONS_FILE
    target.write_text(text, encoding="utf-8")
    manifest = json.loads((Path(run_dir) / MANIFEST_FILE).read_text())
    status = writing.predictions_status(text, PREDICTIONS_TEMPLATE)
    edit_manifest(run_dir, predictions={"supplied": True, "source": str(target), "copied_to": PREDICTIONS_FILE,
                                        "sha256": sha256_file(target), "source_mtime_utc": manifest["started_utc"],
                                        "copied_at_utc": manifest["started_utc"], **status})
    rerender(run_dir)  # the session renders its report with the predictions it copied at its start
    return run_dir


def attach_file(run_dir: Path, text: str, kind: str = "explanation", name: str = "my_explanation.md",
                structure: Optional[dict] = "check") -> dict:
    """Attach a file to a finished run as the addenda contract says attach does; returns its ledger entry."""
    run_dir = Path(run_dir)
    ledger = run_dir / addenda.LEDGER_FILE
    entries = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
    stored = name if not (run_dir / addenda.ADDENDA_DIR / name).exists() else \
        f"{Path(name).stem}.{len(entries) + 1}{Path(name).suffix}"
    (run_dir / addenda.ADDENDA_DIR).mkdir(exist_ok=True)
    data = text.encode("utf-8")
    (run_dir / addenda.ADDENDA_DIR / stored).write_bytes(data)
    if structure == "check":
        structure = writing.structure(text, TEMPLATE) if kind == "explanation" else None
    entry = {"schema": addenda.LEDGER_SCHEMA, "seq": len(entries), "kind": kind,
             "file": f"{addenda.ADDENDA_DIR}/{stored}", "original_name": name, "size": len(data),
             "sha256": hashlib.sha256(data).hexdigest(),
             "attached_utc": datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc).isoformat(),
             "manifest_sha256": sha256_file(run_dir / MANIFEST_FILE), "structure": structure,
             "tool": "inferlab attach"}
    with open(ledger, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")
    return entry


def add_tokenization_phases(records: list[dict]) -> list[dict]:
    """A tokenization phase record after each input record, as the experiment's input test writes it."""
    out = []
    for record in records:
        out.append(record)
        if record["kind"] == "input":
            out.append(_envelope("phase", record["test"], name="tokenization", prompt_id=record["prompt_id"],
                                 elapsed_s=1e-4, label="the tokenizer call alone"))
    return out


def build_honest_run(directory: Path, synthetic: bool = True, seed: int = 0, timing_seed=None,
                     base: Optional[Path] = None) -> Path:
    """A complete run with every record the checklist asks for and this checkout's source hashes, but no
    predictions and nothing attached (give_predictions and attach_file add those).

    base: a build_complete_run of the same specimen and seeds to start from, as build_rich_run takes it."""
    build_rich_run(directory, transform=add_tokenization_phases, synthetic=synthetic, seed=seed,
                   timing_seed=timing_seed, base=base)
    edit_manifest(directory, source_sha256=environment.source_hashes(REPO_ROOT))
    rerender(directory)  # its report as a session with these source hashes renders it (grade checks it)
    return Path(directory)


def submit_ready(directory: Path) -> Path:
    """An honest run with answered predictions and an attached, answered explanation."""
    give_predictions(directory, answered_predictions())
    attach_file(directory, answered_explanation())
    return directory


def verify_reads_addenda(run_dir: Path) -> bool:
    """Whether this checkout's verify knows the addenda layout (issue 23): a run with a ledger that the contract
    allows then verifies clean. Before that merge verify lists addenda.jsonl as a file the manifest does not
    list, so the tests that need a clean run with an attached explanation skip, saying so."""
    return not any(line.startswith((addenda.LEDGER_FILE, addenda.ADDENDA_DIR + "/"))
                   for line in verify_run(run_dir)["problems"])


def change_one_character(run_dir: Path) -> None:
    """Change one digit of the first generated id in records.jsonl (the manifest is left as it was)."""
    path = Path(run_dir) / RECORDS_FILE
    text = path.read_text()
    index = text.index('"generated_ids": [') + len('"generated_ids": [')
    path.write_text(text[:index] + ("1" if text[index] != "1" else "2") + text[index + 1:])


def rerun_elsewhere(source: Path, target: Path) -> Path:
    """Another honest run of the same specimen (built as `source` was, by build_honest_run) on another machine:
    the same ids and logits (the arithmetic is the same), timings of its own, another CPU in the manifest.
    (Scaling source's timings instead would be a forgery, and verify's consistency checks catch it.)"""
    run = build_honest_run(target, timing_seed=1370)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    edit_manifest(run, platform={**manifest["platform"], "cpu_model": "Another CPU"},
                  started_utc="2026-11-30T10:00:00+00:00")
    rerender(run)
    return run


# --- writing of a learner's own ----------------------------------------------------------------------------

# Two explanations written independently, one paragraph per answer heading of the template, on the same run.
ADA_PARAGRAPHS = [
    "I expected the greedy repeats to match, and records.jsonl seq 40 shows all three repetitions of P1 with the "
    "same ids, so argmax decoding on one machine is repeatable here.",
    "I thought two seeds could collide by chance; seq 52 and 53 drew different continuations for every pair of "
    "seeds, which fits a long sequence making an exact collision unlikely.",
    "I guessed temperature reshapes the whole distribution while top-p cuts its tail, and the sampling summary at "
    "seq 61 shows top-p keeping fewer distinct tokens than the cooler temperature.",
    "I predicted close but not identical logits; the cache comparison at seq 139 reports a maximum absolute "
    "difference far below the tolerance, with every argmax unchanged.",
    "I was unsure the cache would help such a small model; the timing summaries show the cached decode steps "
    "faster for the longer prompt P1x8 and barely different for P1.",
    "Parameter bytes leave out activations, the cache itself and the allocator's overhead, and the memory record "
    "at seq 180 lists the cache bytes growing with the prefix.",
    "Greedy selection is deterministic for a fixed model and input: the repeated trials agree id for id.",
    "Reusing keys and values saves recomputing the prefix, which matters more as the prompt grows.",
    "One run on one machine cannot say how the timing spreads across other processors.",
    "The constructed weights are not the trained model, so the texts say nothing about its quality.",
]
BEA_PARAGRAPHS = [
    "Before running I bet on identical outputs from repeated argmax decoding; the three P1 repetitions agree, "
    "which I read in the generation records near the top of the file.",
    "My guess was that distinct seeds always differ. Each seeded trial produced its own text, but nothing in the "
    "protocol forbids two of them meeting, it is only improbable.",
    "Lowering temperature sharpens every probability, lowering top-p removes the unlikely candidates outright; "
    "the distinct-token counts in the sampling summary bear this out.",
    "Bitwise equality was never likely because the cached path adds numbers in another order; the recorded "
    "differences are tiny and no greedy choice flipped.",
    "For a model this small the overhead of managing the cache could eat the gain, and for the short prompt the "
    "medians with and without it are nearly equal.",
    "A count of weights misses the intermediate tensors, Python's own objects and the key/value store, all "
    "visible in the memory section of the report.",
    "Choosing the most probable token leaves no room for chance, so the same inputs give the same ids.",
    "The first token costs a full pass over the prompt; later tokens with the cache cost one position each.",
    "Timing on a shared laptop mixes in whatever else was running, so small differences are not trustworthy.",
    "A single seed per condition shows what can happen, not how often it happens.",
]

_VOCABULARY = ("cache token seed logits prompt decode sample greedy faster slower memory bytes tensor model run "
               "record timing median interval prefix tail probability temperature nucleus argmax batch layer "
               "weights attention keys values step selection repeat differ agree tolerance rounding kernel thread "
               "machine noise spread quantile overhead allocation python process vocabulary entropy").split()


def own_words(seed: int, count: int) -> str:
    """`count` words drawn at random (seeded) from a small vocabulary of the lab: writing of a learner's own that
    shares no run of three words with another seed's, as independent writing would not."""
    import random

    draw = random.Random(seed)
    return " ".join(draw.choice(_VOCABULARY) for _ in range(count))


def written_explanation(paragraphs: list[str]) -> str:
    """The explanation template with paragraphs[k] under its k-th answer heading, in place of the guidance."""
    out, current, used = [], None, 0
    for line in TEMPLATE.splitlines():
        match = writing.HEADING.match(line)
        if match:
            current = match.group(2).strip() if len(match.group(1)) > 1 else None
            out.append(line)
            placed = False
        elif line.strip() and current is not None:
            if not placed:
                out.append(paragraphs[used % len(paragraphs)])
                used += 1
                placed = True
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def own_predictions(seed: int) -> str:
    """The predictions template with every field answered in words of the learner's own (own_words)."""
    lines = []
    for number, line in enumerate(PREDICTIONS_TEMPLATE.splitlines()):
        match = writing.FIELD.match(line)
        lines.append(f"{match.group(1)}: {own_words(seed * 1000 + number, 9)}" if match else line)
    return "\n".join(lines) + "\n"


def reworded(text: str, changes: dict, width: int = 60) -> str:
    """A near copy: each word of `changes` replaced by its value, and every paragraph wrapped anew at `width`
    (the headings kept), as one learner might hand in another's explanation."""
    import re
    import textwrap

    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            out.append(line)
            continue
        for old, new in changes.items():
            line = re.sub(rf"\b{re.escape(old)}\b", new, line, count=1)
        out += textwrap.wrap(line, width) or [""]
    return "\n".join(out) + "\n"
