"""Grading on the course's own run: a submission's grade (grade.py), the one comparison with the course's run
(against.py), its formats, the pack archive and the Gradescope bundle."""
