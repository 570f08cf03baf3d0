"""OpenEnv: keyshot's reward as an OpenEnv rubric (``rubric``: :class:`KeyshotRubric`) and keyshot's live
MiniWoB pages as an OpenEnv environment, served by OpenEnv's own server (``keyshot reward env``,
docs/reward.md): ``server`` (the environment in OpenEnv's BrowserGym wire format and its app), ``wire`` (a
page as that format's fields), ``serving`` (what the server is started with, and the start: pages
budgeted, the first opened, the rubric built, uvicorn) and ``command`` (the subcommand's options). The
modules that import OpenEnv (``rubric``, ``server``) need it installed (``make setup-openenv``); the
others import it only when the server starts."""
