"""The machine and the Python environment a run records (environment.py, machine.py); the Makefile builds .venv."""
