"""``keyshot report``: a browsable, self-contained HTML report of a judged run (see :mod:`infer.report.build`)."""

from infer.report.build import build_report

__all__ = ["build_report"]
