"""A run as it is read after its session: runview.py (the one reader), verify.py (is it as its session wrote it?),
addenda.py (what is kept beside it afterwards: the explanation, a revised cache criterion)."""
