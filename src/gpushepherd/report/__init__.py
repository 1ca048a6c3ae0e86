"""Showback/chargeback, the weekly report and what-if on a store's history (note 010)."""

from gpushepherd.report.figures import Report, build_report
from gpushepherd.report.history import History, HistoryError, replay

__all__ = ["History", "HistoryError", "Report", "build_report", "replay"]
