"""Judging: the three WebJudge calls, the pipeline over one trajectory, the scorer back-ends (endpoint,
pool, in-process), a run's config, inputs and fingerprint, and the ``keyshot judge`` / ``keyshot
merge`` commands.

May import: every room of ``keyshot.infer`` except ``report``; never ``data_synth`` or ``train``.
"""
