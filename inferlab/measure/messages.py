"""Python warnings and library log messages, captured around model calls as plain strings for the records.

The experiment wraps every model forward it makes (generate(), the cache paths, the timing loop, the
memory prefills, batching) in capture_messages(), entered before and left after the whole call, so a
timed region's own code and clock reads are never inside the capture's setup or teardown.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator

from transformers.utils import logging as hf_logging

# The library loggers whose messages belong in a record: transformers' root logger does not
# propagate, and torch logs under its own name, so each gets a handler of its own.
LIBRARY_LOGGERS = ("transformers", "torch")


class _ListHandler(logging.Handler):
    """Appends each log record at WARNING or above to a list, naming the library and the logger."""

    def __init__(self, library: str, sink: list):
        super().__init__(level=logging.WARNING)
        self.library = library
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{self.library} logger {record.name} {record.levelname}: {record.getMessage()}")


@contextlib.contextmanager
def capture_messages(loggers: tuple = LIBRARY_LOGGERS) -> Iterator[list[str]]:
    """Collect Python warnings and the named libraries' log records (WARNING and above) into one list.

    Each logger's level is lowered to WARNING for the block when it is quieter, so a global verbosity
    setting cannot hide a warning, and transformers' warning_once memory is cleared, so each block
    reports its own messages. The list is complete when the block exits, also when it exits by an
    exception (a trial timeout, say), so a failed trial's record can still carry what was said.
    """
    messages: list[str] = []
    hf_logging.warning_once.cache_clear()
    installed = []
    for name in loggers:
        logger = logging.getLogger(name)
        handler = _ListHandler(name, messages)
        installed.append((logger, handler, logger.level))
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield messages
            finally:
                messages.extend(f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught)
    finally:
        for logger, handler, level in installed:
            logger.removeHandler(handler)
            logger.setLevel(level)
