"""The constructed specimens, built offline: the weights recipe (recipe.py), the stand-in (standin.py), the replica
(replica.py), and a tiny GPT-NeoX for the harness's own tests (tiny_model.py)."""
