"""A run as it is written (no pytest here): records.py the one writer of its folder, session.py the Run from its
claim to its final manifest, plan.py the schedule and the prerequisites, endings.py how a session ends."""
