"""Refuse every network connection inside a block: the proof behind `--offline` and offline tests."""

from __future__ import annotations

import contextlib
import socket


class NetworkBlocked(RuntimeError):
    """Raised when code tries to open a network connection while the guard is active."""


@contextlib.contextmanager
def block_network(allow_loopback: bool = False):
    """Make socket connects (and DNS look-ups) raise NetworkBlocked until the block exits."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo
    real_create_connection = socket.create_connection

    def is_loopback(address) -> bool:
        host = address[0] if isinstance(address, tuple) else address
        return allow_loopback and host in ("127.0.0.1", "::1", "localhost")

    def refuse(what, address):
        raise NetworkBlocked(f"network access blocked ({what} {address!r})")

    def connect(self, address):
        if self.family == socket.AF_UNIX or is_loopback(address):
            return real_connect(self, address)
        refuse("connect", address)

    def connect_ex(self, address):
        if self.family == socket.AF_UNIX or is_loopback(address):
            return real_connect_ex(self, address)
        refuse("connect", address)

    def getaddrinfo(host, *args, **kwargs):
        if is_loopback((host,)):
            return real_getaddrinfo(host, *args, **kwargs)
        refuse("resolve", host)

    def create_connection(address, *args, **kwargs):
        if is_loopback(address):
            return real_create_connection(address, *args, **kwargs)
        refuse("connect", address)

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.getaddrinfo = getaddrinfo
    socket.create_connection = create_connection
    try:
        yield
    finally:
        socket.socket.connect = real_connect
        socket.socket.connect_ex = real_connect_ex
        socket.getaddrinfo = real_getaddrinfo
        socket.create_connection = real_create_connection
