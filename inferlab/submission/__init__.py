"""A run as it is handed in: pack.py writes one run folder, with what was attached to it later, as one .tar.gz
beside a submission.json; archive.py reads such an archive back, every entry checked before a byte is written.
Nothing here scores: grading/ and the command line read submissions through these two modules."""
