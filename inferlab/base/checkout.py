"""The checkout this inferlab was imported from (the folder that holds inferlab/, pytest.ini, artifacts/ and the
lab's templates), and the one check that a Python has what inferlab needs, made by every entry point first."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # inferlab/base/checkout.py -> the checkout
NEEDED = ("numpy", "safetensors", "torch", "transformers", "tokenizers", "huggingface_hub", "filelock", "matplotlib")


def missing_modules(names=NEEDED) -> list[str]:
    """The modules among `names` this Python cannot find (looked up, not imported: it costs no import time)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def require_environment(program: str) -> None:
    """Refuse, before anything is read or written, a Python without the project's packages: one line naming the
    Python to use, exit status 2."""
    missing = missing_modules()
    if not missing:
        return
    venv = PROJECT_ROOT / ".venv" / "bin" / "python"
    use = f"{venv}" if venv.exists() else f"the project's environment (run `make` in {PROJECT_ROOT} first)"
    print(f"{program}: this Python ({sys.executable}) lacks {', '.join(missing)}; nothing was read or written. "
          f"Use {use}", file=sys.stderr)
    raise SystemExit(2)
