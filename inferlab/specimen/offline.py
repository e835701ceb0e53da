"""Offline mode: the hub client's offline flags on and every network connection refused inside a block."""

from __future__ import annotations

import contextlib
import os
import sys

from inferlab.specimen import netguard


@contextlib.contextmanager
def offline_mode():
    """Hub offline flags on and every network connection refused (netguard) inside the block.

    huggingface_hub reads HF_HUB_OFFLINE at import time into huggingface_hub.constants, and
    transformers copies it into transformers.utils.hub._is_offline_mode, so the environment
    variable alone is too late once they are imported: patch both, and restore them after.
    huggingface_hub also caches one HTTP session per thread, built for the flag's value at
    creation, so the sessions are reset on entry and on exit.
    """
    previous_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    patched = []
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        patched.append((hub_constants, "HF_HUB_OFFLINE", hub_constants.HF_HUB_OFFLINE))
        hub_constants.HF_HUB_OFFLINE = True
    transformers_hub = sys.modules.get("transformers.utils.hub")
    if transformers_hub is not None and hasattr(transformers_hub, "_is_offline_mode"):
        patched.append((transformers_hub, "_is_offline_mode", transformers_hub._is_offline_mode))
        transformers_hub._is_offline_mode = True
    _reset_hub_sessions()
    try:
        with netguard.block_network():
            yield
    finally:
        for module, attribute, value in reversed(patched):
            setattr(module, attribute, value)
        _reset_hub_sessions()
        if previous_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous_env


def _reset_hub_sessions() -> None:
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import reset_sessions

        reset_sessions()
