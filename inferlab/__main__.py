"""python -m inferlab SUBCOMMAND ...: the command line (inferlab.cli); `python -m inferlab --help` lists it."""

import sys

from inferlab.cli import build_parser, main, run_command_line  # noqa: F401 (the tests call main)

if __name__ == "__main__":
    sys.exit(run_command_line())
