"""TRL (``GRPOTrainer``, ``AsyncGRPOTrainer``): ``reward`` (keyshot's reward functions and
``KeyshotEnvironment``) and ``env`` (browser environments for ``environment_factory``: live MiniWoB pages,
a replay, OpenEnv's BrowserGym server). Tested through TRL's released trainer (tests/reward/test_trl.py,
tests/env/test_trl_browsergym_example.py)."""
