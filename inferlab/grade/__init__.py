"""Grading on the course's own run: a handed-in run or archive earns the machine-measured items by agreeing with
the course's run (against.py), the writing earns its items from the learner's texts (grade.py), and no submission
scores above an honest complete run."""
