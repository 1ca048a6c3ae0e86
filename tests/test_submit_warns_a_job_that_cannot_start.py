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


def _warned(stderr: str) -> list[str]:
    """The ``warning:`` lines of ``stderr``, each rejoined from rich's wrapping."""
    return [" ".join(w.split()) for w in " ".join(stderr.split("\n")).split("warning: ")[1:]]


def test_every_submit_path_warns_of_jobs_that_cannot_start_kept_arrays_and_sbatch(tmp_path, monkeypatch):
    """Found by a newcomer: the warning came only for a plain job. A job kept from the
    core by ``--begin``, ``--dependency`` or ``--hold`` read ``BeginTime(...)`` /
    ``Dependency(...)`` and an array read ``0/4 done, ...``, so ``ExceedsCapacity``
    was never said, though no begin time or dependency changes whether the job can ever
    start (a Slurm user gets "Requested node configuration is not available" from
    sbatch for any job that can never fit). The server now answers ``never_fits`` at
    submit, computed without the begin time or dependency."""
    with in_process_api(tmp_path, POLICY.replace("ml: {}", "ml: {max_gpus: 1}")) as client:
        cli = route_cli_to(client, monkeypatch)
        base = ["submit", "-c", "batch", "-A", "ml", "-D", str(tmp_path)]
        why = "ExceedsCapacity(teams.ml.max_gpus=1)"
        code, out, err = cli(*base, "-G", "2", "--begin", "now+1hour", "--", "true")
        assert (code, out.strip()) == (0, "Submitted job 1"), err
        assert _warned(err) == [f"job 1 cannot start under the policy and cluster as they are: {why}; it waits "
                                "until they change (shepherd cancel 1 drops it)"]
        assert client.get("/jobs/1").json()["reason"].startswith("BeginTime(")  # kept: its begin time first
        code, out, err = cli(*base, "-G", "2", "--dependency", "afterok:1", "--", "true")
        assert (code, out.strip()) == (0, "Submitted job 2") and len(_warned(err)) == 1, err
        assert _warned(err)[0].startswith(f"job 2 cannot start under the policy and cluster as they are: {why}")
        code, out, err = cli(*base, "-G", "2", "--hold", "--", "true")
        assert code == 0 and _warned(err)[0].startswith("job 3 cannot start"), err
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/sh\n#SBATCH -p batch\n#SBATCH -A ml\n#SBATCH --gpus 2\n#SBATCH --begin now+1hour\n"
                          "true\n")
        code, out, err = cli("sbatch", "-D", str(tmp_path), str(script))
        assert (code, out.strip()) == (0, "Submitted job 4"), err
        assert _warned(err)[0].startswith(f"job 4 cannot start under the policy and cluster as they are: {why}")
        code, out, err = cli(*base, "-G", "2", "--array", "0-3", "--", "true")
        assert (code, out.strip()) == (0, "Submitted array 5"), err
        assert _warned(err) == [f"array 5 (tasks 0-3) cannot start under the policy and cluster as they are: {why}; "
                                "its tasks wait until they change (shepherd cancel 5 drops them)"]
        body = {"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": str(tmp_path), "hold": True}
        assert client.post("/jobs", json={**body, "gpus": 2}).json()["never_fits"] == why  # the API's fact
        assert client.post("/jobs", json={**body, "gpus": 1}).json()["never_fits"] is None
        for fits in (["--array", "0-1"], ["--begin", "now+1hour"], ["--dependency", "afterany:1"], ["--hold"]):
            code, out, err = cli(*base, "-G", "1", *fits, "--", "true")
            assert code == 0 and "warning" not in err, (fits, err)


def test_a_kept_job_no_node_could_ever_hold_is_rejected_at_submit_as_a_plain_one(tmp_path, monkeypatch):
    """Before, ``--begin`` / ``--dependency`` / ``--hold`` with 9 GPUs on a 4-GPU
    cluster was accepted, kept, and rejected only when released (maybe hours later); a
    plain job is rejected at once (exit 3) and an array refused (422). A kept job is
    now rejected at submit as the plain one, with the same reason."""
    with in_process_api(tmp_path, POLICY) as client:
        cli = route_cli_to(client, monkeypatch)
        base = ["submit", "-c", "batch", "-A", "ml", "-D", str(tmp_path), "-G", "9"]
        plain = cli(*base, "--", "true")
        assert plain[0] == 3, plain
        for n, extra in enumerate((["--begin", "now+1hour"], ["--dependency", "afterany:1"], ["--hold"]), start=2):
            code, out, err = cli(*base, *extra, "--", "true")
            assert (code, out) == (3, ""), (extra, code, out, err)
            assert " ".join(err.split()) == " ".join(plain[2].split()).replace("job 1", f"job {n}"), extra
            assert client.get(f"/jobs/{n}").json()["state"] == "REJECTED"
