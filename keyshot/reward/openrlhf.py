"""OpenRLHF's reward-function file (`--reward.remote_url` this file's path) and multi-turn agent base.

The implementation is ``keyshot.infer.reward.openrlhf``; this is its public name. Frameworks that load a file
by path (no package context) may be given this file: it imports everything by absolute name.
"""

from keyshot.infer.reward.openrlhf import *  # noqa: F403
