"""Test doubles, synthetic worlds and the helpers that the tests and the benchmarks share (the demo uses
some too); a helper only tests use lives in tests/support instead (bench/ does not import tests/).

* :mod:`keyshot.infer.testing.fake_openai`: a local OpenAI-compatible server with deterministic WebJudge
  answers and injected faults (it stands in for paid judge APIs; the scorer path uses real vLLM). It
  re-exports the ``fake_*`` modules, one per job: requests, scoring rules, responders, faults, the
  server, the subprocess.
* :mod:`keyshot.infer.testing.cue_world`: a learnable world of screenshots whose relevance depends on the task.
* :mod:`keyshot.infer.testing.frameworks`: a framework venv's python (vLLM, OpenRLHF, verl, OpenEnv).
* :mod:`keyshot.infer.testing.launch`: ``keyshot reward serve`` and ``keyshot reward env`` started on a
  port the kernel chooses; the one reader of a process's output lines.
* :mod:`keyshot.infer.testing.watch`: waiting for a moment while a process runs, killing it at that moment.
* :mod:`keyshot.infer.testing.images`: made-up screenshots and their encoded bytes.

Nothing in the runtime package imports these.
"""
