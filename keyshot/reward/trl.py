"""TRL's GRPOTrainer reward functions and the environment recorder.

The implementation is ``keyshot.infer.reward.trl``; this is its public name. Frameworks that load a file
by path (no package context) may be given this file: it imports everything by absolute name.
"""

from keyshot.infer.reward.trl import *  # noqa: F403
