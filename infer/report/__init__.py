"""``keyshot report``: a browsable, self-contained HTML report of a judged run (see :mod:`keyshot.infer.report.build`)."""

from keyshot.infer.report.build import build_report

__all__ = ["build_report"]
