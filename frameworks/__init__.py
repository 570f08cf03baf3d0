"""keyshot inside the RL frameworks (docs/reward.md): one package per framework, each holding that
framework's reward adapter and, where it has one, its environment (docs/contributing.md, "Add an RL
framework"):

- ``trl``: TRL's GRPOTrainer and AsyncGRPOTrainer: reward functions (``reward``) and the browser
  environments of ``environment_factory`` (``env``);
- ``openrlhf``: OpenRLHF's ``reward_func`` file and multi-turn agent base (``reward``), its agent executor
  (``executor``, where OpenRLHF is installed);
- ``verl``: verl's ``compute_score`` and reward manager (``reward``), what the adapter remembers per
  process (``state``);
- ``openenv``: OpenEnv's rubric (``rubric``) and keyshot's live pages on OpenEnv's own server (``server``,
  ``wire``, ``serving``; ``keyshot reward env``: ``command``);
- ``command``: ``keyshot reward`` (``filter`` and ``serve`` of the reward floor, ``env`` of ``openenv``).

This floor sits above the reward floor (``keyshot.reward``) and the environment floor (``keyshot.env``)
and may import both; nothing below imports it, and no framework's package imports another's
(tests/project/test_layers.py). A framework's released code is imported only inside its package, and
only where that framework is installed (each has a venv of its own: ``make setup-openrlhf``, ...).
"""
