"""Test doubles and synthetic worlds used by the tests, the benchmarks and the demo.

* :mod:`keyshot.infer.testing.fake_openai`: a local OpenAI-compatible server with deterministic WebJudge
  answers and injected faults (it stands in for paid judge APIs; the scorer path uses real vLLM). It
  re-exports the ``fake_*`` modules, one per job: requests, scoring rules, responders, faults, the
  server, the subprocess.
* :mod:`keyshot.infer.testing.cue_world`: a learnable world of screenshots whose relevance depends on the task.

Nothing in the runtime package imports these.
"""
