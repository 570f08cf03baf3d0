"""Run folders: the one-writer lock, run.json (one record for every kind of run: a judge's protocol, a
synthesis run's manifest), deterministic shards and their checks, the merge of shards (one skeleton for
verdicts and labels), run summaries and their files, and the reader of verdicts from any source (a run,
a released record file).

May import: ``common``, ``protocol``, ``loaders``.
"""
