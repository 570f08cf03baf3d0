"""Helpers the tests share, one home each: a helper that a bench (bench/) uses too lives in the package's
test room, ``keyshot.infer.testing`` (bench/ never imports tests/), and one that only tests use lives here.

In ``keyshot.infer.testing``: the fake OpenAI server and synthetic worlds, ``frameworks`` (a framework venv's
python), ``launch`` (``keyshot reward serve`` and ``keyshot reward env`` started on a free port, a process's
output lines), ``watch`` (waiting for a moment, killing a run at it), ``images`` (made-up screenshots).
Here: the paths (``paths``), the shared fixtures and what tests alone need (a skip naming a missing
framework venv, ``frameworks``; the vLLM server; the tiny model's training set-ups, ``tiny_model`` and ``scorer_batch``; reward configs; the synthesis and SLURM set-ups; the judge's fixture inputs, ``judge_inputs``; sharded runs, ``shard_runs``; report pages, ``report_pages``; a two-node Ray cluster, ``ray_cluster``)."""
