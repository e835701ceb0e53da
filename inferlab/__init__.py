"""inferlab: a pytest-based experiment that measures token selection and repeated computation
on one tiny, pinned language model, on CPU. See README.md."""

__version__ = "0.1.0"
