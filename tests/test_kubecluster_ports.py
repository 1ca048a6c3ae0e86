"""The Kubernetes test cluster's start is bounded and leaves nothing behind (fixes,
point 4): a component that finds its port taken (another cluster starting on this
machine, an outgoing connection's ephemeral port) makes the start begin again on fresh
ports, every process of the failed try stopped; ports taken in every try end in an
error, again with nothing left running. One cluster at a time: the start lock
serialises them. Uses the binaries ``deploy/k8s/build.sh`` built (skips, saying why,
without them); a SIGALRM deadline bounds each start, so nothing can hang the run."""

from __future__ import annotations

import signal
import socket
from contextlib import contextmanager

import pytest

from gpushepherd.backends import BackendError, kubecluster


class Deadline(BaseException):
    """The block ran past its deadline (a ``BaseException``: no ``except Exception`` of
    the code under test swallows it)."""


@contextmanager
def deadline(seconds: float):
    """Raise ``Deadline`` in the test if the block runs past ``seconds``."""
    def fire(*_):
        raise Deadline(f"not done in {seconds:g} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def rigged(tmp_path, monkeypatch):
    """``(cluster, held port, picks, spawned)``: a cluster whose first ``free_ports``
    pick puts its API server on a port a listening socket holds; ``spawned`` lists every
    process it launched."""
    why = kubecluster.unavailable()
    if why:
        pytest.skip(f"Kubernetes: {why}")
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]  # the API server's port is base + 2
    spawned = []
    real_spawn = kubecluster.KubeCluster._spawn

    def spawn(self, name, args):
        real_spawn(self, name, args)
        spawned.append(self.procs[name])
    monkeypatch.setattr(kubecluster.KubeCluster, "_spawn", spawn)
    c = kubecluster.KubeCluster(tmp_path / "cluster")
    try:
        yield c, taken, monkeypatch, spawned
    finally:
        c.stop()
        held.close()
        assert all(p.poll() is not None for p in spawned), [(p.args[0], p.pid) for p in spawned if p.poll() is None]


def test_a_start_whose_port_is_taken_starts_again_on_fresh_ports(rigged):
    c, taken, monkeypatch, spawned = rigged
    real, picks = kubecluster.free_ports, []

    def free_ports(n):
        picks.append(taken - 2 if not picks else real(n))
        return picks[-1]
    monkeypatch.setattr(kubecluster, "free_ports", free_ports)
    with deadline(400):
        c.start()
    assert len(picks) == 2 and c.port == picks[1] + 2 != taken
    assert c.core().read_namespace("default").metadata.name == "default"  # it serves
    first = [p for p in spawned if p not in c.procs.values()]
    assert first and all(p.poll() is not None for p in first)  # the failed try's processes are gone
    assert any(kubecluster.PORT_TAKEN in (c.dir / f"{n}.log").read_text(errors="replace")
               for n in ("etcd", "kube-apiserver"))


def test_ports_taken_in_every_try_end_in_an_error_with_nothing_left(rigged):
    c, taken, monkeypatch, spawned = rigged
    monkeypatch.setattr(kubecluster, "free_ports", lambda n: taken - 2)
    with deadline(400), pytest.raises(BackendError, match=rf"(?s){kubecluster.PORT_TAKEN}.*in each of "
                                                          rf"{kubecluster.START_TRIES} tries"):
        c.start()
    assert not c.procs and spawned and all(p.poll() is not None for p in spawned)
    assert not list(c.dir.glob("*.pid"))
