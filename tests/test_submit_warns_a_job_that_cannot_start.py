"""``shepherd submit`` of a job that no placement or limit in force lets start
(``ExceedsCapacity``: e.g. 2 GPUs for a team capped at 1) accepts it and keeps it
pending, as Slurm keeps a job over a QOS limit (without ``DenyOnLimit``) and Kueue an
inadmissible workload, and now says so at once on stderr, with the reason and how to
drop it. Before, it printed "Submitted job 1" only and the job waited for ever unless
someone looked at ``shepherd queue``."""

from __future__ import annotations

from typer.testing import CliRunner

from builders import in_process_api, route_cli_to
from gpushepherd.cli.main import app
from test_daemon import POLICY


def test_submit_warns_of_a_job_that_cannot_start_and_not_of_one_that_can(tmp_path, monkeypatch):
    with in_process_api(tmp_path, POLICY.replace("ml: {}", "ml: {max_gpus: 1}")) as client:
        route_cli_to(client, monkeypatch)
        base = ["submit", "-c", "batch", "-A", "ml", "-D", str(tmp_path)]
        over = CliRunner().invoke(app, [*base, "-G", "2", "--", "true"])
        assert over.exit_code == 0, over.stderr
        assert over.stdout.strip() == "Submitted job 1"
        assert ("warning: job 1 cannot start under the policy and cluster as they are: "
                "ExceedsCapacity(teams.ml.max_gpus=1); it waits until they change (shepherd cancel 1 drops it)"
                in " ".join(over.stderr.split()))
        assert client.get("/jobs/1").json()["state"] == "PENDING"
        fits = CliRunner().invoke(app, [*base, "-G", "1", "--", "true"])
        assert fits.exit_code == 0 and fits.stdout.strip() == "Submitted job 2"
        assert "warning" not in fits.stderr
