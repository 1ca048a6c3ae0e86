"""The README's first server example reaches the server the way a client does by
default: over `shepherd-data/shepherd.sock` when run from the folder that holds it. It
exported `SHEPHERD_SERVER=http://127.0.0.1:8765` as "the default": that variable makes
every command skip the socket and talk HTTP, where a server run as root refuses each
submission without a token ("user: 'root' is not allowed without a token")."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from gpushepherd.cli.daemon import local_socket

ROOT = Path(__file__).resolve().parents[1]


def _first_server_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Run it on one server", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_first_server_example_does_not_set_an_http_server():
    block = _first_server_block()
    assert "shepherd server --data-dir shepherd-data" in block
    assert not re.search(r"^\s*export\s+SHEPHERD_SERVER=", block, re.M)
    assert "shepherd-data/shepherd.sock" in block


def test_from_the_data_dirs_parent_a_client_uses_its_socket(tmp_path, monkeypatch):
    (tmp_path / "shepherd-data").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "shepherd-data" / "shepherd.sock"))
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("SHEPHERD_SERVER", raising=False)
        monkeypatch.delenv("SHEPHERD_SOCKET", raising=False)
        assert local_socket(None, None) == Path("shepherd-data/shepherd.sock")
        monkeypatch.setenv("SHEPHERD_SERVER", "http://127.0.0.1:8765")  # what the README exported
        assert local_socket(None, None) is None  # HTTP: the socket is skipped
    finally:
        sock.close()
