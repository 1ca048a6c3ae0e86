"""``shepherd demo`` on a machine where the server is slow to start (a fresh clone's
first run; a busy machine): the workload's times count from a server that answers, so
the inference burst still comes 8 s after the training job, as the script says
(``gpushepherd.daemon.demo``).
Counted from before the start, a fresh clone's 6 s start left 2 s between them, and a
9 s start sent the whole workload at once."""

from __future__ import annotations

import time

from gpushepherd.daemon import demo


def test_a_slow_server_start_keeps_the_script_and_every_promise(tmp_path, monkeypatch):
    enter = demo.DemoServer.__enter__

    def slow_enter(self):
        out = enter(self)
        time.sleep(9.0)  # longer than the 8 s between the first submissions and the burst
        return out

    monkeypatch.setattr(demo.DemoServer, "__enter__", slow_enter)
    events: list[tuple[float, str]] = []
    result = demo.run_demo(tmp_path, on_event=lambda t, text: events.append((t, text)))
    failed = [(name, detail) for name, ok, detail in result.checks if ok is False]
    assert not failed, f"{failed}\n" + "\n".join(f"{t:6.1f} {x}" for t, x in events)
    submitted = {text.split()[1]: t for t, text in events if text.startswith("submitted ")}
    assert submitted["inference-burst"] - submitted["train-llm"] >= 7.5, submitted
