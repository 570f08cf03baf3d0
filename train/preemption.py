"""Preemption-safe training: save a resumable checkpoint on SIGUSR1/SIGTERM and leave for a requeue.

SLURM sends ``USR1`` some minutes before a time limit or preemption (``#SBATCH --signal=USR1@300``
in ``slurm/train.sh``) and ``TERM`` when it cancels; ``accelerate``/``torchrun`` forward ``TERM`` to
their workers. :class:`PreemptionWatch` turns either signal into a flag; the recipe checks it after
each optimizer step (all ranks agree through an all-reduce), saves a checkpoint at that step and
raises :class:`Preempted`. ``train/sft.py`` then writes ``RUN/preempted.json`` (and the file named by
``$KEYSHOT_PREEMPTED_FILE``, which ``slurm/train.sh`` watches to ``scontrol requeue`` the job) and
exits with :data:`EXIT_REQUEUE`. The next launch of the same command resumes from that checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

logger = logging.getLogger(__name__)

EXIT_REQUEUE = 75  # EX_TEMPFAIL: "try again"
PREEMPTED_FILE = "preempted.json"
ENV_MARKER = "KEYSHOT_PREEMPTED_FILE"
SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class Preempted(Exception):
    """Training stopped at ``step`` for ``signum`` after saving a checkpoint."""

    def __init__(self, signum: int, step: int):
        self.signum = signum
        self.step = step
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")


class PreemptionWatch:
    """Records SIGUSR1/SIGTERM instead of dying; :meth:`requested` says when to save and leave."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.signum is None:
            logger.warning("%s received: saving a checkpoint at the next step", signal.Signals(signum).name)
        self.signum = signum

    def requested(self, accelerator) -> bool:
        """True on every rank once any rank got a signal (one all-reduce of a flag when distributed)."""
        if accelerator.num_processes == 1:
            return self.signum is not None
        if self.signum is not None:
            accelerator.set_trigger()
        return accelerator.check_trigger()

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def clear_marker(run_dir: Path) -> None:
    (run_dir / PREEMPTED_FILE).unlink(missing_ok=True)


def write_marker(run_dir: Path, stop: Preempted) -> None:
    """Say that the run stopped to be resumed (for people, and for slurm/train.sh's requeue)."""
    record = {"step": stop.step, "signal": signal.Signals(stop.signum).name}
    (run_dir / PREEMPTED_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")
    marker = os.environ.get(ENV_MARKER)
    if marker:
        Path(marker).write_text(json.dumps({**record, "run_dir": str(run_dir)}) + "\n", encoding="utf-8")
