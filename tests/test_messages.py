"""inferlab.measure.messages: warnings and library log messages captured around model calls."""

from __future__ import annotations

import logging
import warnings

import pytest

from inferlab.measure.messages import capture_messages


def test_capture_sees_library_log_records_and_python_warnings():
    with capture_messages() as messages:
        logging.getLogger("transformers.generation.utils").warning("probe-log")
        logging.getLogger("torch.probe").warning("probe-torch-log")
        warnings.warn("probe-warning", UserWarning)
    assert any("probe-log" in m and m.startswith("transformers logger") for m in messages)
    assert any("probe-torch-log" in m and m.startswith("torch logger") for m in messages)
    assert any("probe-warning" in m and m.startswith("UserWarning") for m in messages)


def test_capture_sees_warnings_even_when_the_library_is_set_quieter():
    library = logging.getLogger("transformers")
    before = library.level
    library.setLevel(logging.ERROR)
    try:
        with capture_messages() as messages:
            logging.getLogger("transformers.modeling_utils").warning("quiet-probe")
        assert any("quiet-probe" in m for m in messages)
        assert library.level == logging.ERROR  # restored
    finally:
        library.setLevel(before)


def test_capture_leaves_no_handler_behind():
    loggers = [logging.getLogger(name) for name in ("transformers", "torch")]
    before = [list(logger.handlers) for logger in loggers]
    with capture_messages():
        pass
    assert [list(logger.handlers) for logger in loggers] == before


def test_messages_are_complete_when_the_block_raises():
    messages = []
    with pytest.raises(RuntimeError):
        with capture_messages() as messages:
            warnings.warn("before-the-failure", UserWarning)
            raise RuntimeError("a trial timeout, say")
    assert any("before-the-failure" in m for m in messages)


def test_info_messages_are_not_captured():
    with capture_messages() as messages:
        logging.getLogger("transformers.x").info("just-info")
    assert messages == []
