# Registers the inferlab plugin; inferlab/plugin.py wires its options, hooks and fixtures.
pytest_plugins = ["inferlab.plugin"]
