# Registers the inferlab plugin; all of its options, hooks and fixtures live in inferlab/plugin.py.
pytest_plugins = ["inferlab.plugin"]
