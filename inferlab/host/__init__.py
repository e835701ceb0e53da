"""The machine and the Python environment a run records (environment.py, machine.py), and how .venv is built from
the lock (installation.py)."""
