"""``keyshot reward``: its subcommands gathered from the floors that hold them: ``filter`` and ``serve``
(the reward floor's, :mod:`keyshot.reward.command`) and ``env`` (OpenEnv's, :mod:`keyshot.frameworks.openenv.command`).
This module only names them; it sits on the frameworks floor, which may import both."""

from __future__ import annotations

from keyshot.frameworks.openenv.command import ENV
from keyshot.infer.common.command import Command
from keyshot.reward.command import FILTER, SERVE

COMMAND = Command(
    "reward",
    help="keyshot as a reward model: rejection sampling (filter), the HTTP service (serve), live pages on "
    "OpenEnv's server (env)",
    subcommands=(FILTER, SERVE, ENV),
)
