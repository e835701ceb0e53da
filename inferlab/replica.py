"""`python -m inferlab.replica DIR`: build the replica into a new or empty DIR (inferlab/specimen/build.py)."""

import sys

from inferlab.specimen import build_command


def main(argv=None) -> int:
    """The command: exit 0 with the files' sizes and hashes as JSON, or 2 with one line saying why not."""
    return build_command("replica", argv)


if __name__ == "__main__":
    sys.exit(main())
