"""report.md, rendered from a run's record directory alone (no model, no torch).

render_report() is a pure function of the files the session has written by its end:
records.jsonl, plan.json and the manifest fields that do not change at session end. So
`python -m inferlab report DIR` regenerates the session's text byte for byte. Missing
records (a failed or partial run) are shown as gaps with the reason taken from the test
outcomes; nothing here raises over a partial run.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

from inferlab import plots, protocol
from inferlab.records import MANIFEST_FILE, PLAN_FILE, PREDICTIONS_FILE, RECORDS_FILE, REPORT_FILE, write_text_atomic

MISSING = "(not recorded)"
SYNTHETIC_BANNER = "SYNTHETIC STAND-IN - NOT PYTHIA: outputs are noise by construction"
BASE_FIELDS = ("kind", "test", "seq", "wall_time")
LONG_VALUE_CHARS = 160
KEY_DISTRIBUTIONS = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub", "huggingface_hub",
                     "numpy", "matplotlib", "pytest")


# --- formatting ----------------------------------------------------------------------------


def code(text: str, in_table: bool = True) -> str:
    """An inline code span (backtick fence widened as needed); pipes escaped when it sits in a table cell."""
    if in_table:
        text = text.replace("|", "\\|")
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def jstr(value: Any) -> str:
    """A value as JSON in a code span, so strings show their quotes, whitespace and newlines."""
    return code(json.dumps(value, ensure_ascii=True, sort_keys=False))


def text_cell(text: Any) -> str:
    """Plain prose for a table cell: one line, pipes escaped."""
    if text is None:
        return MISSING
    return " ".join(str(text).split()).replace("|", "\\|")


def num(value: Any, digits: int = 6) -> str:
    """A number with `digits` significant digits; the placeholder for anything else."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else repr(value)
    if value is None:
        return "null"
    return text_cell(value)


def ms(seconds: Any) -> str:
    """Seconds shown as milliseconds with three decimals; the placeholder when absent."""
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        return f"{seconds * 1e3:.3f}"
    return MISSING if seconds is None else text_cell(seconds)


def nbytes(value: Any) -> str:
    """Bytes with thousands separators and MiB."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,} B ({value / 2**20:.2f} MiB)"
    return MISSING if value is None else text_cell(value)


def yes_no(value: Any) -> str:
    """yes / **no** for a check whose 'no' is a failure; the placeholder when absent."""
    if value is True:
        return "yes"
    if value is False:
        return "**no**"
    return MISSING if value is None else text_cell(value)


def flag(value: Any, alarm: bool = False) -> str:
    """yes/no where neither answer is a failure; alarm=True makes a 'yes' bold (a warning flag)."""
    if value is True:
        return "**yes**" if alarm else "yes"
    if value is False:
        return "no"
    return MISSING if value is None else text_cell(value)


def value_cell(value: Any, seq: Any = None) -> str:
    """Any record value for a table cell; long values are cut with a pointer to the full record."""
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=True)
        if len(text) > LONG_VALUE_CHARS:
            where = f"records.jsonl seq {seq}" if seq is not None else "the record"
            return code(text[:LONG_VALUE_CHARS]) + f" ... ({len(text)} chars; full value in {where})"
        return code(text)
    if isinstance(value, str):
        return jstr(value) if len(value) <= LONG_VALUE_CHARS else jstr(value[:LONG_VALUE_CHARS]) + \
            f" ... ({len(value)} chars; full value in records.jsonl seq {seq})"
    return num(value)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Markdown table lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def field_table(record: dict, skip: tuple = ()) -> list[str]:
    """Every field of a record but the common four, one row each."""
    rows = [[code(name), value_cell(value, record.get("seq"))] for name, value in record.items()
            if name not in BASE_FIELDS and name not in skip]
    return table(["field", "value"], rows) if rows else ["(no fields)"]


def pick(record: Optional[dict], *names: str, default: Any = MISSING) -> Any:
    """The first present field among `names` (records may name a field either way)."""
    if record is None:
        return default
    for name in names:
        if name in record:
            return record[name]
    return default


def first_line(text: Optional[str]) -> str:
    """The first 'E ' message line of a pytest longrepr, else its last non-empty line."""
    if not text:
        return ""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    messages = [line.strip()[1:].strip() for line in lines if line.lstrip().startswith("E ")]
    return (messages[0] if messages else lines[-1])[:300]


# --- the run as the report sees it --------------------------------------------------------------


class RunView:
    """Records, plan and the stable part of the manifest, read without raising over damage."""

    def __init__(self, record_dir: Path):
        self.dir = Path(record_dir)
        self.records: list[dict] = []
        self.read_problems: list[str] = []
        try:
            with open(self.dir / RECORDS_FILE, encoding="ascii", errors="replace") as handle:
                for number, line in enumerate(handle, start=1):
                    try:
                        record = json.loads(line)
                    except ValueError as error:
                        self.read_problems.append(f"{RECORDS_FILE}:{number}: not a JSON object ({error})")
                        continue
                    if isinstance(record, dict):
                        self.records.append(record)
                    else:
                        self.read_problems.append(f"{RECORDS_FILE}:{number}: not a JSON object")
        except OSError as error:
            self.read_problems.append(f"{RECORDS_FILE}: not readable ({error})")
        self.manifest = self._json(MANIFEST_FILE) or {}
        self.plan = self._json(PLAN_FILE)
        self.by_kind: dict[str, list[dict]] = collections.defaultdict(list)
        for record in self.records:
            self.by_kind[str(record.get("kind"))].append(record)
        self.outcomes = self.by_kind["test_outcome"]
        # Short labels (F1, R1, ...) let a long failure or skip reason be printed once, in section 1.
        self.labels: dict[str, str] = {}
        counters = collections.Counter()
        for record in self.outcomes:
            if record.get("outcome") in ("failed", "error"):
                key, prefix = f"seq:{record.get('seq')}", "F"
            elif record.get("outcome") == "skipped":
                key, prefix = f"reason:{skip_text(record)}", "R"
            else:
                continue
            if key not in self.labels:
                counters[prefix] += 1
                self.labels[key] = f"{prefix}{counters[prefix]}"

    def _json(self, name: str) -> Optional[dict]:
        path = self.dir / name
        if not path.exists():
            self.read_problems.append(f"{name}: missing")
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            self.read_problems.append(f"{name}: not readable JSON ({error})")
            return None
        return data if isinstance(data, dict) else None

    def kind(self, name: str) -> list[dict]:
        """The records of one kind, in write order."""
        return self.by_kind.get(name, [])

    def outcome_of_param(self, test_id: str) -> Optional[dict]:
        """The decisive outcome of the test whose parametrize id is `test_id` (a non-passing one wins)."""
        matches = [r for r in self.outcomes if _bracket(r.get("test")) == test_id]
        failing = [r for r in matches if r.get("outcome") != "passed"]
        return (failing or matches or [None])[0]

    def outcome_of_test(self, nodeid: Optional[str]) -> Optional[dict]:
        """The decisive outcome of one test node id (a non-passing one wins)."""
        matches = [r for r in self.outcomes if r.get("test") == nodeid]
        failing = [r for r in matches if r.get("outcome") != "passed"]
        return (failing or matches or [None])[0]

    def brief(self, record: Optional[dict]) -> str:
        """A non-passing outcome by its label in section 1 ('skipped, reason R1'); 'passed' otherwise."""
        if record is None:
            return "no test outcome recorded"
        outcome = record.get("outcome")
        if outcome == "skipped":
            return f"skipped, reason {self.labels.get('reason:' + skip_text(record), '?')} (section 1)"
        if outcome in ("failed", "error"):
            label = self.labels.get(f"seq:{record.get('seq')}", "?")
            return f"{short_test(record.get('test'))} {outcome}, {label} (section 1)"
        return str(outcome)

    def gap_reason(self, words: tuple) -> str:
        """Why a kind of record is absent: the first non-passing test whose id holds one of the words."""
        for record in self.outcomes:
            if record.get("outcome") != "passed" and any(w in test_file(record.get("test")) for w in words):
                return self.brief(record)
        return "no record, and no failed or skipped test explains it"

    @property
    def synthetic(self) -> bool:
        """Whether any record or the manifest's specimen says the specimen is synthetic."""
        if any(r.get("synthetic") is True for r in self.records):
            return True
        specimen = self.manifest.get("specimen")
        return specimen == "standin" or (isinstance(specimen, dict) and specimen.get("synthetic") is True)


def test_file(nodeid: Optional[str]) -> str:
    """The file part of a node id, lower-cased ('experiments/test_40_cache.py')."""
    return (nodeid or "").split("::")[0].lower()


def _bracket(nodeid: Optional[str]) -> Optional[str]:
    if not nodeid or not nodeid.endswith("]") or "[" not in nodeid:
        return None
    return nodeid[nodeid.index("[") + 1:-1]


def skip_text(record: dict) -> str:
    """A skipped test's reason, from skip_reason or else its longrepr."""
    return record.get("skip_reason") or first_line(record.get("longrepr")) or "(no reason recorded)"


def specimen_label(specimen: Any) -> str:
    """The manifest's specimen (a spec dict, or a bare name in older runs) as one table cell."""
    if isinstance(specimen, dict):
        return text_cell(f"{specimen.get('name', MISSING)}: {specimen.get('repo_id', MISSING)} at revision "
                         f"{specimen.get('revision', MISSING)}")
    return text_cell(specimen)


def lengths(value: Any) -> str:
    """A token length, or a list of lengths (summaries list the distinct ones), as a cell."""
    if isinstance(value, list):
        return "/".join(num(v) for v in value) if value else MISSING
    return num(value)


def short_test(nodeid: Optional[str]) -> str:
    """The test name with its parameters, without the file."""
    return (nodeid or "(session)").split("::")[-1]


# --- sections ------------------------------------------------------------------------------


def _section_header(view: RunView) -> list[str]:
    lines = ["# inferlab run report", ""]
    if view.synthetic:
        lines += [f"> **{SYNTHETIC_BANNER}.**", "> The specimen of this run is a synthetic checkpoint with "
                  "pythia-14m's architecture and seeded random weights. Nothing here describes Pythia; the "
                  "generated text is noise and says nothing about any trained model.", ""]
    lines += [
        "This report is rendered from this directory's records alone: `records.jsonl` (one JSON object per line), "
        "`plan.json`, `manifest.json` and `tensors/*.safetensors`. `python -m inferlab report DIR` regenerates it "
        "without a model; `python -m inferlab verify DIR` re-hashes every file and checks the records are complete.",
        "",
        "How to read it: section 1 says whether the run is usable at all; sections 3-6 show what exactly ran "
        "and what the model received; sections 7-9 are token *selection*; sections 10-11 are *computation* "
        "(the cache and the time it takes); section 16 lists where each item of the submission checklist "
        "lives. Record numbers (`seq N`) point into `records.jsonl`.",
        "",
    ]
    return lines


def _section_status(view: RunView) -> list[str]:
    lines = ["## 1. Run status", ""]
    counts = collections.Counter(r.get("outcome") for r in view.outcomes)
    planned = (view.plan or {}).get("schedule") or []
    with_outcome = {r.get("test") for r in view.outcomes}
    not_reached = [e.get("test") for e in planned if e.get("test") not in with_outcome]
    rows = [
        ["specimen", specimen_label(view.manifest.get("specimen", MISSING))
         + (" (synthetic)" if view.synthetic else "")],
        ["tests planned (plan.json)", str(len(planned)) if view.plan else MISSING],
        ["tests with a recorded outcome", str(len(with_outcome))],
        ["outcomes", ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda i: str(i[0])))
         or "no test outcome recorded"],
        ["planned but no outcome (run stopped early?)", str(len(not_reached))],
        ["plan cap violations", text_cell("; ".join((view.plan or {}).get("cap_violations") or []) or "none")],
        ["plan shortfalls (not the complete protocol)",
         text_cell("; ".join((view.plan or {}).get("shortfalls") or []) or "none")],
        ["records", f"{len(view.records)} in {RECORDS_FILE}"],
    ]
    lines += table(["", ""], rows)
    verdict = "every test passed" if counts and set(counts) == {"passed"} else "**not every test passed**: see below"
    lines += ["", f"Verdict from the test outcomes: {verdict}. The manifest's `complete` flag, exit status and "
              "file hashes are written after this report; `python -m inferlab verify DIR` checks them.", ""]
    for problem in view.read_problems:
        lines.append(f"- reading problem: {text_cell(problem)}")
    if view.read_problems:
        lines.append("")
    failures = [r for r in view.outcomes if r.get("outcome") in ("failed", "error")]
    if failures:
        lines += ["### Failed tests", ""]
        lines += table(["label", "test", "phase", "outcome", "message (first line; full longrepr at the seq)", "seq"],
                       [[view.labels.get(f"seq:{r.get('seq')}", "?"), code(r.get("test") or "(session)"),
                         text_cell(r.get("phase")), str(r.get("outcome")), text_cell(first_line(r.get("longrepr"))),
                         str(r.get("seq"))] for r in failures])
        lines.append("")
    skipped = [r for r in view.outcomes if r.get("outcome") == "skipped"]
    if skipped:
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for record in skipped:
            groups[skip_text(record)].append(short_test(record.get("test")))
        lines += ["### Did not run", ""]
        lines += table(["label", "reason", "tests", "which"],
                       [[view.labels.get(f"reason:{reason}", "?"), text_cell(reason), str(len(tests)),
                         text_cell(", ".join(tests))] for reason, tests in groups.items()])
        lines.append("")
    if not_reached:
        lines += ["### Planned but never reached", "", text_cell(", ".join(map(str, not_reached))), ""]
    for record in view.kind("report_error"):
        lines += [f"- an earlier report attempt failed (seq {record.get('seq')}): {text_cell(record.get('error'))}"]
    return lines


def _section_predictions(view: RunView) -> list[str]:
    lines = ["## 2. Predictions (Part 1)", ""]
    predictions = view.manifest.get("predictions")
    if isinstance(predictions, dict) and predictions.get("supplied"):
        lines.append(f"Supplied, see [{PREDICTIONS_FILE}]({PREDICTIONS_FILE}) (sha256 "
                     f"{code(str(predictions.get('sha256', MISSING)), in_table=False)}, source modified "
                     f"{text_cell(predictions.get('source_mtime_utc'))}, copied "
                     f"{text_cell(predictions.get('copied_at_utc'))}, before any model computation). "
                     "This report never edits them; the interpretation belongs in section 17.")
    elif isinstance(predictions, dict):
        lines.append("No predictions were supplied (`--predictions FILE`). Part 1 asks for them before any output "
                     "is seen; a later copy is hindsight and must say so.")
    else:
        lines.append(f"{MISSING}: the manifest has no predictions entry.")
    return lines + [""]


def _section_environment(view: RunView) -> list[str]:
    manifest = view.manifest
    platform = manifest.get("platform") or {}
    distributions = manifest.get("distributions") or {}
    git = manifest.get("git") or {}
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
        ["command line", jstr(manifest.get("command_line", MISSING))],
        ["thread environment", jstr(manifest.get("thread_environment", MISSING))],
        ["started (UTC)", text_cell(manifest.get("started_utc"))],
    ]
    for record in view.kind("thread_controls"):
        rows.append([f"torch threads (seq {record.get('seq')})",
                     f"requested {jstr(record.get('requested'))}, effective {jstr(record.get('effective'))}"])
    lines = ["## 3. Environment and versions", ""] + table(["", ""], rows) + ["", "Deviations from the reference:", ""]
    deviations = manifest.get("deviations_from_reference")
    if deviations is None:
        lines.append(f"- {MISSING}")
    lines += [f"- {text_cell(d)}" for d in deviations or []] or ["- none"]
    return lines + [""]


def acquisition_status(record: dict) -> str:
    """An acquisition's status field, or its ok flag in words."""
    if "status" in record:
        return text_cell(record["status"])
    return {True: "ok", False: "**failed**"}.get(record.get("ok"), MISSING)


def _section_artifacts(view: RunView) -> list[str]:
    lines = ["## 4. Specimen and artifacts", ""]
    for record in view.kind("specimen"):
        lines += field_table(record) + [""]
    acquisitions = view.kind("artifact_acquisition")
    if acquisitions:
        lines += table(["acquisition", "directory", "elapsed (s)", "status", "error"],
                       [[code(str(pick(r, "acquisition"))), jstr(pick(r, "directory")), num(pick(r, "elapsed_s")),
                         acquisition_status(r), text_cell(pick(r, "error", default=None) or "none")]
                        for r in acquisitions])
        lines += ["", "Local reuse is never a download: the acquisition column says which way ran (local reuse, project cache, download, or the stand-in built offline).", ""]
    else:
        lines += [f"No artifact_acquisition record: {text_cell(view.gap_reason(('specimen', 'artifact')))}", ""]
    files = {r.get("name"): r for r in view.kind("artifact_file")}
    rows = []
    for name in list(protocol.ALLOWLISTED_FILES) + sorted(n for n in files if n not in protocol.ALLOWLISTED_FILES):
        r = files.get(name)
        if r is None:
            rows.append([code(str(name)), MISSING, MISSING, MISSING, MISSING, MISSING, MISSING, MISSING])
            continue
        rows.append([code(str(name)), num(pick(r, "size")), code(str(pick(r, "sha256"))),
                     code(str(pick(r, "expected_sha256"))), num(pick(r, "expected_size")), yes_no(pick(r, "ok")),
                     code(str(pick(r, "acquisition"))), text_cell(pick(r, "problem"))])
    for record in view.kind("artifact_directory"):
        lines += [f"`artifact_directory` (seq {record.get('seq')}):", ""] + field_table(record) + [""]
    lines += [f"Artifact files ({len(files)} of {len(protocol.ALLOWLISTED_FILES)} recorded):", ""]
    lines += table(["file", "size (B)", "sha256", "expected sha256", "expected size", "ok", "acquisition", "problem"],
                   rows)
    return lines + [""]


CONFIG_FIELDS = ("model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers",
                 "num_attention_heads", "intermediate_size", "rotary_pct", "rotary_emb_base", "use_parallel_residual",
                 "tie_word_embeddings", "max_position_embeddings", "bos_token_id", "eos_token_id", "dtype",
                 "torch_dtype", "attn_implementation", "_attn_implementation")


def details(summary: str, body: list[str]) -> list[str]:
    """A collapsed HTML block around Markdown lines (blank lines keep tables rendering inside it)."""
    return [f"<details><summary>{summary}</summary>", ""] + body + ["", "</details>", ""]


def _section_model(view: RunView) -> list[str]:
    lines = ["## 5. Model load and inspection", ""]
    for kind in ("model_load", "model_inspection"):
        records = view.kind(kind)
        if not records:
            lines += [f"No {kind} record: {text_cell(view.gap_reason(('specimen', 'load', 'model')))}", ""]
        for record in records:
            config, parameters = record.get("config"), record.get("parameters")
            lines += [f"`{kind}` (seq {record.get('seq')}):", ""]
            lines += field_table(record, skip=("config", "parameters") if kind == "model_inspection" else ()) + [""]
            if kind == "model_inspection" and isinstance(parameters, list):
                devices = sorted({str(p.get("device")) for p in parameters if isinstance(p, dict)})
                dtypes = sorted({str(p.get("dtype")) for p in parameters if isinstance(p, dict)})
                lines += [f"Parameters: {len(parameters)} named tensors; devices {', '.join(devices)}; dtypes "
                          f"{', '.join(dtypes)} (every name, shape, device and dtype in records.jsonl seq "
                          f"{record.get('seq')}).", ""]
            if kind == "model_inspection" and isinstance(config, dict):
                lines += ["Config as loaded (main fields):", ""]
                lines += table(["field", "value"], [[code(k), value_cell(config[k], record.get("seq"))]
                                                    for k in CONFIG_FIELDS if k in config]) + [""]
                lines += details("the whole config as loaded",
                                 ["```json", json.dumps(config, ensure_ascii=True, indent=1), "```"])
    return lines


def _section_inputs(view: RunView) -> list[str]:
    lines = ["## 6. Inputs (what the model receives)", "",
             "Strings are JSON-escaped, so spaces, newlines and unusual characters are visible.", ""]
    inputs = {r.get("prompt_id"): r for r in view.kind("input")}
    expected = list(dict.fromkeys([*protocol.PROMPTS, *protocol.TIMING_PROMPTS]))
    for prompt_id in expected + sorted((p for p in inputs if p not in expected), key=str):
        record = inputs.get(prompt_id)
        lines += [f"### {prompt_id}", ""]
        if record is None:
            lines += [f"Not recorded: {text_cell(view.brief(view.outcome_of_param(str(prompt_id))))}", ""]
            continue
        rows = [[code("source"), jstr(pick(record, "source"))],
                [code("serialized"), jstr(pick(record, "serialized"))],
                [code("serialized_matches_source"), yes_no(pick(record, "serialized_matches_source", default=None))],
                [code("length"), num(pick(record, "length"))],
                [code("token_ids"), jstr(pick(record, "token_ids"))],
                [code("token_pieces"), jstr(pick(record, "token_pieces"))],
                [code("attention_mask"), jstr(pick(record, "attention_mask"))]]
        shown = {"source", "serialized", "serialized_matches_source", "length", "token_ids", "token_pieces",
                 "attention_mask"}
        rows += [[code(k), value_cell(v, record.get("seq"))] for k, v in record.items()
                 if k not in shown and k not in BASE_FIELDS]
        lines += table(["field", "value"], rows) + [""]
    return lines


def _generation_records(view: RunView) -> dict:
    return {(r.get("prompt_id"), r.get("condition"), r.get("seed"), r.get("repetition")): r
            for r in view.kind("generation")}


def _section_generation(view: RunView) -> list[str]:
    lines = ["## 7. Generation trials (Part 3)", "",
             f"Each trial is one `generate()` call, at most {protocol.MAX_NEW_TOKENS} new tokens, normal EOS stopping. "
             "`text` is decoded with special tokens hidden and shown as a JSON string; `text_with_special` is in the "
             "record. Do not read truthfulness or quality into these continuations.", ""]
    if view.synthetic:
        lines += [f"**{SYNTHETIC_BANNER}.**", ""]
    records = _generation_records(view)
    rows = []
    for trial in protocol.generation_trials():
        record = records.pop((trial.prompt_id, trial.condition, trial.seed, trial.repetition), None)
        if record is None:
            rows.append([str(trial.index + 1), code(trial.test_id), "not run: " +
                         text_cell(view.brief(view.outcome_of_param(trial.test_id)))] + [MISSING] * 4)
            continue
        outcome = view.outcome_of_test(record.get("test"))
        status = text_cell(pick(record, "status"))
        if outcome is not None and outcome.get("outcome") != "passed":
            status += "; test " + text_cell(view.brief(outcome))
        rows.append([str(trial.index + 1), code(trial.test_id), status, num(pick(record, "generated_length")),
                     text_cell(pick(record, "stop_reason")), jstr(pick(record, "generated_ids")),
                     jstr(pick(record, "text"))])
    lines += table(["#", "trial", "status", "new tokens", "stop", "generated ids", "text"], rows)
    if records:
        lines += ["", f"{len(records)} generation record(s) match no trial of the protocol: "
                  + ", ".join(f"seq {r.get('seq')}" for r in records.values())]
    return lines + [""]


def _section_repeatability(view: RunView) -> list[str]:
    lines = ["## 8. Repeatability (Part 3 summary)", ""]
    records = _generation_records(view)
    rows = []
    for prompt_id in protocol.PROMPTS:
        greedy = [records.get((prompt_id, "G", None, rep)) for rep in range(1, protocol.GREEDY_REPETITIONS + 1)]
        greedy_ids = [r.get("generated_ids") for r in greedy if r is not None]
        identical = (len(greedy_ids) == protocol.GREEDY_REPETITIONS and all(i == greedy_ids[0] for i in greedy_ids))
        first = records.get((prompt_id, protocol.RERUN_CONDITION, protocol.RERUN_SEED, 1))
        rerun = records.get((prompt_id, protocol.RERUN_CONDITION, protocol.RERUN_SEED, 2))
        rerun_same = (first.get("generated_ids") == rerun.get("generated_ids")) if first and rerun else None
        rows.append([prompt_id, "G repetitions identical",
                     f"{yes_no(identical) if len(greedy_ids) == protocol.GREEDY_REPETITIONS else MISSING} "
                     f"({len(greedy_ids)} of {protocol.GREEDY_REPETITIONS} recorded)"])
        rows.append([prompt_id, f"{protocol.RERUN_CONDITION} seed {protocol.RERUN_SEED}: first run vs rerun identical",
                     yes_no(rerun_same)])
        for condition in protocol.CONDITIONS:
            # every greedy repetition, but only the first run of each seed (the rerun is its own check)
            runs = [r for (p, c, _, rep), r in records.items()
                    if p == prompt_id and c == condition and (condition == "G" or rep == 1)]
            ids = [json.dumps(r.get("generated_ids")) for r in runs]
            early = sum(1 for r in runs if r.get("stop_reason") == "eos")
            rows.append([prompt_id, f"{condition}: distinct continuations / early EOS",
                         f"{len(set(ids))} distinct of {len(runs)} recorded; {early} stopped at EOS"])
    lines += table(["prompt", "check", "result"], rows)
    lines += ["", "Computed by the report from the generation records (the S1 rerun is left out of the distinct "
              "count). Three seeds neither estimate the output distribution nor pick a best temperature; different "
              "seeds may select the same tokens.", ""]
    for record in view.kind("sampling_summary"):
        lines += [f"`sampling_summary` as recorded (seq {record.get('seq')}):", ""] + field_table(record) + [""]
    if not view.kind("sampling_summary"):
        lines += [f"No sampling_summary record: {text_cell(view.gap_reason(('sampling', 'generation')))}", ""]
    return lines


def _section_first_step(view: RunView) -> list[str]:
    lines = ["## 9. First-step logit equality", "",
             "Selection settings act after the network: for one prompt, the raw first-step logits (`output_logits`, "
             "not the processed `scores`) should agree across the four conditions.", ""]
    rows = []
    for record in view.kind("generation"):
        ref = record.get("first_step_logits")
        if isinstance(ref, dict):
            rows.append([code(_bracket(record.get("test")) or str(record.get("seq"))), code(str(ref.get("file"))),
                         code(str(ref.get("key"))), jstr(ref.get("shape")), text_cell(ref.get("dtype")),
                         code(str(ref.get("sha256")))])
    lines += table(["trial", "file", "key", "shape", "dtype", "sha256"], rows) if rows else \
        ["No first-step logits were saved."]
    lines.append("")
    checks = view.kind("first_step_logits_check")
    rows = []
    for record in checks:
        comparisons = record.get("comparisons")
        if isinstance(comparisons, dict):
            for condition, stats in comparisons.items():
                stats = stats if isinstance(stats, dict) else {}
                rows.append([text_cell(record.get("prompt_id")), f"{text_cell(condition)} vs "
                             f"{text_cell(record.get('reference'))}", num(stats.get("max_abs_diff")),
                             num(stats.get("fail_fraction")), flag(stats.get("bitwise_equal")),
                             yes_no(stats.get("passed"))])
    if rows:
        tolerance = str(pick(checks[0], "tolerance", default=protocol.CACHE_TOLERANCE.describe()))
        lines += [f"Raw first-step logits, each condition against the reference, under "
                  f"{code(tolerance, in_table=False)}:", ""]
        lines += table(["prompt", "condition", "max abs diff", "fail fraction", "bitwise equal", "within tolerance"],
                       rows) + [""]
    rows = []
    for record in view.kind("processed_scores_check"):
        per_condition = record.get("rows")
        if isinstance(per_condition, dict):
            for condition, row in per_condition.items():
                row = row if isinstance(row, dict) else {}
                stats = row.get("scores_vs_raw") if isinstance(row.get("scores_vs_raw"), dict) else {}
                difference = stats.get("max_abs_diff")
                rows.append([text_cell(record.get("prompt_id")), text_cell(condition), num(row.get("temperature")),
                             "not finite (null in the record)" if difference is None else num(difference),
                             flag(stats.get("bitwise_equal"))])
    if rows:
        lines += ["Processed scores (after the logits processors) against the raw logits of the same step; they "
                  "should differ where the temperature is not 1:", ""]
        lines += table(["prompt", "condition", "temperature", "max abs diff scores vs raw", "bitwise equal"],
                       rows) + [""]
    for record in checks + view.kind("processed_scores_check"):
        if not isinstance(record.get("comparisons", record.get("rows")), dict):
            lines += [f"`{record.get('kind')}` (seq {record.get('seq')}):", ""] + field_table(record) + [""]
    if not view.kind("first_step_logits_check"):
        lines += [f"No first_step_logits_check record: "
                  f"{text_cell(view.gap_reason(('sampling', 'generation', 'logit')))}", ""]
    return lines


def _plot_block(view: RunView, section: str, written: dict) -> list[str]:
    lines = []
    for spec in plots.plot_specs(view.records):
        if spec["section"] != section:
            continue
        error = written.get(spec["name"])
        if not spec["available"]:
            lines.append(f"Plot not drawn ({spec['title']}): {spec['reason']}.")
        elif error:
            lines.append(f"Plot could not be drawn ({spec['title']}): {text_cell(error)}.")
        else:
            lines.append(f"![{spec['title']}]({spec['file']})")
        lines.append("")
    return lines


def _section_cache(view: RunView, written: dict) -> list[str]:
    lines = ["## 10. Cache: matched prefixes (Part 4)", ""]
    criteria = view.kind("cache_criterion")
    comparisons = view.kind("cache_comparison")
    if criteria:
        first_comparison = min((r.get("seq", 0) for r in comparisons), default=None)
        rule = str(pick(criteria[0], "criterion", "rule", default=protocol.CACHE_TOLERANCE.describe()))
        before = f" before the first comparison (seq {first_comparison})" if first_comparison is not None else ""
        lines.append(f"Criterion, declared in seq {criteria[0].get('seq')}{before}: {code(rule, in_table=False)}.")
    else:
        lines.append(f"No cache_criterion record; the protocol's criterion is "
                     f"{code(protocol.CACHE_TOLERANCE.describe(), in_table=False)}.")
    lines += ["", f"A prefix is flagged near a tie when its top-two margin is below {protocol.NEAR_TIE_FACTOR:g} x its "
              "max abs diff: there a small numerical difference can flip the argmax. Numerical agreement "
              "(max abs diff, fail fraction) and token-choice agreement (argmax) are separate columns.", ""]
    if comparisons:
        rows = [[num(pick(r, "prefix_length")), num(pick(r, "max_abs_diff")), num(pick(r, "fail_fraction")),
                 flag(pick(r, "bitwise_equal")), num(pick(r, "argmax_cached")), num(pick(r, "argmax_uncached")),
                 yes_no(pick(r, "argmax_cached") == pick(r, "argmax_uncached")),
                 num(pick(r, "top2_margin", "top2_margin_uncached")), flag(pick(r, "near_tie"), alarm=True),
                 yes_no(pick(r, "passed"))] for r in comparisons]
        lines += table(["prefix length", "max abs diff", "fail fraction", "bitwise equal", "argmax cached",
                        "argmax uncached", "argmax agree", "top-2 margin (uncached)", "near tie", "passed"], rows)
    else:
        lines.append(f"No cache_comparison record: {text_cell(view.gap_reason(('cache',)))}")
    lines.append("")
    lines += _plot_block(view, "cache", written)
    for kind in ("cache_summary", "cache_inspection", "cache_divergence"):
        for record in view.kind(kind):
            lines += [f"`{kind}` (seq {record.get('seq')}):", ""] + field_table(record) + [""]
        if not view.kind(kind):
            lines += [f"No {kind} record: {text_cell(view.gap_reason(('cache',)))}", ""]
    return lines


def _throughput(record: dict) -> Any:
    from inferlab.summaries import throughput_including_prompt

    times = pick(record, "token_times", "token_times_s", default=None)
    if isinstance(times, list) and times and all(isinstance(t, (int, float)) for t in times):
        try:
            return throughput_including_prompt(times)
        except ValueError as error:
            return f"invalid times: {error}"
    return None


def _section_timing(view: RunView, written: dict) -> list[str]:
    lines = ["## 11. Timing (Part 5)", "",
             f"**Stopping rule of this profiling workload:** {protocol.TIMING_STOPPING_RULE}. Its generated ids are "
             "execution samples, not responses, so no text of them is shown.", "",
             "Boundaries, all on `time.perf_counter_ns` from `t_start`: prefill ends when next-token logits exist; "
             "local TTFT ends at the first selection (prefill + selection, no loading or tokenization); mean "
             f"post-first-token interval = (t{protocol.TIMING_NEW_TOKENS} - t1)/{protocol.TIMING_NEW_TOKENS - 1}; "
             f"throughput = {protocol.TIMING_NEW_TOKENS}/(t{protocol.TIMING_NEW_TOKENS} - t0) and includes prompt "
             "processing (its reciprocal is not an inter-token latency). Warmups are listed but not summarised.", ""]
    records = {r.get("schedule_index"): r for r in view.kind("timing_trial")}
    rows = []
    for planned in protocol.timing_schedule():
        record = records.get(planned.schedule_index)
        if record is None:
            rows.append([str(planned.schedule_index), code(planned.test_id), "not run: " +
                         text_cell(view.brief(view.outcome_of_param(planned.test_id)))] + [MISSING] * 9)
            continue
        ids = pick(record, "generated_ids", default=None)
        role = "warmup" if record.get("warmup") else "measured"
        rows.append([str(planned.schedule_index), code(planned.test_id), role,
                     num(pick(record, "prompt_length")), num(len(ids) if isinstance(ids, list) else MISSING),
                     ms(pick(record, "prefill_s", default=None)), ms(pick(record, "ttft_s", default=None)),
                     ms(pick(record, "mean_post_first_interval_s", default=None)),
                     ms(pick(record, "loop_s", default=None)), num(_throughput(record), 5),
                     jstr(pick(record, "eos_positions"))])
    lines += table(["#", "trial", "role", "prompt len", "output len", "prefill ms", "TTFT ms",
                    "mean post-first ms", "loop ms", "tok/s incl. prompt", "EOS at"], rows)
    lines.append("")
    summaries = view.kind("timing_summary")
    if summaries:
        lines += ["Summaries over the measured trials (all values listed; ms unless noted):", ""]
        rows = []
        for record in summaries:
            for metric, label, scale in (("prefill_s", "prefill", ms), ("ttft_s", "local TTFT", ms),
                                         ("mean_post_first_interval_s", "mean post-first interval", ms),
                                         ("loop_s", "loop", ms), ("throughput_tok_s", "throughput tok/s", num)):
                stats = record.get(metric)
                if not isinstance(stats, dict):
                    rows.append([text_cell(record.get("prompt_id")), lengths(record.get("prompt_length")),
                                 "on" if record.get("use_cache") else "off", lengths(record.get("output_length")),
                                 label] + [MISSING] * 4)
                    continue
                values = stats.get("values") or []
                rows.append([text_cell(record.get("prompt_id")), lengths(record.get("prompt_length")),
                             "on" if record.get("use_cache") else "off", lengths(record.get("output_length")), label,
                             scale(stats.get("median")), scale(stats.get("min")), scale(stats.get("max")),
                             ", ".join(scale(v) for v in values)])
        lines += table(["prompt", "prompt len", "cache", "output len", "metric", "median", "min", "max",
                        "all values"], rows)
        conventions = sorted({str(r.get("throughput_convention")) for r in summaries if r.get("throughput_convention")})
        lines += [""] + [f"Throughput convention: {text_cell(c)}." for c in conventions] + [""]
    else:
        lines += [f"No timing_summary record: {text_cell(view.gap_reason(('timing',)))}", ""]
    lines += _plot_block(view, "timing", written)
    for record in view.kind("loop_vs_generate"):
        lines += [f"`loop_vs_generate` (seq {record.get('seq')}):", ""] + field_table(record) + [""]
    phases = view.kind("phase")
    if phases:
        lines += ["Phases timed separately:", ""]
        lines += table(["phase", "elapsed (s)", "label", "test"],
                       [[text_cell(pick(r, "name")), num(pick(r, "elapsed_s")), text_cell(pick(r, "label")),
                         code(short_test(r.get("test")))] for r in phases])
        lines.append("")
    return lines


def _unmeasured(view: RunView) -> list[str]:
    found = []
    for record in view.kind("memory"):
        for name, value in record.items():
            if "unmeasured" in name or (record.get("measure") == "unmeasured" and name == "categories"):
                items = value.items() if isinstance(value, dict) else ((v, "") for v in value or [])
                for category, why in items:
                    line = f"{category}: {why}" if why else str(category)
                    if line not in found:
                        found.append(line)
    return found


def _rss_entries(value: Any, where: str) -> list[tuple[str, dict]]:
    """(label, entry) for every {bytes, meaning, ...} RSS entry inside a memory record field."""
    if not isinstance(value, dict):
        return []
    found = []
    for name in ("current_rss", "peak_rss"):
        entry = value.get(name)
        if isinstance(entry, dict) and "bytes" in entry:
            found.append((f"{where} {name}".strip(), entry))
    return found


def _memory_rows(record: dict) -> list[list[str]]:
    """Table rows for one memory record: tensor payloads with their expected value, RSS with its semantics."""
    seq = str(record.get("seq"))
    measure = text_cell(pick(record, "measure", "what", default=None) or "memory")
    rows = []
    if "unique_bytes" in record:
        expected = pick(record, "expected_bytes", "analytic_bytes_fp32", "analytic_bytes", default=None)
        check = MISSING if expected is None else (
            f"{nbytes(expected)} {'matches' if expected == record['unique_bytes'] else '**differs**'}")
        rows.append([measure, text_cell(pick(record, "point", "prompt_id", default="-")),
                     nbytes(record["unique_bytes"]), check, text_cell(pick(record, "what", "note", default="")), seq])
    entries = _rss_entries(record, "")
    for name in ("baseline", "now", "after", "before"):
        entries += _rss_entries(record.get(name), name)
    for label, entry in entries:
        rows.append([measure, text_cell(label), nbytes(entry.get("bytes")), "-",
                     text_cell(f"{entry.get('meaning', MISSING)}; {entry.get('tool', MISSING)} "
                               f"{entry.get('source_field', '')}, reported in {entry.get('units_reported', MISSING)}"),
                     seq])
    return rows


def _section_memory(view: RunView) -> list[str]:
    lines = ["## 12. Memory (Part 6)", "",
             "Tensor payloads (parameters, cache) are unique storage bytes, not process memory. Process RSS is "
             "process-wide; a peak is a lifetime high-water mark and isolates no cache increment.", ""]
    records = view.kind("memory")
    if not records:
        lines += [f"No memory record: {text_cell(view.gap_reason(('memory',)))}", ""]
    rows = [row for record in records for row in _memory_rows(record)]
    if rows:
        lines += table(["measure", "at", "bytes", "check (expected / analytic)", "meaning", "seq"], rows) + [""]
    detail = []
    for record in records:
        detail += [f"`memory` (seq {record.get('seq')}):", ""] + field_table(record) + [""]
    if detail:
        lines += details("every memory record's fields", detail)
    unmeasured = _unmeasured(view)
    lines += ["Unmeasured categories:", ""]
    lines += [f"- {text_cell(u)}" for u in unmeasured] or ["- (no memory record lists its unmeasured categories)"]
    return lines + [""]


def _section_batching(view: RunView) -> list[str]:
    lines = ["## 13. Batching (optional extension)", ""]
    records = view.kind("batching")
    if not records:
        outcomes = [r for r in view.outcomes if "batching" in test_file(r.get("test"))]
        reason = view.brief(outcomes[0]) if outcomes else "not selected in this run (e.g. -m \"not batching\")"
        return lines + [f"Not run: {text_cell(reason)}.", ""]
    lines += ["A correctness demonstration, not a throughput benchmark.", ""]
    for record in records:
        lines += [f"`batching` (seq {record.get('seq')}):", ""] + field_table(record) + [""]
    return lines


def _section_limitations(view: RunView) -> list[str]:
    inputs = {r.get("prompt_id"): r.get("length") for r in view.kind("input")}
    lengths = ", ".join(f"{p}: {n}" for p, n in inputs.items() if n is not None) or MISSING
    lines = ["## 14. Limitations", ""]
    if view.synthetic:
        lines.append("- The specimen is synthetic: its outputs are noise by construction, so nothing here describes "
                     "Pythia or any trained model; only the procedure and the computation checks carry over.")
    lines += [
        "- Timestamps add overhead: one `perf_counter_ns` per selection inside the timed loop, identical for both "
        "cache paths and not subtracted (`benchmarks/overhead.py` measures its size).",
        f"- A tiny CPU test: one small model, batch 1, {protocol.INTRA_OP_THREADS} intra-op thread, short prompts "
        f"(token lengths {lengths}). Nothing follows for larger models, GPUs, long contexts or concurrent serving.",
        f"- Three seeds ({', '.join(map(str, protocol.SEEDS))}) per sampling condition neither estimate the output "
        "distribution nor pick a best temperature.",
        "- Local TTFT has no network, queue or tokenization in it; it is not an end-user service benchmark.",
        "- Throughput includes prompt processing and is a median of per-run values; another convention gives "
        "another number.",
        "- The cache tolerance is a diagnostic for this backend and dtype, not a universal guarantee.",
        "- RSS figures are process-wide; a lifetime peak cannot be reset and does not isolate the cache's share.",
        "- The profiling workload keeps selecting after EOS; those ids are not responses.",
    ]
    for record in view.kind("cache_divergence"):
        lines.append(f"- Free-running cache-on and cache-off ids (seq {record.get('seq')}): "
                     f"{value_cell({k: v for k, v in record.items() if k not in BASE_FIELDS}, record.get('seq'))}; "
                     "where they diverge the timing comparison is not a strictly identical-prefix benchmark.")
    return lines + [""]


def _present(view: RunView, kind: str, at_least: int = 1) -> tuple[bool, str]:
    count = len(view.kind(kind))
    return count >= at_least, f"{kind} x{count}" + ("" if count >= at_least else f" (expected {at_least})")


def _section_checklist(view: RunView) -> list[str]:
    predictions = view.manifest.get("predictions") or {}
    generations = len(protocol.generation_trials())
    timing = len(protocol.timing_schedule())
    items = [
        ("Original predictions and a separate revised explanation",
         [(bool(predictions.get("supplied")), "no predictions were supplied"),
          (False, "the revised explanation is yours to write")],
         f"{PREDICTIONS_FILE} (copied before the run; sha256 in manifest.json); explanation: yours, separately "
         f"(section 17 scaffold)", True),
        ("Experiment source and hash/revision, exact commands, environment lock, hardware/thread record, warnings",
         [(bool(view.manifest.get("source_sha256")), "source hashes"),
          (bool(view.manifest.get("command_line")), "command line"),
          (bool(view.manifest.get("requirements_lock_sha256")), "lock hash"),
          (bool(view.manifest.get("platform")), "platform"), _present(view, "thread_controls")],
         "manifest.json (source_sha256, git, command_line, requirements_lock_sha256, platform, distributions); "
         "records.jsonl (thread_controls; warnings in model_load and generation)", False),
        ("Checkpoint revision, allowlisted file hashes and sizes, loading options, devices/dtypes, effective "
         "generation config",
         [_present(view, "specimen"), _present(view, "artifact_file", len(protocol.ALLOWLISTED_FILES)),
          _present(view, "model_load"), _present(view, "model_inspection"), _present(view, "generation")],
         "records.jsonl (specimen, artifact_file, model_load, model_inspection, generation.generation_config)", False),
        ("Exact source and serialized inputs, token ids, masks, seeds, stopping rules, output ids/text, all trial "
         "records",
         [_present(view, "input", 3), _present(view, "generation", generations)],
         "records.jsonl (input, generation); tensors/first_step_logits.safetensors", False),
        ("Cache-prefix alignment checks, tolerance, numerical errors, token agreement, cache shapes/bytes",
         [_present(view, "cache_criterion"), _present(view, "cache_comparison"), _present(view, "cache_summary"),
          _present(view, "cache_inspection")],
         "records.jsonl (cache_criterion, cache_comparison, cache_inspection, cache_summary); "
         "tensors/cache_logits.safetensors", False),
        ("Timing boundaries, schedule, warmups, all measured samples, declared summaries, unmeasured quantities",
         [(view.plan is not None, "plan.json"), _present(view, "timing_trial", timing),
          _present(view, "timing_summary", 4), _present(view, "memory")],
         "plan.json; records.jsonl (timing_trial, timing_summary, phase, memory); this report sections 11-12", False),
        ("One supported conclusion about selection, one about computation, two limitations",
         [(False, "to be written by the learner")], "yours; scaffold in section 17", True),
    ]
    rows = []
    for number, (item, checks, where, learner) in enumerate(items, start=1):
        missing = [label for ok, label in checks if not ok]
        if learner and len(missing) == 1 and len(checks) > 1:
            status = "recorded; learner: " + missing[0]
        elif learner and missing and len(checks) > 1:
            status = "**missing**: " + "; ".join(missing)
        elif learner and missing:
            status = "learner: " + "; ".join(missing)
        elif not missing:
            status = "recorded"
        elif len(missing) == len(checks):
            status = "**missing**: " + "; ".join(missing)
        else:
            status = "**partial**: missing " + "; ".join(missing)
        rows.append([str(number), text_cell(item), status, text_cell(where)])
    return ["## 16. Submission checklist", ""] + table(["#", "item", "status", "satisfied by"], rows) + [
        "", "A clear failure report with its evidence is preferable to invented timings or a silently changed "
        "checkpoint.", ""]


def _median_of(record: Optional[dict], metric: str) -> Any:
    stats = (record or {}).get(metric)
    return stats.get("median") if isinstance(stats, dict) else None


def _section_conclusions(view: RunView) -> list[str]:
    records = _generation_records(view)
    greedy = {p: [records.get((p, "G", None, r)) for r in range(1, protocol.GREEDY_REPETITIONS + 1)]
              for p in protocol.PROMPTS}
    greedy_same = {p: all(g is not None for g in runs) and len({json.dumps(g.get("generated_ids")) for g in runs}) == 1
                   for p, runs in greedy.items()}
    distinct = {}
    for condition in ("S1", "S2", "S3"):
        for p in protocol.PROMPTS:
            runs = [records.get((p, condition, s, 1)) for s in protocol.SEEDS]
            distinct[(p, condition)] = len({json.dumps(r.get("generated_ids")) for r in runs if r is not None})
    comparisons = view.kind("cache_comparison")
    diffs = [r.get("max_abs_diff") for r in comparisons if isinstance(r.get("max_abs_diff"), (int, float))]
    summaries = {(r.get("prompt_id"), r.get("use_cache")): r for r in view.kind("timing_summary")}

    def timing_line(prompt_id):
        on, off = summaries.get((prompt_id, True)), summaries.get((prompt_id, False))
        length = lengths((on or off or {}).get("prompt_length"))
        return (f"{prompt_id} (prompt {length} tokens, {protocol.TIMING_NEW_TOKENS} out): median TTFT "
                f"{ms(_median_of(on, 'ttft_s'))} ms cache on vs {ms(_median_of(off, 'ttft_s'))} ms off; median "
                f"post-first interval {ms(_median_of(on, 'mean_post_first_interval_s'))} vs "
                f"{ms(_median_of(off, 'mean_post_first_interval_s'))} ms")

    lines = ["## 17. Your conclusions: a scaffold", "",
             "> **These are prompts for you, the learner, not conclusions.** The numbers are filled in from the "
             "records; the claims are yours to make, check against the evidence above, and write in your own "
             "words, separately from your predictions.", ""]
    lines += ["**On selection.** Measured: greedy repetitions identical: " +
              ", ".join(f"{p} {yes_no(v)}" for p, v in greedy_same.items()) + "; distinct continuations over "
              f"{len(protocol.SEEDS)} seeds: " +
              ", ".join(f"{p}/{c} {n}" for (p, c), n in distinct.items()) +
              ". Prompt: what changes when only the selection rule changes and the network's first-step logits do "
              "not (section 9)? What do three seeds allow you to say, and what not?", ""]
    lines += ["**On computation.** Measured: cache max abs diff over "
              f"{len(comparisons)} prefixes ranges {num(min(diffs)) if diffs else MISSING} to "
              f"{num(max(diffs)) if diffs else MISSING} "
              f"(criterion {code(protocol.CACHE_TOLERANCE.describe(), in_table=False)}); "
              "argmax agreement: " + (yes_no(all(r.get("argmax_cached") == r.get("argmax_uncached")
                                                  for r in comparisons)) if comparisons else MISSING) + ". " +
              "; ".join(timing_line(p) for p in protocol.TIMING_PROMPTS) +
              ". Prompt: does the cache change what is computed, or only how? Is the speed difference clear at "
              "this workload, given the spread in section 11?", ""]
    lines += ["**Limitation 1.** Prompt: pick one item from section 14 that most limits your selection claim and "
              "say what experiment would remove it.", "",
              "**Limitation 2.** Prompt: pick one that most limits your computation or timing claim (overhead, "
              "tiny CPU workload, RSS semantics, divergence of free-running ids) and say how large it could be.", ""]
    return lines


def _section_plots(view: RunView, written: dict) -> list[str]:
    lines = ["## 15. Plots", ""]
    for spec in plots.plot_specs(view.records):
        if not spec["available"]:
            state = f"not drawn: {spec['reason']}"
        elif written.get(spec["name"]):
            state = f"could not be drawn: {text_cell(written[spec['name']])}"
        else:
            state = f"[{spec['file']}]({spec['file']})"
        lines.append(f"- {spec['title']}: {state}")
    return lines + [""]


def render_report(record_dir: Path, plot_errors: Optional[dict] = None) -> str:
    """The report's Markdown for a record dir; deterministic in the dir's records, plan and stable manifest fields.

    plot_errors maps a plot name to the error that kept write_report from drawing it.
    """
    view = RunView(Path(record_dir))
    written = dict(plot_errors or {})
    sections: list[tuple[str, Callable[[], list[str]]]] = [
        ("header", lambda: _section_header(view)),
        ("run status", lambda: _section_status(view)),
        ("predictions", lambda: _section_predictions(view)),
        ("environment", lambda: _section_environment(view)),
        ("artifacts", lambda: _section_artifacts(view)),
        ("model", lambda: _section_model(view)),
        ("inputs", lambda: _section_inputs(view)),
        ("generation", lambda: _section_generation(view)),
        ("repeatability", lambda: _section_repeatability(view)),
        ("first-step logits", lambda: _section_first_step(view)),
        ("cache", lambda: _section_cache(view, written)),
        ("timing", lambda: _section_timing(view, written)),
        ("memory", lambda: _section_memory(view)),
        ("batching", lambda: _section_batching(view)),
        ("limitations", lambda: _section_limitations(view)),
        ("plots", lambda: _section_plots(view, written)),
        ("checklist", lambda: _section_checklist(view)),
        ("conclusions", lambda: _section_conclusions(view)),
    ]
    lines: list[str] = []
    for name, render in sections:
        try:
            lines += render()
        except Exception as error:  # a partial run must still get the rest of its report
            lines += [f"**The {name} section could not be rendered from these records: "
                      f"{text_cell(f'{type(error).__name__}: {error}')}.**", ""]
    return "\n".join(lines).rstrip("\n") + "\n"




def write_report(record_dir: Path) -> Path:
    """Draw the plots, then render and atomically write DIR/report.md; returns its path."""
    record_dir = Path(record_dir)
    view = RunView(record_dir)
    results = plots.write_plots(record_dir, view.records)
    errors = {r["name"]: r["error"] for r in results if r["error"]}
    path = record_dir / REPORT_FILE
    write_text_atomic(path, render_report(record_dir, plot_errors=errors))
    return path
