"""What every stage uses and which imports no other part of inferlab: how a whole file is written at a path
(outputs.py, the one atomic writer) and how a run's records are written (records.py)."""
