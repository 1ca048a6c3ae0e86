"""``shepherd policy check`` names a team's class limits as the policy does
(``classes.training.max_gpus=3``; before: ``max_gpus=3``, which reads as the team's own),
and reads a cohort whose members have per-GPU-type ``nominal_gpus`` (before: a
TypeError traceback after "OK"). A tester's finds, after class limits were compiled
beside per-type team quotas."""

from __future__ import annotations

from typer.testing import CliRunner

from gpushepherd.cli.main import app

POLICY = """name: p
cluster:
  nodes:
    - {name: n1, gpus: 4, gpu_type: A100-80GB, gpu_mem_mib: 81920}
    - {name: n2, gpus: 4, gpu_type: L40S, gpu_mem_mib: 46068}
teams:
  a:
    nominal_gpus: {A100-80GB: 2, L40S: 2}
    max_gpus: {A100-80GB: 2, L40S: 8}
    classes: {training: {max_gpus: 3, max_running_jobs: 1}, batch: {max_running_jobs: 2}}
  b: {nominal_gpus: {A100-80GB: 2, L40S: 2}}
  c: {max_gpus: 6, classes: {training: {max_gpus: 3}}}
cohorts:
  co: {members: [{team: a}, {team: b}]}
"""


def test_policy_check_names_class_limits_and_reads_per_type_cohorts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text(POLICY)
    r = CliRunner().invoke(app, ["policy", "check", "p.yaml"], env={"SHEPHERD_SERVER": "", "SHEPHERD_SOCKET": ""})
    assert r.exit_code == 0 and r.exception is None, (r.exit_code, r.stdout, r.stderr, r.exception)
    lines = {ln.strip().split(":")[0]: ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("team ")}
    assert ("max_gpus[A100-80GB]=2, max_gpus[L40S]=8, classes.batch.max_running_jobs=2, "
            "classes.training.max_gpus=3, classes.training.max_running_jobs=1") in lines["team a"], lines
    assert "team c: max_gpus=6, classes.training.max_gpus=3" in lines["team c"], lines
    assert "cohort co: a, b; 8 GPUs of nominal quota shared" in r.stdout, r.stdout
