"""keyshot as a reward model for web-agent RL (docs/reward.md); users import it as ``keyshot.reward``.

- :class:`RewardModel` (``model``): WebJudge over rollouts, one :class:`RewardResult` each, in order;
- :class:`Episode` (``episode``): the recorder an environment keeps, spilled to disk as it goes;
- ``rollouts``: what a rollout may be (folder, Trajectory, Episode, dict) and its one reader;
- ``shared`` (one model per config and process, batched from any thread) on ``loop_thread`` (the model's
  own event loop, started with the model and ended by ``close()``); ``logs`` (the log fields every adapter
  reports and the service's counters, named in one table);
- ``rollout_filter`` (rejection sampling) and ``service`` (the HTTP service, FastAPI), with ``command``
  (``keyshot reward filter|serve``) wiring them.

The adapters for RL frameworks (TRL, OpenRLHF, verl, OpenEnv) live a floor above, one package each in
``keyshot.frameworks``. This floor imports keyshot.infer (never its test room), never env, frameworks,
data_synth or train.

    from keyshot.reward import RewardModel, Episode
    rm = RewardModel.from_config("configs/reward/trl.yaml")
    results = rm.score_sync(rollouts)
"""

from __future__ import annotations

from keyshot.infer.common.lazy import lazy_exports

#: public name -> module that defines it, imported on first use: importing one module of this floor
#: (the environment floor imports ``keyshot.reward.episode`` alone) loads that module only, not the model,
#: the judge pipeline or their fork hooks
_EXPORTS = {
    "Episode": "keyshot.reward.episode",
    "FailureKind": "keyshot.reward.model",
    "RewardModel": "keyshot.reward.model",
    "RewardResult": "keyshot.reward.model",
    "RewardSettings": "keyshot.reward.model",
    "RolloutError": "keyshot.reward.rollouts",
    "sample_logs": "keyshot.reward.logs",
    "score_shared": "keyshot.reward.shared",
    "score_shared_sync": "keyshot.reward.shared",
    "shared_model": "keyshot.reward.shared",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
