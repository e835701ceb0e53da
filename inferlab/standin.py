"""`python -m inferlab.standin DIR`, the command the docs, the specimen specs and earlier runs name: it builds the
stand-in with inferlab.synthetic.standin, where the code lives since the layout by stage (docs/architecture.md).
Imported, this name is that module itself, so `from inferlab import standin` keeps working too."""

import sys

from inferlab.synthetic import standin as _module

if __name__ == "__main__":
    sys.exit(_module.main())
else:
    sys.modules[__name__] = _module
