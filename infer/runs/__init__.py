"""Run folders: the one-writer lock, run.json (the recorded protocol), deterministic shards and their
checks, run summaries, and the reader of verdicts from any source (a run, a released record file).

May import: ``common``, ``protocol``, ``loaders``.
"""
