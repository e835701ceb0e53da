"""python -m inferlab SUBCOMMAND ...: the command line (inferlab.cli); `python -m inferlab --help` lists it."""

from __future__ import annotations

import sys

from inferlab.cli import build_parser, main, run_command_line

__all__ = ["build_parser", "main", "run_command_line"]

if __name__ == "__main__":
    sys.exit(run_command_line())
