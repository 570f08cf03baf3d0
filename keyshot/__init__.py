"""keyshot: cheap, reliable WebJudge for web agents.

The package's code lives in six floors, each importable on its own (docs/architecture.md):

- ``keyshot.infer``: the protocol and its runtime (trajectories, the judge and scorer calls, runs,
  metrics, reports, the ``keyshot`` command);
- ``keyshot.reward``: keyshot as an RL reward (the model, the episode recorder, the rollout filter and
  the service);
- ``keyshot.env``: where episodes come from (a replay, live MiniWoB pages);
- ``keyshot.frameworks``: one package per RL framework (TRL, OpenRLHF, verl, OpenEnv), its reward adapter
  and its environment (``keyshot reward env``);
- ``keyshot.data_synth``: teacher labels distilled into a Hugging Face dataset;
- ``keyshot.train``: the scorer's fine-tuning recipe.

What most users call is re-exported here, loaded on first use (``import keyshot`` stays light)::

    from keyshot import load_trajectories, WebJudge, webjudge_from_config, JudgeRunConfig, load_config
    from keyshot.reward import RewardModel, Episode  # keyshot as an RL reward (docs/reward.md)
"""

from __future__ import annotations

from keyshot.infer.common.lazy import lazy_exports

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "Trajectory": "keyshot.infer.loaders.trajectory",
    "Screenshot": "keyshot.infer.loaders.trajectory",
    "load_trajectories": "keyshot.infer.loaders",
    "load_trajectory": "keyshot.infer.loaders",
    "Verdict": "keyshot.infer.protocol.verdicts",
    "read_verdicts": "keyshot.infer.protocol.verdicts",
    "load_prompt_set": "keyshot.infer.protocol.prompts",
    "ImagePolicy": "keyshot.infer.protocol.images",
    "prepare_image": "keyshot.infer.protocol.images",
    "parse_score": "keyshot.infer.protocol.parsing",
    "parse_status": "keyshot.infer.protocol.parsing",
    "parse_key_points": "keyshot.infer.protocol.parsing",
    "load_config": "keyshot.infer.common.config",
    "KeyshotError": "keyshot.infer.common.errors",
    "JudgeRunConfig": "keyshot.infer.judge.config",
    "WebJudge": "keyshot.infer.judge.pipeline",
    "webjudge_from_config": "keyshot.infer.judge.scorer_factory",
    "PipelineConfig": "keyshot.infer.judge.pipeline",
    "compute_metrics": "keyshot.infer.metrics.compute",
    "RewardModel": "keyshot.reward",
    "RewardResult": "keyshot.reward",
    "Episode": "keyshot.reward",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
