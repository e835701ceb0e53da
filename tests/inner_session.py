"""What an in-process inner session (pytester's runpytest) imports, imported by the test module that runs one.

pytester forgets, when its test ends, every module imported while the test ran (it restores a snapshot of
sys.modules taken when its fixture was set up). A module first imported by an inner session is therefore
imported again by the next one: hypothesis (its pytest plugin imports it as a session is configured) and the
report's modules were most of an inner run's time, and torch cannot be imported twice in one process. A test
module calls preload() when it is imported, before any pytester fixture takes its snapshot.
"""

from __future__ import annotations

import importlib

# What an inner session of a scratch experiment suite imports that the harness's own session need not have.
SESSION_MODULES = ("hypothesis", "statistics", "inferlab.read.addenda", "inferlab.host.environment",
                   "inferlab.specimen.build", "inferlab.report.plots", "inferlab.writing", "inferlab.replica",
                   "inferlab.report", "inferlab.read.runview", "inferlab.measure.stats")


# What an inner session that loads a model and writes its report imports: torch cannot be imported twice in one
# process, and transformers and matplotlib imported again would be most of a short run's time.
MODEL_MODULES = ("torch", "transformers", "transformers.models.gpt_neox.modeling_gpt_neox", "matplotlib.figure",
                 "matplotlib.backends.backend_agg")


def protocol_threads() -> None:
    """torch's thread counts set to the protocol's, once, before this process computes anything: an inner
    experiment session then finds them already as it asks (torch takes the inter-op count only once per process,
    so the session records its own request's refusal beside the effective counts, which match), and every test of
    this worker computes with the threads the experiment uses."""
    import torch

    from inferlab import protocol

    torch.set_num_threads(protocol.INTRA_OP_THREADS)
    torch.set_num_interop_threads(protocol.INTER_OP_THREADS)


def preload(*more: str) -> None:
    """Import SESSION_MODULES and `more` (such as torch, for a session that loads a model) into this process."""
    for name in (*SESSION_MODULES, *more):
        importlib.import_module(name)
