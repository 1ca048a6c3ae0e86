"""Size limits of a policy (design note 017), one set for every way a policy comes in:
``shepherd policy check FILE``, ``policy apply`` (``POST /policy``), ``shepherd server
--policy``. A policy that passes ``policy check`` is never refused by ``apply`` for its
size, and validating one within these limits takes well under a second.

A policy already in the event log is not checked again (an older log replays as it is).
"""

from __future__ import annotations

import json
from typing import Any

KIB = 1024
#: the policy file, bytes (YAML with its comments)
MAX_FILE_BYTES = 1024 * KIB
#: the policy as JSON (what ``policy apply`` sends and the event log stores), bytes; with
#: the request's other fields it stays under the API's 1 MiB body limit
MAX_JSON_BYTES = 768 * KIB
#: entries of each section
MAX_TEAMS = 5000
MAX_CLASSES = 200
MAX_NODE_GROUPS = 1000
MAX_POOLS = 200
MAX_COHORTS = 500
#: time windows of one team or class
MAX_WINDOWS = 64
#: teams in one parent chain (a team, its parent, its parent's parent, ...)
MAX_TEAM_DEPTH = 32
#: the most GPUs or jobs one limit or quota may name (``max_gpus``, ``nominal_gpus``,
#: ``max_running_jobs``, ... and their windows; ``policy.load``): far above any cluster
#: and far below ``UNLIMITED`` (10**12, how a limit nobody set reads), so that a value is
#: shown (``policy check``) and exported (``/metrics``) as given, never as "unlimited"
MAX_COUNT = 10**9

_SECTIONS = (("teams", None, MAX_TEAMS), ("classes", None, MAX_CLASSES), ("cohorts", None, MAX_COHORTS),
             ("cluster", "nodes", MAX_NODE_GROUPS), ("cluster", "pools", MAX_POOLS))


def json_size(raw: Any) -> int:
    """Bytes of ``raw`` as compact ASCII JSON (the most any JSON client sends for it)."""
    return len(json.dumps(raw, default=str, separators=(",", ":")))


def size_problem(raw: Any) -> tuple[str, Any, str] | None:
    """The first limit a parsed policy exceeds, as ``(field path, value, what is
    allowed)``, or ``None``. Counts only: linear in the policy's size."""
    if not isinstance(raw, dict):
        return None
    for top, sub, limit in _SECTIONS:
        section = raw.get(top)
        if sub is not None:
            section = section.get(sub) if isinstance(section, dict) else None
        if isinstance(section, (dict, list)) and len(section) > limit:
            path = f"{top}.{sub}" if sub else top
            return path, f"{len(section):,} entries", f"at most {limit:,} (gpushepherd.policy.limits)"
    for top in ("teams", "classes"):
        section = raw.get(top)
        if not isinstance(section, dict):
            continue
        for name, entry in section.items():
            windows = entry.get("windows") if isinstance(entry, dict) else None
            if isinstance(windows, list) and len(windows) > MAX_WINDOWS:
                return (f"{top}.{name}.windows", f"{len(windows):,} windows",
                        f"at most {MAX_WINDOWS} per {top[:-1]} (gpushepherd.policy.limits)")
    size = json_size(raw)
    if size > MAX_JSON_BYTES:
        return ("", None, f"{size:,} bytes as JSON is not allowed: at most {MAX_JSON_BYTES:,} bytes as JSON (what "
                "policy apply sends; gpushepherd.policy.limits)")
    return None
