"""Logging that cannot flood (design note 017): one line per kind of failure per
interval, the repeats counted into the next line."""

from __future__ import annotations

import logging
import threading
import time


class RateLog:
    """Log at most one line per ``kind`` every ``interval_s`` seconds (default 60).

    The first occurrence of a kind is logged at once; repeats within the interval are
    counted, and the next line logged for that kind says how many were left out. A
    traceback is logged only at DEBUG (``exception``), so a failure that repeats every
    loop step costs one line a minute.

    Args:
        logger: where the lines go.
        interval_s: seconds between two lines of one kind.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, clock=time.monotonic):
        self.logger, self.interval_s, self.clock = logger, interval_s, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def _due(self, kind: str) -> int | None:
        """``None``: hold this one back; else the count of repeats held back before it."""
        now = self.clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                return None
            self._last[kind] = now
            return self._held.pop(kind, 0)

    def log(self, level: int, kind: str, msg: str, *args) -> bool:
        """Log ``msg % args`` at ``level`` unless a line of ``kind`` went out within the
        interval; returns whether it was logged."""
        held = self._due(kind)
        if held is None:
            return False
        if held:
            msg += f" ({held} more like it in the last {self.interval_s:.0f} s)"
        self.logger.log(level, msg, *args)
        return True

    def error(self, kind: str, msg: str, *args) -> bool:
        """``log`` at ERROR."""
        return self.log(logging.ERROR, kind, msg, *args)

    def warning(self, kind: str, msg: str, *args) -> bool:
        """``log`` at WARNING."""
        return self.log(logging.WARNING, kind, msg, *args)

    def exception(self, kind: str, msg: str, *args) -> bool:
        """``log`` at ERROR with the current exception's type and message on the line,
        its traceback at DEBUG only."""
        import sys

        exc = sys.exc_info()[1]
        logged = self.log(logging.ERROR, kind, msg + (f": {type(exc).__name__}: {exc}".replace("%", "%%") if exc else ""), *args)
        if logged and exc is not None:
            self.logger.debug("traceback of the failure above", exc_info=exc)
        return logged
