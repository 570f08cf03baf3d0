"""verl's custom reward function (`custom_reward_function.path` this file's path, `name: compute_score`).

The implementation is ``keyshot.infer.reward.verl``; this is its public name. Frameworks that load a file
by path (no package context) may be given this file: it imports everything by absolute name.
"""

from keyshot.infer.reward.verl import *  # noqa: F403
