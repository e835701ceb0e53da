"""The course's grading carried to Gradescope: autograder.py writes the autograder zip and is what its two scripts
(autograder_scripts.py) run in Gradescope's container. It scores nothing itself: every score comes from grading/,
every handed-in archive is read by submission/."""
