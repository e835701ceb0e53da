"""A finished run judged again: its deterministic parts computed again on this machine's copy (replay.py), its saved
cache logits under a revised criterion (revise.py)."""
