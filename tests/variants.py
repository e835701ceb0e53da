"""Recipe variants pinned on the fly, for whole-experiment tests of paths the pinned specimens rarely take."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from inferlab.specimen import recipe


def pin_variant(project_path: Path, name: str, builder, variant: recipe.Variant, directory: Path) -> dict:
    """Build `variant` with `builder` (inferlab.specimen.build.STANDIN or REPLICA) into `directory`, and pin it in the
    scratch project's artifacts/<name>.json, a copy of the builder's own spec with the variant's hashes."""
    built = builder.build(directory, variant=variant)
    spec = json.loads((project_path / "artifacts" / f"{builder.name}.json").read_text())
    spec["revision"] = hashlib.sha1(f"{builder.recipe}/{variant.describe()}".encode()).hexdigest()
    spec["description"] = f"Synthetic {builder.name} variant for tests ({variant.describe()}); not Pythia."
    spec["expected"].update(built["files"])
    (project_path / "artifacts" / f"{name}.json").write_text(json.dumps(spec, indent=2))
    return built
