"""A finished run as it is read: the one reader (runview.py), older layouts upgraded (schema.py), the addenda written
after a session (addenda.py, addenda_store.py), and what a run computed that does not depend on the clock
(deterministic.py)."""
