"""verl: ``reward`` (``compute_score`` and ``KeyshotRewardManager``, loaded by verl by path or as
``pkg://keyshot.frameworks.verl.reward``) and ``state`` (what the adapter remembers per shared model, in a
normally imported module). Tested through verl's released reward loop in .venv-verl
(tests/reward/test_verl.py, tests/framework/verl_reward_loop.py)."""
