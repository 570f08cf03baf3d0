"""OpenRLHF: ``reward`` (the ``reward_func`` file OpenRLHF loads by path, and ``KeyshotAgentInstance``, the
multi-turn agent base) and ``executor`` (its ``AgentExecutor``, which imports OpenRLHF). Tested through
OpenRLHF's released code in .venv-openrlhf (tests/reward/test_openrlhf.py, tests/framework/openrlhf_*.py)."""
