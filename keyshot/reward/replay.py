"""The replay stand-in environment: a recorded trajectory folder shown one screenshot per step.

The implementation is ``keyshot.infer.reward.replay``; this is its public name.
"""

from keyshot.infer.reward.replay import *  # noqa: F403
