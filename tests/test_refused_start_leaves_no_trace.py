"""A ``shepherd server`` that refuses to start leaves no trace (note 084): what can refuse
the start - the data dir, the policy file, the Unix socket's place, the port - is checked
before anything is written, and the socket is bound before ``--policy`` is logged. Before
the fix a start refused for its ``--socket`` had already applied and logged its policy
(a later start showed the new version, audited ``ok``), and an invalid policy or a
new data dir without one left ``shepherd.db`` and ``server.lock`` behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpushepherd.daemon.store import Store
from test_daemon import POLICY, Server, free_port

V2 = POLICY.replace("ml: {}", "ml: {max_gpus: 2}")


def server(data: Path, *args: str) -> subprocess.CompletedProcess:
    """``shepherd server`` on a free loopback port, to be refused: its exit and output."""
    cmd = [sys.executable, "-m", "gpushepherd.cli.main", "server", "--data-dir", str(data), "--port",
           str(free_port()), "--inventory", "static", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def logged(data: Path) -> tuple[list[int], list[str]]:
    """The policy versions in ``data``'s log and the outcomes of its policy-apply rows."""
    store = Store(Store.sqlite_url(data))
    try:
        versions = [h["version"] for h in store.policy_history()]
        applies = [e["outcome"] for e in store.audit_entries(actions=["policy-apply"])]
    finally:
        store.close()
    return versions, applies


@pytest.mark.parametrize("sock", ["/nonexistent/dir/s.sock",  # refused by the checks before anything
                                  "/proc/shepherd-test.sock"])  # checks pass, the bind fails (lock held)
def test_a_start_refused_for_its_socket_logs_no_policy(tmp_path, sock):
    s = Server(tmp_path)
    s.start()  # version 1
    s.stop()
    assert logged(s.data) == ([1], ["ok"])
    new = tmp_path / "v2.yaml"
    new.write_text(V2)

    r = server(s.data, "--policy", str(new), "--socket", sock)
    assert r.returncode == 2, r.stderr
    assert f"error: --socket {sock}: cannot listen there" in r.stderr, r.stderr
    assert "policy version 2" not in r.stderr + r.stdout
    assert logged(s.data) == ([1], ["ok"])  # nothing applied, nothing audited

    s.start(policy=False)  # a later start without --policy: still version 1
    try:
        assert [h["version"] for h in httpx.get(s.url + "/policy/history", timeout=60).json()] == [1]
    finally:
        s.stop()


def test_an_invalid_policy_or_a_new_data_dir_without_one_creates_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY.replace("ml: {}", "ml: {max_gpus: -1}"))
    data = tmp_path / "d6"
    r = server(data, "--policy", str(bad))
    assert r.returncode == 2 and "max_gpus" in r.stderr and "-1 is not allowed" in r.stderr, r.stderr
    assert not data.exists()

    r = server(data)  # no --policy, no database yet
    assert r.returncode == 2 and "no policy: pass --policy FILE" in r.stderr, r.stderr
    assert not data.exists()

    good = tmp_path / "good.yaml"
    good.write_text(POLICY)
    r = server(data, "--policy", str(good), "--socket", str(tmp_path / "missing" / "s.sock"))
    assert r.returncode == 2 and "cannot listen there" in r.stderr, r.stderr
    assert not data.exists()

    r = server(data, "--policy", str(good), "--host", "0.0.0.0", "--insecure-http")  # a new data dir has no token
    assert r.returncode == 2 and "only a loopback address" in r.stderr, r.stderr
    assert not data.exists()


def test_a_relative_socket_in_a_new_relative_data_dir_is_allowed(tmp_path, monkeypatch):
    """Review of note 084: ``cd X && shepherd server --data-dir B --socket B/s.sock`` was
    refused ("B is not a folder"): the socket's folder (relative) was compared with the
    resolved data dir. A folder that is missing says so."""
    from gpushepherd.cli.daemon import start_failure

    monkeypatch.chdir(tmp_path)
    policy = tmp_path / "p.yaml"
    assert start_failure(Path("B"), None, policy, Path("B/s.sock"), "127.0.0.1") is None
    assert start_failure(Path("B"), None, policy, Path("B/../B/s.sock"), "127.0.0.1") is None
    why = start_failure(Path("B"), None, policy, Path("C/s.sock"), "127.0.0.1")
    assert why == "--socket C/s.sock: cannot listen there: C does not exist", why
    (tmp_path / "F").write_text("")
    why = start_failure(Path("B"), None, policy, Path("F/s.sock"), "127.0.0.1")
    assert why == "--socket F/s.sock: cannot listen there: F is not a folder", why


def test_a_live_socket_is_never_taken_over_a_stale_one_is(tmp_path):
    """Review of note 084: ``--socket`` naming another running server's socket removed
    that file and bound its own. A socket something answers on refuses the start at the
    bind, under the data dir's lock (a second server on the same data dir is still told
    the lock is held), the new data dir removed; a stale one (refused) is replaced."""
    import socket as socketlib

    from gpushepherd.daemon.unixsock import listen_unix, live_socket

    live = tmp_path / "live.sock"
    other = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    other.bind(str(live))
    other.listen(1)
    try:
        ino = os.stat(live).st_ino
        assert live_socket(live)
        with pytest.raises(OSError, match="another process listens on it"):
            listen_unix(live)
        assert os.stat(live).st_ino == ino  # still the other process's

        data = tmp_path / "d"
        good = tmp_path / "good.yaml"
        good.write_text(POLICY)
        r = server(data, "--policy", str(good), "--socket", str(live))
        assert r.returncode == 2, r.stderr
        assert f"error: --socket {live}: cannot listen there: another process listens on it" in r.stderr, r.stderr
        assert os.stat(live).st_ino == ino and not data.exists()
    finally:
        other.close()
    assert not live_socket(live)  # stale now: the file stays, nothing answers
    sock = listen_unix(live)  # the stale file removed, bound again
    try:
        assert live_socket(live)
    finally:
        sock.close()


def test_a_start_refused_at_the_bind_removes_the_data_dir_it_made(tmp_path):
    """Review of note 084: a refused bind on a new data dir (``--socket /proc/x.sock``,
    which the checks before the start cannot tell) left ``shepherd.db``, ``server.lock``
    and ``shepherd.db.open-lock`` behind. The start removes the folders it made and the
    files it wrote there; a data dir that existed keeps everything."""
    good = tmp_path / "good.yaml"
    good.write_text(POLICY)
    data = tmp_path / "new" / "d"
    r = server(data, "--policy", str(good), "--socket", "/proc/shepherd-test.sock")
    assert r.returncode == 2 and "cannot listen there" in r.stderr, r.stderr
    assert not (tmp_path / "new").exists(), sorted(p.name for p in (tmp_path / "new").rglob("*"))

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("x")
    r = server(kept, "--policy", str(good), "--socket", "/proc/shepherd-test.sock")
    assert r.returncode == 2 and "cannot listen there" in r.stderr, r.stderr
    assert (kept / "mine.txt").exists() and kept.is_dir()


def test_unmake_removes_only_what_a_start_writes(tmp_path):
    from gpushepherd.cli.daemon import missing_dirs, unmake

    data = tmp_path / "a" / "b"
    made = missing_dirs(data)
    assert made == [data, tmp_path / "a"]
    data.mkdir(parents=True)
    for name in ("shepherd.db", "server.lock", "shepherd.db.open-lock", "other.txt"):
        (data / name).write_text("")
    unmake(made)
    assert sorted(p.name for p in data.iterdir()) == ["other.txt"]  # not a start's: kept, with its folders
    assert missing_dirs(tmp_path) == []
