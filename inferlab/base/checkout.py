"""The checkout this inferlab was imported from: the folder that holds inferlab/, pytest.ini, artifacts/ and the
lab's templates. Defined once, so that a module's place in the package never decides where the project is."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # inferlab/base/checkout.py -> the checkout
