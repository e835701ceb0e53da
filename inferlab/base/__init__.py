"""What every stage uses and which imports no other part of inferlab: how files are written (records.py)."""
