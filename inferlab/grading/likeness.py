"""What two submissions of a class share that two honest pieces of work never do, and who handed each in.

Each submission (a run folder or a `pack` archive) is read once more, from its files alone, for its traits: the
run's id (its folder's name), the SHA-256 of records.jsonl, the token timestamps of every timing trial, the
weight-read samples, the attached explanation and predictions.md (compared as text with line endings and
trailing spaces set aside, and never when they are blank or the template itself; and, when not the same text,
by their wording: the share of word shingles two of them have in common beyond the template's, flagged at
inferlab.grading.wording's threshold, a near copy with whitespace, line wrapping and a few words changed), the
machine's fingerprint
(inferlab.host.machine.fingerprint_of), and the learner: pack's `--learner` in submission.json, or the users of
Gradescope's submission_metadata.json beside the submission.

shared_pairs() compares every pair of submissions and returns, pair by pair, what they have in common;
flag_grades() puts each pair into both submissions' grades as a finding for a person. Nothing here changes a
status or a point: honest learners can share a run id (two sessions started in the same second) or a machine,
and only a person can tell a copy from a coincidence.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from inferlab.base.records import MANIFEST_FILE, PREDICTIONS_FILE, RECORDS_FILE
from inferlab.grading import wording
from inferlab.host.machine import fingerprint_of
from inferlab.reading import addenda
from inferlab.reading.runview import parse_records
from inferlab.run import predictions

GRADESCOPE_METADATA = "submission_metadata.json"
SHARED_FINDING = "shared_with_another_submission"
# what a pair can share, in the order the page lists it, with the words it uses
SHARED_WHAT = {"learner": "the same learner", "run_id": "the same run id", "records": "the same records.jsonl",
               "timing": "the same timing stamps", "weight_read": "the same weight-read samples",
               "explanation": "the same explanation", "explanation_alike": "an explanation worded alike",
               "predictions": "the same predictions file", "predictions_alike": "predictions worded alike"}


@dataclass
class Traits:
    """One submission's traits (see the module docstring); None where the submission does not have it."""

    label: str
    run_id: Optional[str] = None
    records_sha256: Optional[str] = None
    timing: dict = field(default_factory=dict)  # {signature of a trial's token timestamps: the trial's id}
    weight_read: dict = field(default_factory=dict)  # {signature of one weight_read record's samples: its seq}
    explanation: Optional[tuple[str, str]] = None  # (SHA-256 of the compared text, the file in the run)
    predictions: Optional[str] = None  # SHA-256 of the compared text
    # the texts' word shingles less their template's (inferlab.grading.wording), None when too short to compare
    explanation_shingles: Optional[frozenset] = None
    predictions_shingles: Optional[frozenset] = None
    machine: Optional[str] = None  # the fingerprint as one line
    learners: list = field(default_factory=list)  # [{id, name, email, from}]
    notes: list = field(default_factory=list)  # what could not be read about the learner
    unread: Optional[str] = None  # why the files could not be read (the grade says more)


def _compared_text(raw: bytes) -> str:
    """The text two files are compared by: line endings, trailing spaces and surrounding blank lines set aside."""
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _templates() -> tuple[str, str]:
    """The explanation and predictions templates as they are compared (see _compared_text)."""
    explanation = addenda.read_template() or ""
    prediction = predictions.read_template(addenda.PROJECT_ROOT) or ""
    return _compared_text(explanation.encode()), _compared_text(prediction.encode())


def _wanted(relative: str) -> bool:
    return relative in (RECORDS_FILE, MANIFEST_FILE, PREDICTIONS_FILE, addenda.LEDGER_FILE) or \
        relative.startswith(addenda.ADDENDA_DIR + "/")


def _folder_files(folder: Path) -> dict[str, bytes]:
    files = {}
    for name in (RECORDS_FILE, MANIFEST_FILE, PREDICTIONS_FILE, addenda.LEDGER_FILE):
        if (folder / name).is_file():
            files[name] = (folder / name).read_bytes()
    if (folder / addenda.ADDENDA_DIR).is_dir():
        for path in sorted((folder / addenda.ADDENDA_DIR).iterdir()):
            if path.is_file() and not path.is_symlink():
                files[f"{addenda.ADDENDA_DIR}/{path.name}"] = path.read_bytes()
    return files


def gradescope_learners(path: Path) -> list[dict]:
    """The users of a Gradescope submission_metadata.json ({"users": [{"email", "id", "name"}, ...]}, one per
    member of a group submission); [] when the file is absent or holds no users, ValueError naming the file when
    it is not such JSON."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: expected Gradescope's submission metadata (JSON), actual unreadable ({error})") \
            from None
    users = data.get("users") if isinstance(data, dict) else None
    if users is None:
        return []
    if not isinstance(users, list) or not all(isinstance(u, dict) for u in users):
        raise ValueError(f"{path}: expected \"users\" to be a list of objects, actual {type(users).__name__}")
    return [{"id": None if u.get("id") is None else str(u.get("id")), "name": u.get("name"),
             "email": u.get("email"), "from": GRADESCOPE_METADATA} for u in users]


def traits_of(source: Path, label: str, metadata: Optional[Path] = None) -> Traits:
    """A submission's traits, read from its files (an archive is read in memory after every entry is checked;
    nothing is written); metadata: a Gradescope submission_metadata.json that names its learners."""
    from inferlab.submission.archive import UnsafeArchive, is_archive, read_files
    from inferlab.submission.pack import submission_learners

    source = Path(source)
    traits = Traits(label)
    submission = None
    try:
        if is_archive(source):
            folder, files, submission = read_files(source, _wanted)
        elif source.is_dir():
            folder, files = source.name, _folder_files(source)
        else:
            traits.unread = "neither a run folder nor an archive"
            return traits
    except (UnsafeArchive, OSError, tarfile.TarError, EOFError) as error:
        traits.unread = str(error)
        return traits
    if RECORDS_FILE not in files:
        traits.unread = f"no {RECORDS_FILE}"
        return traits
    traits.run_id = folder
    _read_traits(traits, files)
    traits.learners += submission_learners(submission)
    if metadata is not None:
        try:
            traits.learners += gradescope_learners(metadata)
        except ValueError as error:
            traits.notes.append(f"the learner is not known: {error}")
    return traits


def _read_traits(traits: Traits, files: dict[str, bytes]) -> None:
    explanation_template, predictions_template = _templates()
    traits.records_sha256 = hashlib.sha256(files[RECORDS_FILE]).hexdigest()
    records, _ = parse_records(files[RECORDS_FILE])
    for record in records:
        if record.get("kind") == "timing_trial" and isinstance(record.get("token_times_s"), list) \
                and record["token_times_s"]:
            signature = _digest(json.dumps(record["token_times_s"]))
            traits.timing.setdefault(signature, str(record.get("schedule_id") or record.get("seq")))
        elif record.get("kind") == "weight_read" and isinstance(record.get("seconds"), list) and record["seconds"]:
            traits.weight_read.setdefault(_digest(json.dumps(record["seconds"])), record.get("seq"))
    try:
        manifest = json.loads(files.get(MANIFEST_FILE, b"{}"))
    except ValueError:
        manifest = {}
    platform = manifest.get("platform") if isinstance(manifest, dict) else None
    if isinstance(platform, dict):
        traits.machine = ", ".join(f"{k} {v}" for k, v in fingerprint_of(platform).items())
    if PREDICTIONS_FILE in files:
        raw = files[PREDICTIONS_FILE]
        text = _compared_text(raw)
        if text and text != predictions_template and \
                not predictions.template_status(raw.decode("utf-8", "replace"), None)["template_unanswered"]:
            traits.predictions = _digest(text)
            traits.predictions_shingles = wording.own_shingles(text, predictions_template)
    if addenda.LEDGER_FILE in files:
        entries, _ = addenda.parse_ledger(files[addenda.LEDGER_FILE])
        for entry in reversed(entries):  # the latest explanation is the one graded
            if entry.get("kind") == addenda.EXPLANATION_KIND and files.get(str(entry.get("file"))) is not None:
                text = _compared_text(files[str(entry["file"])])
                if text and text != explanation_template:
                    traits.explanation = (_digest(text), str(entry["file"]))
                    traits.explanation_shingles = wording.own_shingles(text, explanation_template)
                break


def _shared(a: Traits, b: Traits) -> list[dict]:
    """What a and b have in common: [{what, words, detail}] in SHARED_WHAT's order."""
    found = []

    def add(what: str, detail: str, similarity: Optional[float] = None) -> None:
        found.append({"what": what, "words": SHARED_WHAT[what], "detail": detail,
                      **({} if similarity is None else {"similarity": similarity})})

    ids_a = {learner["id"] for learner in a.learners if learner.get("id")}
    same_learner = sorted(ids_a & {learner["id"] for learner in b.learners if learner.get("id")})
    if same_learner:
        add("learner", f"both name the learner {', '.join(same_learner)}")
    if a.run_id and a.run_id == b.run_id:
        add("run_id", f"run {a.run_id}")
    if a.records_sha256 and a.records_sha256 == b.records_sha256:
        add("records", f"{RECORDS_FILE} SHA-256 {a.records_sha256[:16]}...")
    timing = sorted(a.timing[s] for s in set(a.timing) & set(b.timing))
    if timing:
        add("timing", f"{len(timing)} timing trial(s) with identical token timestamps ({', '.join(timing[:3])}"
                      f"{', ...' if len(timing) > 3 else ''})")
    weight_read = sorted(str(a.weight_read[s]) for s in set(a.weight_read) & set(b.weight_read))
    if weight_read:
        add("weight_read", f"every timed pass of the weight_read record identical (seq {', '.join(weight_read)})")
    if a.explanation and b.explanation and a.explanation[0] == b.explanation[0]:
        files = a.explanation[1] if a.explanation[1] == b.explanation[1] else \
            f"{a.explanation[1]} and {b.explanation[1]}"
        add("explanation", f"the attached explanations ({files}) hold the same text")
    elif a.explanation and b.explanation:
        figure = alike(a.explanation_shingles, b.explanation_shingles)
        if figure is not None and figure >= wording.ALIKE_THRESHOLD:
            add("explanation_alike", f"{figure:.0%} of the explanations' word shingles in common", figure)
    if a.predictions and a.predictions == b.predictions:
        add("predictions", f"{PREDICTIONS_FILE} holds the same answers")
    elif a.predictions and b.predictions:
        figure = alike(a.predictions_shingles, b.predictions_shingles)
        if figure is not None and figure >= wording.ALIKE_THRESHOLD:
            add("predictions_alike", f"{figure:.0%} of the answers' word shingles in common", figure)
    return found


def alike(a: Optional[frozenset], b: Optional[frozenset]) -> Optional[float]:
    """The similarity of two texts' own shingles (wording.similarity), None when either is too short to compare."""
    return None if a is None or b is None else round(wording.similarity(a, b), 3)


def wording_figures(traits: list[Traits]) -> list[dict]:
    """For every pair whose explanations or predictions could be compared: {"a", "b", "explanation",
    "predictions"} with each similarity (1.0 for the same text, None where not compared): the figure behind every
    flag, and the figures of the pairs that were not flagged."""
    figures = []
    for i, first in enumerate(traits):
        for j in range(i + 1, len(traits)):
            second = traits[j]
            entry = {"a": i + 1, "b": j + 1,
                     "explanation": 1.0 if first.explanation and second.explanation and
                     first.explanation[0] == second.explanation[0] else
                     alike(first.explanation_shingles, second.explanation_shingles),
                     "predictions": 1.0 if first.predictions and first.predictions == second.predictions else
                     alike(first.predictions_shingles, second.predictions_shingles)}
            if entry["explanation"] is not None or entry["predictions"] is not None:
                figures.append(entry)
    return figures


def shared_pairs(traits: list[Traits]) -> list[dict]:
    """Every pair of submissions (numbered from 1, in the class's order) that shares anything:
    [{"a": n, "b": m, "labels": [..], "shared": [{what, words, detail}, ...]}]."""
    pairs = []
    for i, first in enumerate(traits):
        for j in range(i + 1, len(traits)):
            shared = _shared(first, traits[j])
            if shared:
                pairs.append({"a": i + 1, "b": j + 1, "labels": [first.label, traits[j].label], "shared": shared})
    return pairs


def distinct_machines(traits: list[Traits]) -> int:
    """How many different machine fingerprints the submissions' manifests name."""
    return len({t.machine for t in traits if t.machine})


def pair_text(pair: dict) -> str:
    """'the same run id (run X); the same records.jsonl (...)'."""
    return "; ".join(f"{s['words']} ({s['detail']})" for s in pair["shared"])


EVIDENCE_FILE = {"records": RECORDS_FILE, "timing": RECORDS_FILE, "weight_read": RECORDS_FILE,
                 "predictions": PREDICTIONS_FILE, "explanation": addenda.LEDGER_FILE, "learner": "submission.json",
                 "predictions_alike": PREDICTIONS_FILE, "explanation_alike": addenda.LEDGER_FILE,
                 "run_id": "the run folder's name"}


def flag_grades(grades: list, pairs: list[dict]) -> None:
    """Add each pair to both submissions' findings (a finding costs no points and changes no status)."""
    for pair in pairs:
        files = list(dict.fromkeys(EVIDENCE_FILE[s["what"]] for s in pair["shared"]))
        for own, other in ((pair["a"], pair["b"]), (pair["b"], pair["a"])):
            grades[own - 1].findings.append({
                "kind": SHARED_FINDING,
                "what": f"this submission and submission {other} ({pair['labels'][1 if own == pair['a'] else 0]}) "
                        f"share {pair_text(pair)}",
                "meaning": "for a person to look at: honest work on separate machines never shares these (a run id "
                           "alone can, when two sessions started in the same second; writing worded alike is a "
                           f"similarity figure, {wording.rule_text()}); no point was taken",
                "shared": [s["what"] for s in pair["shared"]], "other": other,
                "similarity": {s["what"]: s["similarity"] for s in pair["shared"] if "similarity" in s},
                "evidence": [{"file": name} for name in files]})


def learner_facts(grades: list, traits: list[Traits]) -> None:
    """Put each submission's learners and machine fingerprint into its grade's facts."""
    for grade, trait in zip(grades, traits):
        grade.facts["learners"] = trait.learners
        grade.facts["machine_fingerprint"] = trait.machine
        grade.notes += trait.notes
