"""The pure scheduling core: events in, decisions out. No clock, no I/O, no randomness."""

from gpushepherd.core.scheduler import Scheduler, SpecError, validate_spec

__all__ = ["Scheduler", "SpecError", "validate_spec"]
