"""Every recorded id decoded again with the grader's own copy of the tokenizer, and the run's texts compared with
what it gives: a text relabelled after the run (its ids left as they were) is an integrity problem.

verify decodes with the run's own tokenizer file, which is found only on the machine that made the run (its
specimen folder is a path there), so a handed-in run usually leaves that check not checked. The grader has its own
copy: the specimen the run names, as this checkout's artifacts/ spec pins it, in the grader's project cache (or the
folder a replay is given: --artifacts). Its tokenizer.json is used only when its SHA-256 is the one the grader's
spec pins; nothing is downloaded or built here (grading reads files only), and a copy that is not there is said in
not_checked. The comparison itself is verify's (inferlab.verify.consistency_text.check_with), so the two cannot
differ on what agrees: input token_ids from the source text, serialized text and token pieces; generation text,
text_with_special and generated_pieces; a timing trial's profiling text and pieces.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

TOKENIZER_FILE = "tokenizer.json"
# The grader's project cache: None for this checkout's (artifacts/cache/); the test suite points it at a folder of
# its own, so that a stand-in built in the checkout never decides a test.
CACHE_ROOT: Optional[Path] = None
PREFIX = "decoded with the grader's copy of the tokenizer"


@dataclass
class Decoded:
    """What the grader's tokenizer found: integrity problems, what it could not check, and where its copy was."""

    problems: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    copy: Optional[str] = None  # the grader's tokenizer.json that was used


def grader_tokenizer_path(name: str, artifacts: Optional[str] = None) -> tuple[Optional[Path], str]:
    """(the grader's verified tokenizer.json of the specimen `name`, '') or (None, why there is none)."""
    from inferlab.base.records import sha256_file
    from inferlab.specimen import SpecimenError, load_spec
    from inferlab.specimen.acquire import choose_acquisition

    try:
        spec = load_spec(name)
    except SpecimenError as error:
        return None, f"the run names the specimen {name!r}, which is not one of this checkout's ({error})"
    pinned = (spec.expected.get(TOKENIZER_FILE) or {}).get("sha256")
    _, directory = choose_acquisition(spec, artifacts_dir=artifacts, cache_root=CACHE_ROOT)
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        return None, (f"the grader has no copy of {name}'s {TOKENIZER_FILE} ({path} is not there; a run or "
                      f"`grade --replay` acquires it)")
    if not isinstance(pinned, str) or sha256_file(path) != pinned:
        return None, f"the grader's {path} is not the file this checkout's artifacts/{name}.json pins"
    return path, ""


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, mtime_ns: int):
    """The tokenizer at path, read once per process (a class grades every run with one copy)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def decode_check(view, artifacts: Optional[str] = None) -> Decoded:
    """Decode every recorded id of the run with the grader's copy of its specimen's tokenizer (see the module
    docstring); each disagreement one problem line naming the record and field, with both values."""
    from inferlab.verify.checker import Checker
    from inferlab.verify.consistency_shared import Recheck
    from inferlab.verify.consistency_text import has_texts

    found = Decoded()
    recheck = Recheck(Checker(view))
    if not has_texts(recheck):
        return found
    name = view.specimen_spec().get("name")
    if not isinstance(name, str) or not name:
        found.not_checked.append(f"{PREFIX}: the run names no specimen")
        return found
    path, why = grader_tokenizer_path(name, artifacts)
    if path is None:
        found.not_checked.append(f"{PREFIX}: {why}")
        return found
    try:
        tokenizer = _tokenizer(str(path), path.stat().st_mtime_ns)
    except Exception as error:  # an unreadable copy is the grader's to fix: said, never a crash
        found.not_checked.append(f"{PREFIX}: {path} could not be read ({type(error).__name__}: {error})")
        return found
    found.copy = str(path)
    from inferlab.verify.consistency_text import check_with

    try:
        check_with(recheck, tokenizer)
    except Exception as error:  # records of a shape no writer makes: verify has named them already
        found.problems.append(f"{PREFIX}: the records could not be decoded ({type(error).__name__}: {error})")
    found.problems += [f"{PREFIX}: {line}" for line in recheck.checker.problems]
    return found
