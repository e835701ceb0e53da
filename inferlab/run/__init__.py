"""A run as it is written: its lifecycle (claim, emit, finish, manifest) and the one writer of its documents.

    lifecycle.py  claim_run() and Run: the session from its claim to its final manifest (no pytest)
    writers.py    the make_* functions: every record's envelope, the harness's record kinds, plan and manifest
    options.py    the options and markers as data, the path options checked before anything is written
"""
