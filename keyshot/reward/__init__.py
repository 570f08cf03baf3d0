"""keyshot as a reward for web-agent RL (docs/reward.md): the public name of ``keyshot.infer.reward``.

    from keyshot.reward import RewardModel, Episode
    rm = RewardModel.from_config("configs/reward/trl.yaml")
    results = rm.score_sync(rollouts)

One module per framework: ``keyshot.reward.trl`` (GRPOTrainer reward functions), ``keyshot.reward.openrlhf``
(the reward-function file and the multi-turn agent base), ``keyshot.reward.verl`` (``compute_score``).
"""

from keyshot.infer.reward import Episode, RewardModel, RewardResult, RewardSettings, RolloutError
from keyshot.infer.reward.logs import batch_metrics, sample_logs
from keyshot.infer.reward.shared import score_shared, score_shared_sync, shared_model

__all__ = [
    "Episode",
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
