"""A tester's find (stop 38): a service whose replicas no node could ever hold was
created, and its loop then submitted a replica every step, each rejected at once (38
jobs in 8 s, each in the event log) until the service was deleted. It is now refused at
create, as ``POST /jobs`` rejects such a job (422 naming why), and a service whose
replicas a later policy makes impossible submits none (``ServiceRegistry.reconcile``)."""

from __future__ import annotations

import time

from builders import in_process_api
from test_services import POLICY


def _service(tmp_path, **over) -> dict:
    return {"name": "web", "class": "batch", "team": "ml", "gpus": 1, "command": ["sleep", "60"],
            "cwd": str(tmp_path), "min_replicas": 1, "max_replicas": 2, "metric": "queue_length",
            "metrics_url": None, "scale_up_above": 10, "scale_down_below": 2, "scrape_every_s": 0.2, **over}


def test_a_service_whose_replicas_never_fit_is_refused_at_create_and_submits_nothing(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:  # one node of 2 GPUs
        r = client.post("/services", json=_service(tmp_path, gpus=3))
        assert r.status_code == 422, r.text
        assert "each replica would be rejected" in r.text and "gpus=3" in r.text, r.text
        time.sleep(1.0)  # the loop runs every 0.05 s here: a service would have submitted replicas
        assert client.get("/jobs").json() == []
        assert client.get("/services").json() == []
        ok = client.post("/services", json=_service(tmp_path, gpus=2))
        assert ok.status_code == 201, ok.text
