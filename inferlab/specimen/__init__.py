"""The pinned specimen: its spec as data, one bounded way to a verified copy of its files, and the offline builds.

    spec.py      artifacts/<name>.json read and checked against the protocol
    acquire.py   one path to a verified folder (reuse, local build or bounded download), one deadline, one lock;
                 what to do next when none could be had
    hub.py       the bounded HTTP exchange with the hub: metadata before any body, the cap, the deadline
    check.py     verification of a folder: every entry judged, each file read once, the Lab 05 wrong copies named
    netguard.py  --offline: every connection refused, the hub clients' offline flags on
    recipe.py    constructed weights with a trained model's shape, for both offline specimens
    build.py     the stand-in and the replica, built offline (python -m inferlab.standin / .replica DIR)
"""

from __future__ import annotations

import importlib
import sys

from inferlab.base.records import sha256_file
from inferlab.specimen.acquire import (
    ACQUISITION_LABELS, ACQUISITIONS, acquire, acquisition_cause, acquisition_next_steps, acquisition_outcome,
    choose_acquisition, download, load_runnable_spec, local_build_problem, local_builder, require_verified,
)
from inferlab.specimen.check import check_specimen_files
from inferlab.specimen.hub import DEFAULT_ENDPOINT, Deadline, DeadlineExpired, remote_metadata, resolve_endpoint
from inferlab.specimen.netguard import NetworkBlocked, block_network, offline_mode
from inferlab.specimen.spec import (
    DEFAULT_ARTIFACTS_ROOT, PROJECT_ROOT, WEIGHT_FILE, SpecimenError, SpecimenSpec, cache_dir, load_spec, spec_problems,
)

BUILD_NEEDS = ("numpy", "safetensors", "tokenizers")  # what an offline build imports
__all__ = [
    "ACQUISITION_LABELS", "ACQUISITIONS", "DEFAULT_ARTIFACTS_ROOT", "DEFAULT_ENDPOINT", "PROJECT_ROOT", "WEIGHT_FILE",
    "Deadline", "DeadlineExpired", "NetworkBlocked", "SpecimenError", "SpecimenSpec", "acquire", "acquisition_cause",
    "acquisition_next_steps", "acquisition_outcome", "block_network", "build_command", "cache_dir",
    "check_specimen_files", "choose_acquisition", "download", "load_runnable_spec", "load_spec", "local_build_problem",
    "local_builder", "offline_mode", "remote_metadata", "require_verified", "resolve_endpoint", "sha256_file",
    "spec_problems",
]


def build_command(name: str, argv=None) -> int:
    """`python -m inferlab.<name> DIR` (standin or replica): under a Python that lacks what a build imports, one line
    naming the Python to use and exit 2, never a traceback; else the build's own command."""
    from inferlab.base.commands import spelled

    for module in BUILD_NEEDS:
        try:
            importlib.import_module(module)
        except ImportError:
            print(f"inferlab.{name}: this Python ({sys.executable}) cannot import {module}, which the build needs; "
                  f"nothing was written. Run it with the project's own: {spelled(f'-m inferlab.{name} DIR', 'python')}",
                  file=sys.stderr)
            return 2
    from inferlab.specimen import build

    return getattr(build, name.upper()).main(argv)
