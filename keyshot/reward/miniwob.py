"""Live episodes: BrowserGym's MiniWoB tasks in Debian's Chromium (`make setup-browser`).

The implementation is ``keyshot.infer.reward.miniwob``; this is its public name.
"""

from keyshot.infer.reward.miniwob import *  # noqa: F403
