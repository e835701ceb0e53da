"""Grading finished runs for a course: readers of a run (through inferlab.reading.runview) that never write into a run
folder and load no model, except replayed.py (the grader's own copy, for grade --replay).

    rubric.py     the points per checklist item (a TOML file; default_rubric.toml ships beside it)
    evidence.py   a check, its status (pass, fail, manual) and its evidence (file, record kind, seq)
    items.py      the lab's seven submission checklist items as concrete checks over a RunView
    grade.py      one run graded: items, integrity (verify's problems), findings, score, exit status, not_checked
    recompute.py  every decision recomputed from the files, every summary flag checked against them
    harness.py    the run's source hashes against the grader's installed copy, file by file
    requirements.py  the rubric's requirements (specimen, lock, the grader's source, replay) as item checks
    measures.py   the few measurements a class table shows (cache error, TTFT medians, decode ratio)
    formats.py    text, json, junit, gradescope and csv output
    reference.py  the instructor's reference from a trusted run, and a run compared with it
    likeness.py   what two submissions of a class share (a run, records, timings, written work), and who submits
    wording.py    how alike two texts are by their word shingles (the class view's near copies)
    timing_sides.py  a claimed run's timings beside the course's run: medians, ratios, contradicted effects
    decoded.py    every recorded id decoded again with the grader's own copy of the tokenizer
    classview.py  the class page: every submission's items, the pairs that share evidence, one plot across the
                  class's machines
    replayed.py   grade --replay: each run re-executed on the grader's copy (inferlab.recheck.replay), folded into
                  its grade
    batch.py      many runs graded in one call, in this process or in --jobs N processes
    stale_report.py  whether the run's report.md is the one its records render now

A handed-in archive is written and read by inferlab/submission/, the Gradescope autograder is inferlab/gradescope/.
The command line is inferlab/cli/grade.py, reference.py, pack.py and autograder.py; docs/grading.md is the user's
page.
"""
