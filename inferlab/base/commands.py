"""How a command is spelled wherever inferlab prints one for a reader to type: the terminal summary, the guidance, the
report, the errors. Every stage prints commands, so this sits below all of them (the command line itself is the top)."""

from __future__ import annotations

PROG = "inferlab"  # the console script `make` installs (pyproject.toml); `python -m inferlab` is the same parser
VENV_BIN = ".venv/bin"  # where `make` puts the environment's programs, relative to the project folder


def spelled(args: str, program: str = PROG) -> str:
    """A command as the terminal, the guidance, the report and the errors print it: `spelled("verify DIR")` is
    `.venv/bin/inferlab verify DIR`, and `spelled("-m inferlab.standin DIR", "python")` the environment's Python.

    Typed as printed in the project folder it runs this project's environment whatever is first on PATH, with no
    step before it; the text is the same on every machine, so a report rendered again elsewhere is identical.
    """
    return f"{VENV_BIN}/{program} {args}"
