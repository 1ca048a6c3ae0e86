"""The daemon on one server (design note 008): event log, reconcile loop, local
backend and HTTP API. Nothing here is imported by ``core`` or ``model``."""
