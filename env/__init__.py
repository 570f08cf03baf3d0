"""Where episodes come from (docs/reward.md): environments an agent acts in, each recording a
:class:`keyshot.reward.episode.Episode` that keyshot's reward scores.

- ``replay``: a recorded trajectory folder shown one screenshot per step (the stand-in environment);
- ``miniwob``: live MiniWoB pages in Chromium (BrowserGym's MiniWoB in a worker process of its own).

This floor imports ``keyshot.reward.episode`` and the ground floor (``keyshot.infer``), nothing else of
the reward floor.
"""
