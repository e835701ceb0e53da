"""The signals a session receives, kept for its records, so that an interrupted run never reads as finished.

A SIGINT or SIGTERM stops the session the way Ctrl-C always does (KeyboardInterrupt). Code that
swallows the exception (torch can turn it into a RuntimeError inside a trial) does not keep the
next signal from stopping the run. Once pytest is stopping (it has seen the interrupt) or writing
the final records, one more signal is noted and does not tear those writes; the one after that
abandons them. Every signal is remembered, so the records never read as an uninterrupted run.
"""

from __future__ import annotations

import signal
import sys
import threading

WATCHED = ("SIGINT", "SIGTERM")


class SignalWatch:
    """Installs handlers for WATCHED signals and remembers each one received, by name, in order."""

    def __init__(self):
        self.received: list[str] = []  # before the final records began
        self.during_finish: list[str] = []  # while they were written
        self.stopping = False  # pytest has seen the interrupt and is unwinding
        self.finishing = False  # the final records are being written
        self.absorbed = 0  # signals noted without raising, while stopping or finishing
        self._previous: dict = {}

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
            raise KeyboardInterrupt(f"{name} received again: the run's final records are abandoned")
        # Raising here would cut short pytest's own clean-up or the final records, and a manifest
        # written by a half-finished clean-up is how an interrupted run came to read as complete.
        sys.stderr.write(f"\ninferlab: {name} received; the run is stopping and writing its final records "
                         f"(seconds). Send it once more to abandon them.\n")
        sys.stderr.flush()
