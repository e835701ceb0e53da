"""The pinned specimen: its spec as data, its acquisition (reuse, local build or bounded download), its verification.

One module per job:
    spec.py          artifacts/<name>.json read and checked (required and optional files, pins, reference hashes)
    entries.py       what may sit in a specimen folder: every entry judged from its metadata alone
    files.py         reading one file safely (regular files only, unchanged while hashed), JSON checks
    weights.py       naming a weight file that fails its pin from its safetensors header
    verification.py  check_specimen_files() and require_verified(): nothing is loaded from a folder that has not passed
    deadline.py      the one acquisition deadline
    lock.py          one acquisition of a project cache at a time
    hub.py           the bounded HTTP client (metadata, bodies, redirects, proxies)
    acquire.py       the four acquisition paths, staging and publication
    offline.py       --offline: hub flags and the network guard
"""

from inferlab.base.records import sha256_file
from inferlab.specimen.acquire import (
    ACQUISITION_LABELS,
    ACQUISITIONS,
    acquire,
    acquisition_outcome,
    choose_acquisition,
    download,
    load_runnable_spec,
    local_build_problem,
    local_builder,
    remote_metadata,
)
from inferlab.specimen.deadline import Deadline, DeadlineExpired
from inferlab.specimen.hub import DEFAULT_ENDPOINT, resolve_endpoint
from inferlab.specimen.offline import offline_mode
from inferlab.specimen.spec import (
    DEFAULT_ARTIFACTS_ROOT,
    PROJECT_ROOT,
    WEIGHT_FILE,
    SpecimenError,
    SpecimenSpec,
    cache_dir,
    load_spec,
    spec_problems,
)
from inferlab.specimen.verification import check_specimen_files, require_verified

__all__ = [
    "ACQUISITION_LABELS", "ACQUISITIONS", "DEFAULT_ARTIFACTS_ROOT", "DEFAULT_ENDPOINT", "PROJECT_ROOT",
    "WEIGHT_FILE", "Deadline", "DeadlineExpired", "SpecimenError", "SpecimenSpec", "acquire",
    "acquisition_outcome", "cache_dir", "check_specimen_files", "choose_acquisition", "download", "load_runnable_spec",
    "load_spec", "local_build_problem", "local_builder", "offline_mode", "remote_metadata", "require_verified", "resolve_endpoint",
    "sha256_file", "spec_problems",
]
