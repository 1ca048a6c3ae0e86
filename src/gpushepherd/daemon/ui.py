"""The web dashboard at ``/ui`` (design note 012).

``/ui/`` serves three static files shipped with the package (``daemon/ui/``:
``index.html``, ``app.js``, ``style.css``) without a token: they hold no data. The page
polls the JSON API (pages of ``/jobs``, ``/nodes``, ``/usage``, ``/policy``; one job's
``/jobs/{id}`` and its logs; ``/report``) with the token the user typed, if the server
needs one; every time on it is in the policy's ``clock.timezone`` (note 029). ``GET /ui/plots/{name}.png`` renders the report's
plots (note 010) for the last day from the store's event log, behind the API's auth.
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, HTTPException
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

UI_DIR = Path(__file__).with_name("ui")
PLOTS = ("utilisation", "queue", "quota")
DAY_S = 86400.0


class PlotCache:
    """The report's three plots over ``[now - range_s, now)`` as PNG bytes, built at most
    once per ``ttl_s`` seconds (one build at a time: concurrent callers wait for it).

    Args:
        batches: returns the event log's batches (``Store.batches``), replayed by
            ``gpushepherd.report.replay``.
        clock: epoch seconds (the daemon's time axis); injectable for tests.
    """

    def __init__(self, batches: Callable[[], object], ttl_s: float = 60.0, range_s: float = DAY_S,
                 clock: Callable[[], float] = time.time):
        self.batches, self.ttl_s, self.range_s, self.clock = batches, ttl_s, range_s, clock
        self.lock = threading.Lock()
        self.built_at: float | None = None
        self.pngs: dict[str, bytes] = {}
        self.builds = 0

    def png(self, name: str) -> bytes:
        """PNG bytes of plot ``name`` (one of ``PLOTS``).

        Raises:
            KeyError: ``name`` is not one of ``PLOTS``.
            gpushepherd.report.HistoryError: the event log is empty.
        """
        if name not in PLOTS:
            raise KeyError(name)
        with self.lock:
            now = self.clock()
            if self.built_at is None or not 0 <= now - self.built_at < self.ttl_s:
                self.pngs = self._build(now)
                self.built_at = now
                self.builds += 1
            return self.pngs[name]

    def _build(self, now: float) -> dict[str, bytes]:
        from gpushepherd.report import build_report, replay
        from gpushepherd.report.render import plots

        rep = build_report(replay(self.batches()).history(), now - self.range_s, now, title="last day")
        return {k: base64.b64decode(v) for k, v in plots(rep).items()}


def mount_ui(app: FastAPI, batches: Callable[[], object]) -> PlotCache:
    """Add the dashboard to ``app``: ``GET /ui/plots/{name}.png`` (under the app's auth
    dependencies, like every API route) and the static page at ``/ui/`` (open: a
    ``StaticFiles`` mount inherits no dependency). Call it after the API's routes.

    Returns the plot cache (its ``builds`` count is what tests look at).
    """
    cache = PlotCache(batches)

    @app.get("/ui/plots/{name}.png", response_class=Response,
             responses={200: {"content": {"image/png": {}}}})
    def plot(name: str) -> Response:
        """One of the report's plots over the last day (``utilisation``, ``queue``,
        ``quota``), rendered from the event log at most once a minute (note 012).
        404 naming the allowed names for any other; 503 while the log is empty, or
        without the ``report`` extra (pandas, matplotlib; the body says how to install it)."""
        from gpushepherd.extras import MissingExtra, require

        if name not in PLOTS:
            raise HTTPException(404, f"plot {name!r}: no such plot; allowed: {', '.join(PLOTS)}")
        try:
            require("report", "GET /ui/plots", ("pandas", "matplotlib"))
            from gpushepherd.report import HistoryError
        except MissingExtra as exc:
            raise HTTPException(503, str(exc)) from None
        try:
            data = cache.png(name)
        except KeyError:
            raise HTTPException(404, f"plot {name!r}: no such plot; allowed: {', '.join(PLOTS)}") from None
        except HistoryError as exc:
            raise HTTPException(503, f"no plots yet: {exc}") from None
        return Response(data, media_type="image/png", headers={"Cache-Control": "no-store"})

    app.mount("/ui", StaticFiles(directory=UI_DIR, html=True), name="ui")
    return cache
