"""Logging for keyshot's commands: one set-up, the HTTP libraries' per-request lines kept quiet."""

from __future__ import annotations

import logging

#: Libraries that log every request (URLs, and with the openai client at DEBUG the request bodies with
#: their base64 screenshots): warnings only, whatever keyshot's own level.
QUIET_LIBRARIES = ("httpx", "httpx2", "httpcore", "openai", "urllib3", "filelock")


def setup_logging(
    level: int = logging.INFO, fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s"
) -> None:
    logging.basicConfig(level=level, format=fmt, datefmt="%H:%M:%S")
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
