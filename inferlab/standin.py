"""`python -m inferlab.standin DIR`: build the synthetic stand-in into a new or empty DIR (inferlab/specimen/build.py)."""

import sys

from inferlab.specimen import build_command


def main(argv=None) -> int:
    """The command: exit 0 with the files' sizes and hashes as JSON, or 2 with one line saying why not."""
    return build_command("standin", argv)


if __name__ == "__main__":
    sys.exit(main())
