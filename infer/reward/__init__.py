"""keyshot as a reward model for web-agent RL (docs/reward.md).

- :class:`RewardModel` (``model``): WebJudge over rollouts, one :class:`RewardResult` each, in order;
- :class:`Episode` (``episode``): the recorder an environment keeps, spilled to disk as it goes;
- ``rollouts``: what a rollout may be (folder, Trajectory, Episode, dict) and how it is read;
- adapters: ``trl`` (reward functions for GRPOTrainer), ``openrlhf`` (``reward_func`` and a multi-turn
  agent base), ``verl`` (``compute_score``);
- ``command`` (``keyshot reward filter|serve``) and ``service`` (the HTTP service, FastAPI).

This room may import every room of keyshot.infer below it, never data_synth or train.
"""

from keyshot.infer.reward.episode import Episode
from keyshot.infer.reward.model import RewardModel, RewardResult, RewardSettings
from keyshot.infer.reward.rollouts import RolloutError

__all__ = ["Episode", "RewardModel", "RewardResult", "RewardSettings", "RolloutError"]
