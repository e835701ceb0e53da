"""Analytic tests run with every network connection refused; they need no model files."""

import pytest

from inferlab import protocol
from inferlab.specimen.netguard import block_network


@pytest.fixture(autouse=True, scope="module")
def no_network():
    """Refuse sockets and DNS for each module here (module scope: it is undone before other test dirs run)."""
    with block_network():
        yield


@pytest.fixture(autouse=True, scope="module")
def protocol_threads():
    """The protocol's intra-op thread count: on a busy 2-core machine, extra threads only spin and wait."""
    import torch  # here, not at import: a pytest-xdist controller loads this file and runs no test

    previous = torch.get_num_threads()
    torch.set_num_threads(protocol.INTRA_OP_THREADS)
    yield
    torch.set_num_threads(previous)
