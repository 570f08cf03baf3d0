"""keyshot as a reward model for web-agent RL (docs/reward.md); users import it as ``keyshot.reward``.

- :class:`RewardModel` (``model``): WebJudge over rollouts, one :class:`RewardResult` each, in order;
- :class:`Episode` (``episode``): the recorder an environment keeps, spilled to disk as it goes;
- ``rollouts``: what a rollout may be (folder, Trajectory, Episode, dict) and its one reader;
- ``shared`` (one model per config and process, batched from any thread) on ``loop_thread`` (the model's
  own event loop); ``logs`` (the log fields every adapter reports);
- adapters: ``trl`` (reward functions for GRPOTrainer), ``openrlhf`` (``reward_func`` and a multi-turn
  agent base), ``verl`` (``compute_score``);
- ``command`` (``keyshot reward filter|serve``) and ``service`` (the HTTP service, FastAPI).

This room may import every room of keyshot.infer below it, never data_synth or train.
"""

from keyshot.infer.reward.episode import Episode
from keyshot.infer.reward.model import RewardModel, RewardResult, RewardSettings
from keyshot.infer.reward.rollouts import RolloutError

__all__ = ["Episode", "RewardModel", "RewardResult", "RewardSettings", "RolloutError"]
