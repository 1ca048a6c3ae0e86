"""The process table as the inventory needs it, read from ``/proc`` (Linux): process
groups' members, CPU time, owners and command lines. A process that vanishes while it
is read is simply absent."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable

#: clock ticks per second of ``/proc/<pid>/stat`` times
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (the state is ``[0]``,
    the process group ``[2]``, user and system CPU ticks ``[11]``, ``[12]``, the start
    time ``[19]``), or ``None`` when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses


def env_and_argv(pid: int) -> tuple[list[bytes], list[bytes]] | None:
    """``(environment entries, argv)`` of ``pid`` as raw ``NAME=VALUE`` and argument
    bytes (``/proc/<pid>/environ``, ``cmdline``), or ``None``: no such process, or not
    readable by this one."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    return env, argv


def group_members(pgids: Iterable[int]) -> dict[int, frozenset[int]]:
    """The live (not zombie) pids of each process group in ``pgids``, in one pass over
    ``/proc``; a group with none maps to an empty set."""
    want = {int(p) for p in pgids if p and p > 0}
    found: dict[int, set[int]] = {p: set() for p in want}
    if want and os.path.isdir("/proc"):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = stat_fields(int(entry))
                if fields and fields[0] not in "ZX" and int(fields[2]) in want:
                    found[int(fields[2])].add(int(entry))
    return {p: frozenset(s) for p, s in found.items()}


def cpu_ticks(pids: Iterable[int]) -> int:
    """User plus system CPU time of ``pids`` (not of their reaped children), in clock
    ticks (:data:`CLK_TCK` per second)."""
    total = 0
    for pid in pids:
        fields = stat_fields(pid)
        if fields:
            total += int(fields[11]) + int(fields[12])
    return total


def owner(pid: int) -> str | None:
    """The user name owning ``pid`` (its uid when the name is unknown), or ``None``
    when there is no such process."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def command(pid: int, limit: int = 200) -> str | None:
    """The command line of ``pid`` (arguments joined by spaces, at most ``limit``
    characters), ``[name]`` for a kernel thread, ``None`` when there is no such
    process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    text = " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    if not text:
        try:
            with open(f"/proc/{pid}/comm") as f:
                text = f"[{f.read().strip()}]"
        except OSError:
            return None
    return text[:limit]
