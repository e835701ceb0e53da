"""--offline: every network connection refused inside a block (the proof behind it, and offline tests), with the hub
clients' own offline flags on."""

from __future__ import annotations

import contextlib
import os
import socket
import sys


class NetworkBlocked(RuntimeError):
    """Raised when code tries to open a network connection while the guard is active."""


@contextlib.contextmanager
def block_network(allow_loopback: bool = False):
    """Make socket connects and DNS look-ups (so socket.create_connection too) raise NetworkBlocked until the block
    exits; with allow_loopback, 127.0.0.1, ::1 and localhost stay reachable."""
    real = {"connect": socket.socket.connect, "connect_ex": socket.socket.connect_ex}
    real_getaddrinfo = socket.getaddrinfo

    def allowed(address) -> bool:
        host = address[0] if isinstance(address, tuple) else address
        return allow_loopback and host in ("127.0.0.1", "::1", "localhost")

    def guarded(name: str):
        def connect(self, address):
            if self.family != socket.AF_UNIX and not allowed(address):
                raise NetworkBlocked(f"network access blocked (connect {address!r})")
            return real[name](self, address)
        return connect

    def getaddrinfo(host, *args, **kwargs):
        if not allowed(host):
            raise NetworkBlocked(f"network access blocked (resolve {host!r})")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex = guarded("connect"), guarded("connect_ex")
    socket.getaddrinfo = getaddrinfo
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex = real["connect"], real["connect_ex"]
        socket.getaddrinfo = real_getaddrinfo


@contextlib.contextmanager
def offline_mode():
    """Hub offline flags on and every network connection refused (block_network) inside the block.

    huggingface_hub reads HF_HUB_OFFLINE at import into huggingface_hub.constants, and transformers copies it into
    transformers.utils.hub._is_offline_mode, so the variable alone is too late once they are imported: both are
    patched and restored. huggingface_hub also keeps one HTTP session per thread, made for the flag's value at the
    time, so the sessions are reset on entry and on exit.
    """
    previous_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    patched = [(module, name, getattr(module, name)) for module, name in (
        (sys.modules.get("huggingface_hub.constants"), "HF_HUB_OFFLINE"),
        (sys.modules.get("transformers.utils.hub"), "_is_offline_mode")) if hasattr(module, name)]
    for module, name, _ in patched:
        setattr(module, name, True)
    _reset_hub_sessions()
    try:
        with block_network():
            yield
    finally:
        for module, name, value in reversed(patched):
            setattr(module, name, value)
        _reset_hub_sessions()
        if previous_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous_env


def _reset_hub_sessions() -> None:
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import reset_sessions

        reset_sessions()
