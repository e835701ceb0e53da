"""One total time limit for an acquisition: the lock wait, every connection and every body draw on it."""

from __future__ import annotations

import time

from inferlab import protocol
from inferlab.specimen.spec import SpecimenError


class DeadlineExpired(SpecimenError):
    """The acquisition deadline passed; the message names the deadline and what was being waited for."""


class Deadline:
    """A fixed end time on the monotonic clock, set when the acquisition starts."""

    def __init__(self, seconds: float = protocol.ACQUISITION_DEADLINE_S):
        if not seconds > 0:
            raise ValueError(f"deadline: expected a positive number of seconds, actual {seconds!r}")
        self.seconds = float(seconds)
        self._end = time.monotonic() + self.seconds

    def remaining(self) -> float:
        """Seconds left, never below zero."""
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        """Whether the end time has passed."""
        return time.monotonic() >= self._end

    def error(self, doing: str) -> DeadlineExpired:
        """The error that names this deadline as the reason, for an acquisition cut off while `doing`."""
        return DeadlineExpired(
            f"the acquisition deadline of {self.seconds:g} s expired while {doing}. "
            f"Nothing partial was kept. A hub that stalls or sends too slowly is cut off at this limit "
            f"(protocol.ACQUISITION_DEADLINE_S); try again later, or pass --artifacts DIR with a verified copy."
        )

    def check(self, doing: str) -> None:
        """Raise DeadlineExpired if the end time has passed."""
        if self.expired():
            raise self.error(doing)
