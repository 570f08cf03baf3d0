"""keyshot's live MiniWoB pages as an OpenEnv environment, served by OpenEnv's own server
(``keyshot reward env``, docs/reward.md): ``server`` (the environment in OpenEnv's BrowserGym wire format
and its app; needs OpenEnv, ``make setup-openenv``), ``wire`` (a page as that format's fields),
``serving`` (what the server is started with, and the start: pages budgeted, the first opened, uvicorn) and
``command`` (the subcommand, registered under ``keyshot reward`` through an entry point). The reward is
an OpenEnv rubric found by name (the ``keyshot.openenv.rubrics`` entry points: keyshot's is
``keyshot.reward.openenv.KeyshotRubric``), so this floor imports nothing of the reward floor's."""
