"""keyshot as a reward model for web-agent RL (docs/reward.md); users import it as ``keyshot.reward``.

- :class:`RewardModel` (``model``): WebJudge over rollouts, one :class:`RewardResult` each, in order;
- :class:`Episode` (``episode``): the recorder an environment keeps, spilled to disk as it goes;
- ``rollouts``: what a rollout may be (folder, Trajectory, Episode, dict) and its one reader;
- ``shared`` (one model per config and process, batched from any thread) on ``loop_thread`` (the model's
  own event loop, started with the model and ended by ``close()``); ``logs`` (the log fields every adapter
  reports);
- adapters: ``trl`` (reward functions for GRPOTrainer), ``openrlhf`` (``reward_func`` and a multi-turn
  agent base), ``verl`` (``compute_score``);
- ``command`` (``keyshot reward filter|serve``) and ``service`` (the HTTP service, FastAPI).

This floor imports keyshot.infer (never its test room), never env, data_synth or train.

    from keyshot.reward import RewardModel, Episode
    rm = RewardModel.from_config("configs/reward/trl.yaml")
    results = rm.score_sync(rollouts)
"""

from keyshot.reward.episode import Episode
from keyshot.reward.logs import batch_metrics, sample_logs
from keyshot.reward.model import FailureKind, RewardModel, RewardResult, RewardSettings
from keyshot.reward.rollouts import RolloutError
from keyshot.reward.shared import score_shared, score_shared_sync, shared_model

__all__ = [
    "Episode",
    "FailureKind",
    "RewardModel",
    "RewardResult",
    "RewardSettings",
    "RolloutError",
    "batch_metrics",
    "sample_logs",
    "score_shared",
    "score_shared_sync",
    "shared_model",
]
