"""What a learner should do next when a run cannot get its specimen: one text, shared by the
terminal summary and the report, so both say the same thing.

Pure functions of plain data (the specimen spec as a dict, the recorded error); no pytest, no torch.
"""

from __future__ import annotations

from typing import Optional

from inferlab import protocol
from inferlab.base.commands import spelled

CHECK_COMMAND = spelled("check-artifacts DIR")


def acquisition_cause(record: dict, offline: bool = False) -> str:
    """What could not happen, in a few words, from the artifact_acquisition record (its path and error)."""
    path, error = record.get("acquisition"), str(record.get("error") or "")
    if path == "reuse:artifacts_dir":
        return "your --artifacts copy was refused"
    if path == "reuse:project_cache":
        return "the copy in artifacts/cache/ was refused"
    if path == "built_offline":
        return "inferlab could not build the synthetic specimen"
    if offline:
        return "--offline, and no verified copy was found"
    if "accept a connection" in error or "connection" in error.lower():
        return "no connection to the hub"
    return "the download from the hub failed"


def acquisition_next_steps(specimen: Optional[dict], acquisition: Optional[str] = None,
                           other_copy: Optional[dict] = None) -> list[str]:
    """The ways forward after a failed acquisition, as Markdown-free lines of text (one step per line).

    acquisition is the path that failed (the artifact_acquisition record's `acquisition`), when known; other_copy
    the verification's other_specimen (the folder is a valid copy of another specimen): then the first step is
    to use it as that specimen, never to replace or delete it.
    """
    from inferlab.specimen.verification import builder_module

    specimen = specimen or {}
    name = specimen.get("name", protocol.DEFAULT_SPECIMEN)
    if isinstance(other_copy, dict) and isinstance(other_copy.get("words"), str):
        return [f"{other_copy['words']}.",
                f"For {name} itself, pass --artifacts with a copy of {name}, or leave --artifacts out.",
                "Every run needs a new record dir; `make run` makes one under runs/ for you."]
    if specimen.get("synthetic") and acquisition == "reuse:artifacts_dir":
        return [
            f"Your --artifacts copy of the synthetic {name} specimen failed verification: the error above names "
            f"the file. Leave --artifacts out and inferlab builds a verified {name} itself, or build a fresh copy "
            f"with `{spelled(f'-m {builder_module(name, True)} NEWDIR', 'python')}` (NEWDIR new or empty).",
            "Every run needs a new record dir; `make run` makes one under runs/ for you.",
        ]
    if specimen.get("synthetic"):
        return [
            f"The {name} specimen is built offline by inferlab itself, so its failure is a problem of this "
            f"checkout or environment, not of the network: read the error above, then run `make test` to check "
            f"the harness.",
            "Every run needs a new record dir; `make run` makes one under runs/ for you.",
        ]
    repo = specimen.get("repo_id", protocol.PINNED_REPO_ID)
    revision = specimen.get("revision", protocol.PINNED_REVISION)
    weight = (specimen.get("expected") or {}).get("model.safetensors") or {}
    files = specimen.get("files") or list(protocol.ALLOWLISTED_FILES)
    optional = specimen.get("optional_files") or list(protocol.OPTIONAL_FILES)
    required = [f for f in files if f not in optional]
    pin = (f"{weight['size']:,} bytes with SHA-256 {weight['sha256']}" if weight.get("sha256") and weight.get("size")
           else "its pinned size and SHA-256")
    check = CHECK_COMMAND if name == protocol.DEFAULT_SPECIMEN else f"{CHECK_COMMAND} --specimen {name}"
    valid = (f"A valid copy is a directory holding {repo} at revision {revision}, for example your Lab 05 download: "
             f"the required files ({', '.join(required)}), {' and '.join(optional)} only if that revision has it (it "
             f"very probably has none), and no other file but a README.md or .gitattributes. Its model.safetensors "
             f"must be {pin}.")
    if acquisition == "reuse:artifacts_dir":  # the copy was given: it is the copy that must change
        first = (f"Your --artifacts copy failed verification: the error above names each file that differs, is "
                 f"missing or is extra. Replace those files (or pass --artifacts with another copy). {valid}")
    else:
        first = (f"Use a verified copy of the files: add --artifacts DIR (with make: make run ARGS=\"--artifacts DIR "
                 f"--offline\"). {valid}")
    return [
        first,
        f"Check a copy before you run: `{check}` hashes every file against artifacts/{name}.json and names any "
        f"that differs, is missing or is extra (the weight file alone: `sha256sum DIR/model.safetensors`, on "
        f"macOS `shasum -a 256`). A machine that reaches the hub gets a verified copy with one `make run`: it "
        f"lands in artifacts/cache/{name}/{revision}/.",
        "Or check the harness offline: add --specimen standin (with make: make run ARGS=\"--specimen standin\"). "
        "It runs the whole experiment on a synthetic checkpoint that inferlab builds itself. It is not Pythia, and "
        "its records and report say so.",
        "Every run needs a new record dir; `make run` makes one under runs/ for you.",
    ]
