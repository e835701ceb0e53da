"""What a learner should do next when a run cannot get its specimen: one text, shared by the
terminal summary and the report, so both say the same thing.

Pure functions of plain data (the specimen spec as a dict, the recorded error); no pytest, no torch.
"""

from __future__ import annotations

from typing import Optional

from inferlab import protocol


def acquisition_next_steps(specimen: Optional[dict]) -> list[str]:
    """The two ways forward after a failed acquisition, as Markdown-free lines of text."""
    specimen = specimen or {}
    name = specimen.get("name", protocol.DEFAULT_SPECIMEN)
    repo = specimen.get("repo_id", protocol.PINNED_REPO_ID)
    revision = specimen.get("revision", protocol.PINNED_REVISION)
    weight = (specimen.get("expected") or {}).get("model.safetensors") or {}
    files = ", ".join(specimen.get("files") or protocol.ALLOWLISTED_FILES)
    pin = (f"{weight.get('size'):,} bytes, SHA-256 {weight.get('sha256')}" if weight.get("sha256")
           else "its pinned size and SHA-256")
    return [
        f"Use a verified copy: --artifacts DIR, where DIR holds {repo} at revision {revision} "
        f"(the allowlisted files: {files}) and nothing else. Its model.safetensors must be {pin}; "
        f"check it with `sha256sum DIR/model.safetensors` (or `shasum -a 256` on macOS) before you run.",
        "Or check the harness offline: --specimen standin runs the whole experiment on a synthetic checkpoint "
        "that inferlab builds itself. It is not Pythia; its records and report say so.",
        f"Every run needs a new --record-dir. Specimen of this run: {name}.",
    ]
