"""Hook specifications of the inferlab plugin. Implement them in a conftest.py to extend a run."""

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_inferlab_record(config, record):
    """Called once for every record of a run, as soon as it exists.

    ``record`` is a plain dict with at least ``kind``, ``test`` (the test's node id, or None
    for a session record), ``seq`` (0, 1, 2 ... in write order) and ``wall_time`` (UTC,
    ISO-8601). The default implementation is ``trylast`` and appends the record as one line
    to ``<record dir>/records.jsonl``, flushed and fsynced; earlier implementations may add
    fields but must not remove any. Example, in a conftest.py::

        def pytest_inferlab_record(config, record):
            if record["kind"] == "test_outcome" and record["outcome"] == "failed":
                print("failed:", record["test"])
    """


@hookspec
def pytest_inferlab_manifest(config, manifest):
    """Called before each write of ``manifest.json`` (at session start and end).

    ``manifest`` is the dict about to be written; add keys to it in place. Example::

        def pytest_inferlab_manifest(config, manifest):
            manifest["course"] = {"lab": 12, "section": "B"}
    """
