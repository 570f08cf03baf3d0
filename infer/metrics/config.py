"""The settings of a metrics run, in one dataclass: ``keyshot metrics``'s options take their defaults from
:data:`DEFAULTS`, and so do the library functions that take one of them (``label_2``, ``n_bins``, ...)."""

from __future__ import annotations

from dataclasses import dataclass

#: How Online-Mind2Web's human label 2 (not executable) counts: as not success (the paper), dropped, success.
LABEL_2_POLICIES = ("not_success", "drop", "success")
#: What the p_success threshold maximises on the tune split.
OBJECTIVES = ("agreement", "f1")
#: How the released records' outcome answers are read.
ARB_PARSE_MODES = ("reference", "strict")


@dataclass(frozen=True)
class MetricsConfig:
    """How verdicts are measured against the truth."""

    label_2: str = "not_success"
    objective: str = "agreement"
    #: seed of the task-hash tune/test split
    split_seed: str = "0"
    #: bins of the reliability diagram
    n_bins: int = 10
    arb_parse_mode: str = "reference"

    def __post_init__(self) -> None:
        for name, value, known in (
            ("label_2", self.label_2, LABEL_2_POLICIES),
            ("objective", self.objective, OBJECTIVES),
            ("arb_parse_mode", self.arb_parse_mode, ARB_PARSE_MODES),
        ):
            if value not in known:
                raise ValueError(f"{name} must be one of {', '.join(known)}, got {value!r}")
        if self.n_bins < 1:
            raise ValueError(f"n_bins must be >= 1, got {self.n_bins}")

    def calibration_options(self) -> dict:
        """The keywords of the calibration functions (:mod:`~keyshot.infer.metrics.operating`)."""
        return {
            "label_2": self.label_2,
            "objective": self.objective,
            "seed": self.split_seed,
            "n_bins": self.n_bins,
        }


DEFAULTS = MetricsConfig()
