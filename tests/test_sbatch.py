"""``shepherd sbatch FILE`` (issue 18 point 2, design note 018): a Slurm batch script's
#SBATCH lines and the command line (which wins) become one submission through
``submit``'s request code; directives gpushepherd has no feature for, or does not know,
are refused naming them; the script runs with its #! line. An in-process server
(tests/test_regressions_api.py's fixtures) running the scripts for real."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import test_regressions_api as regressions

from gpushepherd.cli.sbatch import SbatchError, output_path, parse_options, script_directives

api, cli = regressions.api, regressions.cli  # fixtures: an in-process server, the CLI against it


def script(tmp_path: Path, *directives: str, body: str = 'echo "hi $*"; echo oops >&2', name: str = "job.sh",
           shebang: str = "#!/bin/sh") -> Path:
    p = tmp_path / name
    p.write_text("\n".join([shebang, *(f"#SBATCH {d}" for d in directives), "", body, ""]))
    return p


def ended(api, job_id: str) -> dict:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        v = api.get(f"/jobs/{job_id}").json()
        if v["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return v
        time.sleep(0.05)
    pytest.fail(f"job {job_id} did not end: {v}")


def submitted(out: str) -> str:
    assert out.startswith("Submitted job "), out
    return out.split()[-1]


def test_a_script_s_directives_are_its_request_and_it_runs_with_its_interpreter(cli, api, tmp_path):
    p = script(tmp_path, "--gres=gpu:2", "-t 30", "-A research", "--partition=batch", "--wckey llm-eval",
               "-N 1", "# a comment line between directives")
    code, out, err = cli("sbatch", "-D", str(tmp_path), str(p), "a", "b")
    assert code == 0, err
    job_id = submitted(out)
    spec = api.daemon.sched.jobs[job_id].spec
    assert (spec.gpus, spec.time_limit_s, spec.team, spec.workload_class, spec.project) == \
        (2, 1800, "research", "batch", "llm-eval")
    v = ended(api, job_id)
    assert v["state"] == "COMPLETED" and v["exit_code"] == 0
    assert api.get(f"/jobs/{job_id}/logs").text == "hi a b\n"  # no -o: the server's log, as `shepherd logs`


def test_command_line_options_win_over_the_script_s(cli, api, tmp_path):
    p = script(tmp_path, "--gres=gpu:FAKE:2", "-t 30", "-A research", "-p batch")
    code, out, err = cli("sbatch", "-t", "2h", "-G", "1", "--chdir", str(tmp_path), str(p))
    assert code == 0, err
    spec = api.daemon.sched.jobs[submitted(out)].spec
    assert (spec.gpus, spec.gpu_types, spec.time_limit_s) == (1, (), 7200)


def test_output_and_error_files_take_the_job_id(cli, api, tmp_path):
    p = script(tmp_path, "-A research", "-p batch", "-o out-%j.txt")
    code, out, err = cli("sbatch", "-D", str(tmp_path), str(p))
    job_id = submitted(out)
    assert ended(api, job_id)["state"] == "COMPLETED"
    assert (tmp_path / f"out-{job_id}.txt").read_text() == "hi \noops\n"  # -o alone: stderr too, as Slurm
    p = script(tmp_path, "-A research", "-p batch", "-o o-%j-%a.txt", "-e e-%A_%a.txt", "--array=0-1",
               name="array.sh")
    code, out, err = cli("sbatch", "-D", str(tmp_path), str(p))
    assert code == 0 and out.startswith("Submitted array "), err
    array_id = out.split()[-1]
    assert ended(api, array_id)["state"] == "COMPLETED"
    assert sorted(f.name for f in tmp_path.glob(f"e-{array_id}_*.txt")) == [f"e-{array_id}_0.txt",
                                                                             f"e-{array_id}_1.txt"]
    assert {f.read_text() for f in tmp_path.glob("o-*-*.txt")} == {"hi \n"}


@pytest.mark.parametrize("directive, needle", [
    ("--dependency=after:1", "--dependency: 'after:1' is not allowed: after is not supported"),
    ("--dependency=afterok:1?afterany:2", "'?' (any of) is not supported"),
    ("--begin=soon", "--begin: 'soon' is not allowed: YYYY-MM-DD"),  # the one grammar (timepoints, note 022)
    ("--hold=yes", "--hold=yes is not allowed: --hold takes no value"),
    ("--deadline=soon", "--deadline: 'soon' is not allowed: YYYY-MM-DD"),
    ("-C a|b", "-C a|b is not allowed: LABEL=VALUE or LABEL, several joined by & (AND)"),
    ("-n 2", "-n 2 is not allowed without --gpus-per-task"),
    ("-w node1", "-w is not allowed: gpushepherd has no node lists"),
    ("-x node2", "-x is not allowed: gpushepherd has no excluded nodes"),
    ("--exclusive", "--exclusive is not allowed: gpushepherd has no exclusive nodes"),
    ("--signal=B:USR1@60", "no signals before the time limit"),
    ("--requeue", "--requeue is not allowed"),
    ("--mail-type=END", "no mail"), ("--mail-user=a@b", "no mail"),
    ("--mem=4G", "--mem=4G is not allowed: gpushepherd has no host memory scheduling"),
    ("-c 4", "-c is not allowed: gpushepherd has no CPU scheduling"),
    ("--frobnicate=1", "--frobnicate=1 is not allowed: an sbatch option gpushepherd does not know"),
    ("--gres=shard:2", "--gres shard:2 is not allowed: gpu, gpu:N or gpu:TYPE:N"),
    ("-t 1:99:99", "-t: '1:99:99' is not allowed: minutes and seconds after the first field are < 60"),
    ("-N 2", "-N 2 is not allowed: 1"),
    ("-o out-%x.txt", "the patterns are %j, %A, %a and %% (not %x)"),
    ("--server=http://x", "--server=http://x is not allowed in a script: on the command line only"),
])
def test_a_directive_without_a_feature_or_unknown_is_refused_naming_it_and_nothing_is_submitted(
        cli, api, tmp_path, directive, needle):
    p = script(tmp_path, "-A research", "-p batch", directive)
    code, out, err = cli("sbatch", "-D", str(tmp_path), str(p))
    assert code == 2 and out == "" and "error: job.sh:4: " in err and needle in err, err
    assert api.get("/jobs").json() == []
    if directive.startswith("--server"):
        return  # the command line's own
    code, _, err = cli("sbatch", *directive.split(" ", 1), str(p))  # the same option on the command line
    assert code == 2 and "error: command line: " in err and api.get("/jobs").json() == []


def test_missing_class_team_shebang_or_file_are_refused(cli, api, tmp_path):
    code, _, err = cli("sbatch", str(script(tmp_path, "-A research")))
    assert code == 2 and "-p/--partition CLASS is not allowed to be missing" in err
    code, _, err = cli("sbatch", "-p", "batch", str(script(tmp_path)))
    assert code == 2 and "-A/--account TEAM is not allowed to be missing" in err
    code, _, err = cli("sbatch", "-p", "batch", "-A", "research", str(script(tmp_path, shebang="echo no shebang")))
    assert code == 2 and "a batch script starts with #! and its interpreter" in err
    code, _, err = cli("sbatch", "-p", "batch", "-A", "research", str(tmp_path / "nope.sh"))
    assert code == 2 and "FILE: " in err and "nope.sh" in err
    code, _, err = cli("sbatch", "-p", "batch")
    assert code == 2 and "FILE is not allowed to be missing" in err
    assert api.get("/jobs").json() == []


def test_directives_after_the_first_command_are_not_read_as_sbatch(tmp_path):
    p = script(tmp_path, "-p batch", body="echo start\n#SBATCH --exclusive")
    assert [t for _, t in script_directives(p)] == [["-p", "batch"]]


def test_option_forms():
    assert parse_options(["--gres=gpu"], "x")[0] == {"gpus": 1, "gpu_type": []}
    assert parse_options(["--gres=gpu:a100:4"], "x")[0] == {"gpus": 4, "gpu_type": ["a100"]}
    assert parse_options(["--gres=gpu:a100"], "x")[0] == {"gpus": 1, "gpu_type": ["a100"]}
    assert parse_options(["--gres", "gpu:2"], "x")[0] == {"gpus": 2, "gpu_type": []}
    assert parse_options(["-G", "a100:2"], "x")[0] == {"gpus": 2, "gpu_type": ["a100"]}
    assert parse_options(["-G3", "-t1-0"], "x")[0] == {"gpus": 3, "gpu_type": [], "time_limit_s": 86400}
    assert parse_options(["-J", "train", "--job-name=eval"], "x")[0] == {"name": "eval"}  # the last wins
    opts, rest = parse_options(["-p", "batch", "job.sh", "-t", "5"], "command line", positional=True)
    assert opts == {"class": "batch"} and rest == ["job.sh", "-t", "5"]  # after FILE: the script's own args
    with pytest.raises(SbatchError, match="x: -G 0 is not allowed: a GPU count >= 1"):
        parse_options(["-G", "0"], "x")
    with pytest.raises(SbatchError, match="-t is not allowed without a value"):
        parse_options(["-t"], "x")
    assert output_path("slurm-%j.out") == "slurm-\"${SHEPHERD_JOB_ID}\".out"
    assert output_path("a b%%") == "'a b'%"


def test_submit_of_a_script_file_without_dashes_is_refused_pointing_to_sbatch(cli, api, tmp_path):
    script(tmp_path, "-p batch")
    code, out, err = cli("submit", "-c", "batch", "-A", "research", "-D", str(tmp_path), "job.sh")
    assert code == 2 and out == "" and "'job.sh' is not allowed: it is a file, not a command on $PATH" in err
    assert "shepherd sbatch job.sh" in err and "-- ./job.sh" in err
    assert api.get("/jobs").json() == []
    code, out, err = cli("submit", "-c", "batch", "-A", "research", "-D", str(tmp_path), "--", "sh", "job.sh")
    assert code == 0 and out.startswith("Submitted job "), err  # a command on $PATH with the file: as asked
