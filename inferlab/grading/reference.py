"""The instructor's reference: what a trusted run pins and computed, and a graded run compared with it.

make_reference(view) takes, from a run the instructor trusts (in a course, their own run on the real
pythia-14m): the specimen's pins (name, repository, revision, synthetic or not, every allowlisted file's size
and SHA-256), the SHA-256 of every experiment source file as the run's manifest recorded it (inferlab/,
experiments/, conftest.py, pytest.ini, artifacts/*.json), every deterministic output
(inferlab.reading.deterministic.deterministic_outputs), and the declared tolerance for logits.

compare_reference(view, reference) checks a graded run against it, within the reference's declared tolerance, by
the one comparison of a claimed run with trusted outputs (inferlab.recheck.trusted, which says what is compared).

A reference applies to one specimen and one protocol: of another (mismatch(), ReferenceMismatch) it is a usage
error naming both, never a list of contradictions. choose_reference picks, of several references (one per
specimen), the one of the run's specimen.

The reference's format (REFERENCE_FORMAT, REFERENCE_SCHEMA) is documented in docs/grading.md.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from inferlab.base.commands import spelled
from inferlab.base.records import MANIFEST_FILE
from inferlab.reading.runview import RunView
from inferlab.recheck.agreement import Allowance
from inferlab.recheck.trusted import Comparison, compare_trusted, experiment_source, pins, run_sources, \
    trusted_outputs

__all__ = ["Comparison", "experiment_source", "pins", "run_sources"]  # kept here for the reference's readers

REFERENCE_FORMAT = "inferlab-reference"
REFERENCE_SCHEMA = 2  # 2: greedy steps' top two, the protocol, the CPU kernels
# Logits of the same specimen and software on another CPU differ by rounding; this is far above that and far
# below any real change of weights. A course may declare its own with `reference --atol/--rtol`.
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4
TOP_FIELDS = ("format", "schema", "made_utc", "tool", "from_run", "tolerance", "specimen", "protocol", "sources",
              "outputs")


class ReferenceError(ValueError):
    """A reference file that cannot be used; the message names the file and what is wrong."""


def make_reference(view: RunView, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL,
                   now: Optional[str] = None) -> dict:
    """The reference of one trusted run, as plain data (written as REF.json)."""
    manifest_bytes = b""
    if view.directory is not None and (view.directory / MANIFEST_FILE).is_file():
        manifest_bytes = (view.directory / MANIFEST_FILE).read_bytes()
    git = view.manifest.get("git") if isinstance(view.manifest.get("git"), dict) else {}
    return {
        "format": REFERENCE_FORMAT, "schema": REFERENCE_SCHEMA,
        "made_utc": now or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tool": "inferlab reference",
        "from_run": {"record_dir": view.directory.name if view.directory is not None else None,
                     "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest() if manifest_bytes else None,
                     "git_commit": git.get("commit"), "started_utc": view.manifest.get("started_utc"),
                     "cpu_kernels": (view.manifest.get("torch_build") or {}).get("cpu_kernels")},
        "tolerance": {"atol": atol, "rtol": rtol,
                      "rule": f"|run - reference| <= {atol:g} + {rtol:g}*|reference| for logits; a top-two margin "
                              f"<= 2*({atol:g} + {rtol:g}*|top logit|) is a near tie"},
        **trusted_outputs(view),
        "protocol": {"sha256": protocol_digest(view.manifest.get("protocol")), "fields": view.manifest.get("protocol")},
    }


def load_reference(path: Path) -> dict:
    """A reference file, checked for its format and schema; ReferenceError naming the file otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ReferenceError(f"{path}: cannot be read ({error})") from None
    except ValueError as error:
        raise ReferenceError(f"{path}: not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("format") != REFERENCE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ReferenceError(f"{path}: not an inferlab reference (format {found!r}, expected {REFERENCE_FORMAT!r}; "
                             f"make one with {spelled('reference RUN_DIR -o REF.json')})")
    if data.get("schema") != REFERENCE_SCHEMA:
        older = isinstance(data.get("schema"), int) and data["schema"] < REFERENCE_SCHEMA
        raise ReferenceError(f"{path}: reference schema {data.get('schema')!r}; this inferlab reads schema "
                             f"{REFERENCE_SCHEMA}" + (f" (an older reference knows no greedy step's margins: make it "
                                                      f"again with {spelled('reference RUN_DIR -o REF.json')})"
                                                      if older else ""))
    absent = [name for name in TOP_FIELDS if name not in data]
    if absent:
        raise ReferenceError(f"{path}: missing field(s) {', '.join(absent)}")
    tolerance = data["tolerance"]
    if not all(isinstance(tolerance.get(k), (int, float)) and tolerance[k] >= 0 for k in ("atol", "rtol")):
        raise ReferenceError(f"{path}: tolerance must hold atol and rtol >= 0, found {tolerance!r}")
    return data


# --- which reference applies ---------------------------------------------------------------------------


class ReferenceMismatch(ReferenceError):
    """A reference of another specimen or protocol than the run's: a usage error (exit 2), naming both."""


def protocol_digest(protocol_dict: Any) -> Optional[str]:
    """The SHA-256 of a protocol (protocol.as_dict() as a run's manifest recorded it), as canonical JSON."""
    if not isinstance(protocol_dict, dict):
        return None
    return hashlib.sha256(json.dumps(protocol_dict, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _specimen_name(reference: dict) -> Optional[str]:
    return (reference.get("specimen") or {}).get("name")


def mismatch(view: RunView, reference: dict, file: Optional[str] = None) -> Optional[str]:
    """Why a reference does not apply to a run (another specimen, another protocol), naming both; None when it
    applies."""
    where = f"the reference {file}" if file else "the reference"
    run_name, ref_name = view.specimen_spec().get("name"), _specimen_name(reference)
    if run_name != ref_name:
        return (f"{where} is of specimen {ref_name!r}, the run of specimen {run_name!r}: give the reference made "
                f"for {run_name!r} ({spelled('reference RUN_DIR -o REF.json')} on a trusted run of it)")
    ours, theirs = protocol_digest(view.manifest.get("protocol")), (reference.get("protocol") or {}).get("sha256")
    if ours != theirs:
        different = sorted(k for k in set(view.manifest.get("protocol") or {}) | set((reference.get("protocol") or
                                                                                        {}).get("fields") or {})
                           if (view.manifest.get("protocol") or {}).get(k) !=
                           ((reference.get("protocol") or {}).get("fields") or {}).get(k))
        return (f"{where} is of protocol {str(theirs)[:12]}, the run of protocol {str(ours)[:12]} (sha256 of the "
                f"manifest's protocol; differing: {', '.join(different) or 'unknown'})")
    return None


def choose_reference(view: RunView, references: list[tuple[Optional[str], dict]]) -> tuple[Optional[str], dict]:
    """(file, reference) of the one reference of the run's specimen; ReferenceMismatch naming every specimen given
    (or the protocols) otherwise."""
    run_name = view.specimen_spec().get("name")
    matching = [(file, ref) for file, ref in references if _specimen_name(ref) == run_name]
    if not matching:
        given = ", ".join(f"{_specimen_name(ref)!r} ({file})" if file else repr(_specimen_name(ref))
                          for file, ref in references)
        if len(references) == 1:
            raise ReferenceMismatch(mismatch(view, references[0][1], references[0][0]))
        raise ReferenceMismatch(f"no reference of the run's specimen {run_name!r}: the references given are of "
                                f"{given}")
    file, reference = matching[0]
    why = mismatch(view, reference, file)
    if why:
        raise ReferenceMismatch(why)
    return file, reference


def specimens_given(references: list[tuple[Optional[str], dict]]) -> Optional[str]:
    """A usage error when two references are of one specimen (which would apply is not said), else None."""
    seen: dict = {}
    for file, reference in references:
        name = _specimen_name(reference)
        if name in seen:
            return f"two references of specimen {name!r}: {seen[name]} and {file}; give one per specimen"
        seen[name] = file
    return None


def compare_reference(view: RunView, reference: dict) -> Comparison:
    """Every contradiction between the run and the reference (inferlab.recheck.trusted), within the reference's
    declared tolerance, and what was only noted. The reference must be of the run's specimen and protocol
    (mismatch(); ReferenceMismatch otherwise)."""
    why = mismatch(view, reference)
    if why:
        raise ReferenceMismatch(why)
    tolerance = reference["tolerance"]
    result = compare_trusted(view, reference, Allowance(float(tolerance["atol"]), float(tolerance["rtol"])))
    kernels = kernels_line(view.manifest, (reference.get("from_run") or {}).get("cpu_kernels"))
    if kernels:
        result.notes.append(kernels)
    return result


def kernels_line(manifest: dict, reference_kernels: Optional[dict]) -> Optional[str]:
    """One line saying which CPU kernels the run and the reference's run used (environment.cpu_kernels)."""
    from inferlab.host.environment import describe_kernels

    run_kernels = (manifest.get("torch_build") or {}).get("cpu_kernels") if isinstance(manifest, dict) else None
    if run_kernels is None and reference_kernels is None:
        return None
    return f"CPU kernels: the run {describe_kernels(run_kernels)}; the reference's run {describe_kernels(reference_kernels)}"
