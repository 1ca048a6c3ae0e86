"""The interpreter settings of the ``shepherd server`` process (design note 032).

The server is one process: uvicorn's event loop (the HTTP side) and the reconcile loop
thread share one GIL, so the CPU time per submission bounds the throughput, and every
GIL release in one thread (an SQLite statement, a socket write) can make the other wait
for the switch interval. ``tune_server_process`` sets, once the daemon has started:

* the garbage collector: everything allocated by the start (imports, the FastAPI app,
  the replayed state) frozen out of the collections (``gc.freeze``), and a young
  generation of ``GC_THRESHOLD[0]`` objects instead of 700 - each request allocates
  hundreds of containers, and the default made a collection every few requests and a
  full one over the whole job table every few thousand;
* the switch interval: ``SWITCH_INTERVAL_S`` (``None``: Python's 5 ms, kept - 0.5 ms,
  meant to shorten a thread's wait for the GIL after a short GIL-free call, measured no
  better in CPU per submission or in latency; ``bench/api_submit.py --switch-interval``).

Process-wide: called by the server's command and by ``bench/api_submit.py``, never by
the ``Daemon`` itself (a test process holding many daemons keeps the defaults).
"""

from __future__ import annotations

import gc
import sys

#: ``gc.set_threshold`` of the server process (the default is ``(700, 10, 10)``)
GC_THRESHOLD = (20_000, 20, 10)
#: ``sys.setswitchinterval`` of the server process, seconds; ``None``: Python's (0.005)
SWITCH_INTERVAL_S: float | None = None


def tune_server_process(switch_interval_s: float | None = SWITCH_INTERVAL_S, gc_tuned: bool = True) -> None:
    """Apply the settings above to this process (call it once the daemon has started,
    before serving). ``switch_interval_s=None`` keeps the interpreter's switch
    interval; ``gc_tuned=False`` the collector's defaults (the bench's comparisons)."""
    if gc_tuned:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLD)
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)
