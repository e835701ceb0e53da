"""Children that a test signals: they start with the default handlers, whatever the suite itself inherited.

A suite started with SIGINT ignored (`nohup make test`, `make test &` in a script, some CI runners) passes
SIG_IGN on to every child, and a child Python that inherits SIG_IGN for SIGINT never installs its
KeyboardInterrupt handler: a Ctrl-C sent by the test would then do nothing. `restore_default_signals` runs
in the child between fork and exec, so the new interpreter sees SIG_DFL and sets up its usual handlers;
`subprocess.Popen(restore_signals=True)` does not help here: it resets only the signals Python itself set to
SIG_IGN (SIGPIPE, SIGXFSZ), not one ignored by whoever started the suite.
"""

from __future__ import annotations

import signal
import subprocess

SIGNALLED = (signal.SIGINT, signal.SIGTERM)


def restore_default_signals() -> None:
    """In the child before exec: the signals a test sends get their default handlers back."""
    for signum in SIGNALLED:
        signal.signal(signum, signal.SIG_DFL)


def popen_signallable(args, **kwargs) -> subprocess.Popen:
    """subprocess.Popen for a child the test will signal: SIGINT and SIGTERM at their defaults, no stdin."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(args, preexec_fn=restore_default_signals, **kwargs)
