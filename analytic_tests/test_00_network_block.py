"""The offline guarantee is tested, not assumed: an external connect inside these tests raises."""

import socket

import pytest

from inferlab.specimen.netguard import NetworkBlocked

# TEST-NET addresses (RFC 5737): never routable, so a failure to raise cannot be a lucky timeout.
EXTERNAL = ("203.0.113.7", 443)


def test_external_connection_is_refused():
    with pytest.raises(NetworkBlocked):
        socket.create_connection(EXTERNAL, timeout=1)


def test_raw_socket_connect_is_refused():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        with pytest.raises(NetworkBlocked):
            sock.connect(EXTERNAL)


def test_hub_host_name_does_not_resolve():
    with pytest.raises(NetworkBlocked):
        socket.getaddrinfo("huggingface.co", 443)
