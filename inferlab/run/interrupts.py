"""The signals a session receives, kept for its records, so that an interrupted run never reads as finished.

A SIGINT or SIGTERM stops the session the way Ctrl-C always does (KeyboardInterrupt). Code that
swallows the exception (torch can turn it into a RuntimeError inside a trial) does not keep the
next signal from stopping the run. Once pytest is stopping (it has seen the interrupt) or writing
the final records, one more signal is noted and does not tear those writes; the one after that
abandons them: one line says so and the process exits at once with 128 + the signal's number (130
for SIGINT), with no traceback from whatever library happened to be running. Every signal is
remembered, so the records never read as an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, Optional

WATCHED = ("SIGINT", "SIGTERM")


class SignalWatch:
    """Installs handlers for WATCHED signals and remembers each one received, by name, in order."""

    def __init__(self, exit_process: Callable[[int], None] = os._exit):
        self.received: list[str] = []  # before the final records began
        self.during_finish: list[str] = []  # while they were written
        self.stopping = False  # pytest has seen the interrupt and is unwinding
        self.finishing = False  # the final records are being written
        self.absorbed = 0  # signals noted without raising, while stopping or finishing
        self._previous: dict = {}
        self._exit_process = exit_process
        # Called when the final records are abandoned: flush what is written, and say where the run stands.
        self.on_abandon: Optional[Callable[[], str]] = None

    def install(self) -> bool:
        """Install the handlers (main thread only); False when they cannot be installed here."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for name in WATCHED:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)
        return True

    def restore(self) -> None:
        """Put back the handlers that were there before install()."""
        for signum, handler in self._previous.items():
            try:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, TypeError, OSError):
                pass
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        (self.during_finish if self.finishing else self.received).append(name)
        if not (self.stopping or self.finishing):
            raise KeyboardInterrupt(f"{name} received")
        self.absorbed += 1
        if self.absorbed > 1:
            self._abandon(signum, name)
            return
        # Raising here would cut short pytest's own clean-up or the final records, and a manifest
        # written by a half-finished clean-up is how an interrupted run came to read as complete.
        sys.stderr.write(f"\ninferlab: {name} received; the run is stopping and writing its final records "
                         f"(seconds). Send it once more to abandon them.\n")
        sys.stderr.flush()

    def _abandon(self, signum: int, name: str) -> None:
        """Stop now, in one line: raising here would unwind through whatever ran (a plot, a file write)
        and print its whole traceback. The records stay as they are: a run whose final manifest was not
        written keeps the one from its start, which says it did not finish."""
        status = 128 + signum
        try:
            where = self.on_abandon() if self.on_abandon is not None else ""
        except Exception as error:  # the line must still be printed, and the process must still stop
            where = f"(where the run stands is unknown: {type(error).__name__}: {error})"
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            sys.stderr.write(f"\ninferlab: {name} received again: the final records are abandoned, exiting with "
                             f"status {status}. {where}".rstrip() + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        self._exit_process(status)
