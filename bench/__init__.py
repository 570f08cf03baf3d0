"""Benchmarks: each measures keyshot against a baseline in the same run and prints the ratio.

Run them from the repository's root as modules (they import keyshot, installed, and their shared code from
this package; none edits ``sys.path``)::

    .venv/bin/python -m bench.images --json runs/bench/images.json    # one benchmark
    .venv/bin/python -m bench                                         # make bench: every one that fits here
    .venv/bin/python -m bench.results                                 # RESULTS.md and RESULTS.png again

A benchmark is ``bench/<name>.py``, named by what it measures. Its ``rows_of(figures)`` turns its JSON into
the tables, headline figures and notes of a run (``bench/record.py``); its main ends with ``record.finish``,
which prints those rows and, with ``--json x.json``, writes the figures there and the rows beside them
(``x.rows.json``) with when, at which commit, by which command and on which machine it ran.
``bench/catalog.py`` lists every benchmark in the order of RESULTS.md, with what ``make bench`` passes it or
why ``make bench`` leaves it out (long, or a GPU). ``bench/rows/`` keeps the rows RESULTS.md is made from:
``<name>.json`` is the last run ``make bench`` made (its next run replaces it); ``<name>.<label>.json`` is a
run of its own (a long one, other arguments, a figure measured elsewhere or kept by hand), copied there and
kept until someone removes it (a newer run of the same thing supersedes it: remove the old file then). RESULTS.md is never edited: to add a figure, add its row file and run ``python -m
bench.results``. The GPU kit's own page, RESULTS-gpu.md, is made the same way
from ``bench/rows/gpu/``, one row file a lent machine's run (``gpu.py --json`` writes it).
"""
