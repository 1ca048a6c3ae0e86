"""Several teams on one server (issue 14 points 2, 3, 5; design note 023): jobs run as
their Unix user, contained in a cgroup v2 each, and every action is in the audit log.

Real servers (tests/test_daemon.py's helper) running real processes. The per-user tests
need root and ``useradd`` (CI runs as root): they create two Unix users and a group, and
remove them after; they skip, saying why, elsewhere. The containment tests need a
writable cgroup v2, the out-of-memory test its memory controller; each skips saying why.
No timed assertions: every wait is a poll with a generous deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from builders import remove_unix_users
from conftest import kill_leftovers
from gpushepherd.daemon import cgroups, gpu_devices, runas
from test_daemon import Server, gone, wait_for

POLICY = """\
name: multitenant-test
cluster:
  nodes:
    - {name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 30}
teams:
  ml: {}
  cv: {}
preemption: {enabled: false}
"""
#: a variable of the server's environment that a per-user job must not see
SECRET = "GS_SERVER_ONLY_SECRET"


def why_not_per_user() -> str | None:
    if os.geteuid() != 0:
        return "jobs run as their Unix users only under a root server, and creating users needs root"
    missing = [t for t in ("useradd", "userdel", "groupadd", "groupdel") if shutil.which(t) is None]
    return f"{', '.join(missing)} not on PATH: cannot create test users" if missing else None


def _probe(env: dict[str, str] | None = None) -> cgroups.Containment:
    """What a server would get here (its cgroup made, then removed), under ``env``'s
    ``SHEPHERD_CGROUP``."""
    probe = Path(tempfile.mkdtemp(prefix="gs-probe-"))
    try:
        c = cgroups.open_containment(probe, env or {})
        cgroups.remove_instance(probe, env or {})
        return c
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def why_not_cgroups() -> str | None:
    c = _probe()
    return f"no writable cgroup v2 here: {c.why}" if c.base is None else None


def memory_limits() -> str | None:
    """Why ``--mem`` cannot be tested here (``None``: it can)."""
    c = _probe()
    return None if "memory" in c.limits else f"the memory controller is not enabled for our cgroups: {c.why}"


class Users:
    """Two Unix users (alice, bob) and a group both are in, with unique names; removed by ``remove``."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.group = f"gsteam{tag}"
        self.alice, self.bob = f"gsalice{tag}", f"gsbob{tag}"
        self.made: list[str] = []
        subprocess.run(["groupadd", self.group], check=True, capture_output=True)
        for name in (self.alice, self.bob):
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-G", self.group, name], check=True,
                           capture_output=True)
            self.made.append(name)
        self.ident = {n: runas.identity(n) for n in self.made}
        import grp
        self.gid = grp.getgrnam(self.group).gr_gid

    def as_user(self, name: str, *argv: str) -> subprocess.CompletedProcess:
        """``argv`` run as ``name`` (its uid, gid and groups), output captured."""
        i = self.ident[name]
        return subprocess.run(list(argv), user=i.uid, group=i.gid, extra_groups=list(i.groups), capture_output=True,
                              text=True, cwd="/")

    def remove(self) -> None:
        """End what the tests left running as these users (by pid: the users are this
        module's own), then remove them and their group; a user ``userdel`` keeps is named."""
        uids = {self.ident[n].uid for n in self.made}
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid in uids:
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
        remove_unix_users(self.made, self.group, home=True)


class Tenants:
    """A root server that runs jobs as their users (``SHEPHERD_RUN_AS=user``), in a data
    directory every user may traverse, with tokens: admin, alice (team ml, which lists her
    as its member), bob (team cv); and its Unix socket (note 025) at ``sock``."""

    def __init__(self, users: Users):
        self.users = users
        self.base = Path(tempfile.mkdtemp(prefix="gs-mt-", dir="/tmp"))
        self.base.chmod(0o755)
        self.work = self.base / "work"  # the jobs' directory, where they leave their pid files
        self.work.mkdir()
        self.work.chmod(0o1777)
        self.server = Server(self.base)
        self.server.policy.write_text(POLICY.replace("  ml: {}", f"  ml: {{members: [{users.alice}]}}"))
        self.sock = self.base / "shepherd.sock"
        saved = {k: os.environ.get(k) for k in ("SHEPHERD_RUN_AS", SECRET)}
        os.environ.update({"SHEPHERD_RUN_AS": "user", SECRET: "leaked"})
        try:
            self.server.start(extra=("--socket", str(self.sock)))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        # before any token exists: a submission without one, naming root
        self.open_submit = httpx.post(self.server.url + "/jobs", timeout=60, json={
            "class": "batch", "team": "ml", "user": "root", "command": ["id"], "cwd": str(self.work)})
        self.tokens = {"admin": self.token("root", "--admin"), users.alice: self.token(users.alice, "--team", "ml"),
                       users.bob: self.token(users.bob, "--team", "cv")}
        self.server.token = self.tokens["admin"]

    @property
    def data(self) -> Path:
        return self.server.data

    def token(self, user: str, *extra: str) -> str:
        r = CliRunner().invoke(app, ["token", "create", "--user", user, *extra, "--data-dir", str(self.data)])
        assert r.exit_code == 0, r.output
        return r.stdout.strip().splitlines()[-1]

    def post(self, who: str, script: str, team: str | None = None, **extra) -> httpx.Response:
        """``POST /jobs`` of ``/bin/sh -c script`` with ``who``'s token (``who`` a user, or ``admin``)."""
        body = {"class": "batch", "team": team or ("ml" if who != self.users.bob else "cv"), "gpus": 1,
                "command": [script], "shell": True, "cwd": str(self.work), **extra}
        return httpx.post(self.server.url + "/jobs", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {self.tokens[who]}"})

    def submit(self, who: str, script: str, **extra) -> str:
        r = self.post(who, script, **extra)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def get(self, who: str, path: str, **params) -> httpx.Response:
        return httpx.get(self.server.url + path, params=params, timeout=60,
                         headers={"Authorization": f"Bearer {self.tokens[who]}"})

    def close(self) -> None:
        self.server.stop()
        kill_leftovers(self.base)  # the data dir lies outside pytest's tmp, which conftest cleans
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def users():
    why = why_not_per_user()
    if why:
        pytest.skip(why)
    u = Users()
    yield u
    u.remove()


@pytest.fixture(scope="module")
def tenants(users):
    t = Tenants(users)
    yield t
    t.close()


def _pid_file(path: Path) -> list[int]:
    return wait_for(f"{path.name}", lambda: path.exists() and path.read_text().split() and
                    [int(x) for x in path.read_text().split()])


# -- point 2: jobs run as their user --------------------------------------------------
def test_a_job_runs_as_its_user_with_its_groups_home_and_a_clean_environment(tenants, users):
    alice = users.ident[users.alice]
    job_id = tenants.submit(users.alice, "id -u; id -g; id -G; echo HOME=$HOME USER=$USER; env; pwd; "
                            "echo saved > $SHEPHERD_CHECKPOINT_DIR/state", env={"MINE": "yes"})
    job = tenants.server.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED", tenants.get("admin", f"/jobs/{job_id}/logs", stream="stderr").text
    out = tenants.get(users.alice, f"/jobs/{job_id}/logs").text.splitlines()
    assert out[0] == str(alice.uid) and out[1] == str(alice.gid)
    assert str(users.gid) in out[2].split()  # its supplementary group
    assert out[3] == f"HOME={alice.home} USER={users.alice}"
    env = dict(line.split("=", 1) for line in out[4:] if "=" in line)
    assert env["MINE"] == "yes" and env["CUDA_VISIBLE_DEVICES"] == "0" and env["SHEPHERD_JOB_ID"] == job_id
    assert SECRET not in env and env["PATH"] == runas.DEFAULT_PATH  # nothing of root's environment
    assert "PYTHONPATH" not in env  # the runner's (this package's root) is not the job's (issue 14, a newcomer)
    assert out[-1] == str(tenants.work)  # its directory, entered as alice

    # its files are alice's, 0600 in root's 0711 directories; its checkpoint directory alice's, 0700
    rdir = tenants.data / "runs" / job_id / "1"
    for f in ("stdout", "stderr", "exit"):
        st = (rdir / f).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice.uid, 0o600), f
    for d in (tenants.data, tenants.data / "runs", rdir):
        st = d.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o711), d
    ckpt = tenants.data / "checkpoints" / job_id
    assert (ckpt.stat().st_uid, stat.S_IMODE(ckpt.stat().st_mode)) == (alice.uid, 0o700)
    assert not (rdir / "env.json").exists()  # the job's environment, handed to the root runner, is gone
    for f in ("shepherd.db", "server.lock"):
        st = (tenants.data / f).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600), f

    # alice reads her files by path; bob gets "permission denied" for each
    for path in (rdir / "stdout", rdir / "exit", ckpt / "state"):
        assert users.as_user(users.alice, "cat", str(path)).returncode == 0, path
        denied = users.as_user(users.bob, "cat", str(path))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (path, denied)
    assert "Permission denied" in users.as_user(users.bob, "ls", str(ckpt)).stderr
    # ... nor through the API: another team's job
    assert tenants.get(users.bob, f"/jobs/{job_id}/logs").status_code == 403


def test_an_unknown_unix_user_is_refused_naming_it_and_a_submission_needs_a_token(tenants):
    r = tenants.post("admin", "true", user="gsnosuchuser")
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "user"]
    assert "'gsnosuchuser' is not allowed: no Unix user of that name" in r.json()["detail"][0]["msg"]
    # a server that runs jobs as users takes no submission from a caller who does not say who it is
    assert tenants.open_submit.status_code == 403, tenants.open_submit.text
    assert "'root' is not allowed without a token: this server runs each job as its Unix user" in \
        tenants.open_submit.json()["detail"]


def test_run_as_mode_follows_the_uid_and_the_knob():
    assert runas.run_as({"SHEPHERD_RUN_AS": "server"}).per_user is False
    with pytest.raises(ValueError, match=r"SHEPHERD_RUN_AS: 'nobody' is not allowed: user .* or server"):
        runas.run_as({"SHEPHERD_RUN_AS": "nobody"})
    mode = runas.run_as({})
    assert mode.per_user is (os.geteuid() == 0)
    if not mode.per_user:
        assert "a single-user install (the server is not root)" in mode.text()


def test_a_server_that_runs_jobs_as_itself_says_so_in_its_first_line(tmp_path):
    s = Server(tmp_path).start()  # SHEPHERD_RUN_AS=server (conftest)
    try:
        first = wait_for("the first line", lambda: [ln for ln in s.log.read_text().splitlines() if "serving" in ln])
        assert "every job runs as" in first[0] and ("SHEPHERD_RUN_AS=server" in first[0]
                                                     or "a single-user install" in first[0]), first[0]
    finally:
        s.stop()


def test_a_job_submitted_over_the_socket_runs_as_the_kernels_user_and_is_audited_with_its_uid(tenants, users):
    from test_identity import CLIENT

    alice = users.ident[users.alice]
    client = tenants.base / "client.py"
    client.write_text(CLIENT)
    client.chmod(0o644)
    if users.as_user(users.alice, "/usr/bin/python3", "-c", "pass").returncode != 0:
        pytest.skip("no Python the test users may run (/usr/bin/python3) for a socket client")
    body = {"class": "batch", "team": "ml", "command": ["id -u"], "shell": True, "cwd": str(tenants.work)}
    r = users.as_user(users.alice, "/usr/bin/python3", str(client), str(tenants.sock), "POST", "/jobs",
                      json.dumps(body))
    assert r.returncode == 0, r.stderr
    sent = json.loads(r.stdout)
    assert sent["status"] == 201 and sent["body"]["user"] == users.alice, sent
    job_id = sent["body"]["id"]
    assert tenants.server.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert tenants.get(users.alice, f"/jobs/{job_id}/logs").text.split() == [str(alice.uid)]
    row = wait_for("the socket submission's audit row", lambda: [
        e for e in tenants.get("admin", "/audit", action="submit").json() if e["target"] == job_id])[0]
    assert (row["user"], row["uid"], row["token_id"]) == (users.alice, alice.uid, None)
    assert row["address"].startswith("unix socket (pid ")


def test_a_job_s_pythonpath_is_the_one_its_submitter_sent(tenants, users):
    job_id = tenants.submit(users.alice, 'echo "[$PYTHONPATH]"', env={"PYTHONPATH": "/opt/mine"})
    assert tenants.server.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert tenants.get(users.alice, f"/jobs/{job_id}/logs").text.split() == ["[/opt/mine]"]


def _over_socket(tenants, users, who: str, method: str, path: str, body: str | None = None) -> dict:
    """``method path`` as Unix user ``who`` over the server's socket: ``{status, body}``."""
    from test_identity import CLIENT

    client = tenants.base / "client.py"
    client.write_text(CLIENT)
    client.chmod(0o644)
    if users.as_user(who, "/usr/bin/python3", "-c", "pass").returncode != 0:
        pytest.skip("no Python the test users may run (/usr/bin/python3) for a socket client")
    r = users.as_user(who, "/usr/bin/python3", str(client), str(tenants.sock), method, path,
                      *([body] if body is not None else []))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_audit_log_over_the_socket_is_a_member_s_own_teams_or_a_clear_403(tenants, users):
    """Before: bob (a member of no team) got an empty list, and `shepherd audit` an empty
    table with exit 0; alice (team ml's member) got nothing either (note 023's readers)."""
    job_id = tenants.submit(users.alice, "true")
    mine = wait_for("alice's submit", lambda: [
        e for e in _over_socket(tenants, users, users.alice, "GET", "/audit")["body"] if e["target"] == job_id])
    assert {e["team"] for e in _over_socket(tenants, users, users.alice, "GET", "/audit")["body"]} == {"ml"}
    assert mine[0]["action"] == "submit"
    refused = _over_socket(tenants, users, users.bob, "GET", "/audit")
    assert refused["status"] == 403, refused
    assert f"user {users.bob!r}" in refused["body"]["detail"] and "admins" in refused["body"]["detail"]


def test_another_team_sees_a_job_s_state_and_reason_but_not_what_it_runs_or_where(tenants, users):
    """Before: bob (team cv) read alice's command line, directory and log paths in
    `shepherd show`, and every job's name in `queue` (note 023, "What another team sees")."""
    from gpushepherd.daemon.api import PRIVATE_FIELDS

    job_id = tenants.submit(users.alice, "sleep 600 # secret-plan", name="secret-plan")
    try:
        theirs = tenants.get(users.bob, f"/jobs/{job_id}").json()
        assert theirs["command"] is None and theirs["cwd"] is None and theirs["stdout"] is None
        assert theirs["name"] is None and "secret-plan" not in json.dumps(theirs)
        assert set(theirs["hidden"]) == {"name", "command", "cwd", "stdout", "stderr", "checkpoint_dir",
                                         "launch_error"} <= set(PRIVATE_FIELDS)
        assert (theirs["team"], theirs["class"], theirs["gpus"], theirs["user"]) == ("ml", "batch", 1, users.alice)
        assert theirs["state"] in ("PENDING", "RUNNING") and "reason" in theirs and "estimated_start" in theirs
        assert theirs["history"]  # its transitions and their reasons
        listed = [j for j in tenants.get(users.bob, "/jobs").json() if j["id"] == job_id]
        assert listed and listed[0]["command"] is None and listed[0]["name"] is None
        assert tenants.get(users.bob, "/jobs", name="secret-plan").json() == []  # no probing by name
        assert tenants.get(users.bob, "/jobs", name="secret-plan", limit="10").json()["jobs"] == []
        for who in (users.alice, "admin"):  # its team's member and an admin see it whole
            whole = tenants.get(who, f"/jobs/{job_id}").json()
            assert whole["command"] == ["sleep 600 # secret-plan"] and whole["cwd"] and "hidden" not in whole
            assert [j["id"] for j in tenants.get(who, "/jobs", name="secret-plan").json()] == [job_id]
    finally:
        httpx.post(f"{tenants.server.url}/jobs/{job_id}/cancel", timeout=60,
                   headers={"Authorization": f"Bearer {tenants.tokens['admin']}"})


def test_show_says_a_field_is_hidden():
    from gpushepherd.cli.daemon import _shown

    view = {"team": "ml", "command": None, "name": None, "project": "", "hidden": ["command", "name"]}
    assert _shown(view, "command") == "(hidden: a job of team ml, seen by its members and admins)"
    assert _shown(view, "name").startswith("(hidden") and _shown(view, "project") == "-"


# -- point 3: containment -------------------------------------------------------------
DOUBLE_FORK = """trap '' TERM
setsid sh -c 'trap "" TERM; echo $$ > {w}/{j}.setsid; exec sleep 600' &
( sh -c 'trap "" TERM; echo $$ > {w}/{j}.orphan; exec sleep 600' & ) &
echo $$ > {w}/{j}.main
while true; do sleep 1; done
"""
#: the next job: which processes of the first one live when it starts (zombies do not
#: count), and whether the first one's cgroup is still there (it is removed once empty,
#: before its GPUs are handed on)
WHO_LIVES = """for f in {w}/{j}.main {w}/{j}.setsid {w}/{j}.orphan; do
  p=$(cat $f)
  if [ -e /proc/$p/stat ] && [ "$(cut -d' ' -f3 /proc/$p/stat)" != Z ]; then echo "$p alive"; fi
done > {w}/{j}.seen-by-next
if [ -e {cg} ]; then echo "cgroup still there" >> {w}/{j}.seen-by-next; fi
echo checked >> {w}/{j}.seen-by-next
"""


def test_a_double_forking_job_ignoring_sigterm_is_gone_after_cancel_before_the_next_job_starts(tenants, users):
    why = why_not_cgroups()
    if why:
        pytest.skip(why)
    w = tenants.work
    first = tenants.submit(users.alice, DOUBLE_FORK.format(w=w, j="a"), gpus=4)
    tenants.server.wait_state(first, "RUNNING")
    pids = [_pid_file(w / f"a.{k}")[0] for k in ("main", "setsid", "orphan")]
    assert not any(gone(p) for p in pids)
    assert len({os.getpgid(p) for p in pids}) > 1  # the setsid'd one left the job's process group
    cg = cgroups.instance_dir(tenants.data) / f"job-{first}-run-1"
    assert set(pids) <= set(cgroups.pids(cg))  # ... but not its cgroup
    # bob's job needs the same 4 GPUs: it starts once alice's are handed on
    second = tenants.submit(users.bob, WHO_LIVES.format(w=w, j="a", cg=cg), gpus=4)
    assert tenants.server.job(second)["state"] == "PENDING"
    r = httpx.post(f"{tenants.server.url}/jobs/{first}/cancel", timeout=60,
                   headers={"Authorization": f"Bearer {tenants.tokens[users.alice]}"})
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    assert tenants.server.wait_state(second, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    # when bob's job started, none of them lived and their cgroup was emptied and removed
    assert (w / "a.seen-by-next").read_text() == "checked\n"
    assert all(gone(p) for p in pids)


def test_a_restarted_server_finds_a_runs_cgroup_and_a_cancel_still_kills_what_left_its_group(tmp_path):
    why = why_not_cgroups()
    if why:
        pytest.skip(why)
    s = Server(tmp_path)
    s.start()
    try:
        w = tmp_path
        job_id = s.submit(f"import subprocess; subprocess.run(['/bin/sh', '-c', {DOUBLE_FORK.format(w=w, j='r')!r}])")
        s.wait_state(job_id, "RUNNING")
        escaped = _pid_file(w / "r.setsid")[0]
        s.kill9()
        s.start(policy=False)
        assert s.wait_state(job_id, "RUNNING")["runs"] == 1  # re-attached, not relaunched
        assert not gone(escaped)
        assert httpx.post(f"{s.url}/jobs/{job_id}/cancel", timeout=60).json()["state"] == "CANCELLED"
        wait_for("the setsid'd process to be killed with its cgroup", lambda: gone(escaped))
    finally:
        s.stop()


def why_not_v1() -> str | None:
    """Why cgroup v1 containment (a freezer or pids hierarchy, note 036) cannot be tested here."""
    c = _probe({"SHEPHERD_CGROUP": "v1"})
    return None if any(k in c.v1 for k in cgroups.V1_TRACKERS) else f"no writable cgroup v1 freezer or pids: {c.why}"


def test_on_cgroup_v1_alone_a_killed_servers_run_is_found_again_and_its_gpus_wait_until_all_is_gone(
        tmp_path, monkeypatch):
    """Note 036: with ``SHEPHERD_CGROUP=v1`` the runs' processes are listed by the v1
    freezer (a hybrid host whose unified hierarchy cannot hold them): a double-forked
    job ignoring SIGTERM survives a kill -9 of the server, is re-attached through its
    cgroups, and after cancel nothing of it lives when the next job starts on its GPUs
    (asserted from the processes' own pid files); its cgroups are removed."""
    why = why_not_v1()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("SHEPHERD_CGROUP", "v1")
    s = Server(tmp_path)
    s.start()
    try:
        node = httpx.get(s.url + "/nodes", timeout=60).json()[0]
        assert node["containment"]["kind"] == "cgroup-v1", node["containment"]
        assert "a stop freezes the cgroup, kills every process and thaws it" in node["containment"]["detail"] or \
            "freezer" not in _probe({"SHEPHERD_CGROUP": "v1"}).v1
        w = tmp_path
        first = s.submit(f"import subprocess; subprocess.run(['/bin/sh', '-c', {DOUBLE_FORK.format(w=w, j='v')!r}])",
                         gpus=4)
        s.wait_state(first, "RUNNING")
        pids = [_pid_file(w / f"v.{k}")[0] for k in ("main", "setsid", "orphan")]
        group = cgroups.run_group(s.data, first, 1)
        assert group is not None and group.v2 is None and set(pids) <= set(group.pids())
        s.kill9()
        s.start(policy=False)
        assert s.wait_state(first, "RUNNING")["runs"] == 1  # re-attached through its cgroups, not relaunched
        assert not any(gone(p) for p in pids)
        second = s.submit("import subprocess; subprocess.run(['/bin/sh', '-c', "
                          f"{WHO_LIVES.format(w=w, j='v', cg=group.tracker)!r}])", gpus=4)
        assert httpx.post(f"{s.url}/jobs/{first}/cancel", timeout=60).json()["state"] == "CANCELLED"
        assert s.wait_state(second, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        assert (w / "v.seen-by-next").read_text() == "checked\n"
        assert all(gone(p) for p in pids) and not group.exists()  # every hierarchy's cgroup removed
    finally:
        s.stop()
        kill_leftovers(tmp_path)


def test_v1_limits_are_written_where_the_controllers_are_v1s_and_removed_with_the_run(tmp_path):
    """--mem on a hybrid host: memory.limit_in_bytes and memory.memsw.limit_in_bytes (swap
    cannot dodge it); --cpus: cpu.cfs_quota_us over cpu.cfs_period_us (note 036)."""
    c = cgroups.open_containment(tmp_path, {})
    try:
        if "memory" not in c.v1 or "cpu" not in c.v1:
            pytest.skip(f"memory and cpu are not cgroup v1 controllers here: {sorted(c.v1)}")
        assert c.isolation()["memory"] == c.isolation()["cpu"] == "cgroup-v1"
        group = c.create("7", 2, mem_mib=100, cpus=1.5)
        mem, cpu = group.v1["memory"], group.v1["cpu"]
        assert (mem / "memory.limit_in_bytes").read_text().strip() == "104857600"
        if (mem / "memory.memsw.limit_in_bytes").exists():
            assert (mem / "memory.memsw.limit_in_bytes").read_text().strip() == "104857600"
        assert ((cpu / "cpu.cfs_quota_us").read_text().strip(), (cpu / "cpu.cfs_period_us").read_text().strip()) \
            == ("150000", "100000")
        assert group.memory_limit() == "memory.limit_in_bytes 104857600 bytes" and group.oom_kills() == 0
        assert group.remove() and not group.exists()
    finally:
        cgroups.remove_instance(tmp_path, {}, kill=True)
    assert not any(d.exists() for d in cgroups.instance_dirs_v1(tmp_path, {}).values())


OPENER = """import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        print(os.path.basename(path), 'opened')
    except OSError as exc:
        print(os.path.basename(path), errno.errorcode[exc.errno])
"""


def _device_nodes(where: Path, major: int) -> list[str]:
    """Character devices MAJOR:0..3 and MAJOR:255 (nvidiactl) made with mknod: with no
    driver behind them, an open fails ENXIO (or ENODEV) - unless a device cgroup denies
    it first (EPERM)."""
    where.mkdir()
    made = []
    for minor in (0, 1, 2, 3, 255):
        path = where / f"nvidia{minor if minor != 255 else 'ctl'}"
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        path.chmod(0o666)
        made.append(str(path))
    return made


def test_a_job_may_open_only_its_own_gpus_device_files_under_the_v1_devices_controller(tmp_path):
    """Device isolation (note 036): a job on one GPU opens its own ``/dev/nvidiaN`` and
    ``nvidiactl`` as far as the kernel's driver check (ENXIO: no NVIDIA driver here),
    while every other GPU's minor is refused by its devices cgroup (EPERM) - the same
    files opened outside the cgroup fail ENXIO/ENODEV, so EPERM is the cgroup's doing."""
    c = _probe()
    if "devices" not in c.v1:
        pytest.skip(f"no writable cgroup v1 devices hierarchy here (on pure cgroup v2 device isolation is off): "
                    f"{c.text()}")
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    major = gpu_devices.nvidia_major()
    nodes = _device_nodes(tmp_path / "dev", major)
    outside = subprocess.run([sys.executable, "-c", OPENER, *nodes], capture_output=True, text=True)
    assert {ln.split()[1] for ln in outside.stdout.splitlines()} <= {"ENXIO", "ENODEV"}, outside.stdout
    s = Server(tmp_path)
    s.start()
    try:
        job_id = s.submit(f"import os, subprocess, sys; print('gpu', os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
                          f"subprocess.run([sys.executable, '-c', {OPENER!r}, *{nodes!r}])", gpus=1)
        job = s.wait_state(job_id, "COMPLETED", "FAILED")
        assert job["state"] == "COMPLETED", s.logs(job_id, stream="stderr")
        seen = dict(ln.split() for ln in s.logs(job_id).splitlines())
        gpu = seen.pop("gpu")  # a static inventory: CUDA_VISIBLE_DEVICES is the GPU's index, its device minor
        assert seen[f"nvidia{gpu}"] in ("ENXIO", "ENODEV") and seen["nvidiactl"] in ("ENXIO", "ENODEV"), seen
        assert [name for name, how in seen.items() if how == "EPERM"] == \
            [f"nvidia{m}" for m in range(4) if str(m) != gpu], seen  # every other GPU: the cgroup refuses it
        node = httpx.get(s.url + "/nodes", timeout=60).json()[0]["containment"]
        assert node["isolation"]["devices"] == "cgroup-v1" and "devices: cgroup v1" in node["detail"]
        r = CliRunner().invoke(app, ["nodes", "--server", s.url], env={"COLUMNS": "400"})
        assert "devices: cgroup v1" in r.stdout and "memory: cgroup v1" in r.stdout, r.stdout
    finally:
        s.stop()
        kill_leftovers(tmp_path)


def test_on_cgroup_v2_an_ebpf_device_program_lets_a_process_open_only_its_gpus(tmp_path):
    """The pure cgroup v2 path of device isolation (note 036), on the real kernel: the
    run's cgroup v2 gets the hand-assembled BPF_PROG_TYPE_CGROUP_DEVICE program (v1's
    devices controller left out, as on a pure v2 host); a process in it is refused
    (EPERM) the GPU minors it was not given, and reaches the driver check (ENXIO) for its
    own and nvidiactl."""
    if os.geteuid() != 0:
        pytest.skip("mknod and bpf(2) need root")
    real = cgroups.open_containment(tmp_path, {})
    try:
        if real.base is None:
            pytest.skip(f"no writable cgroup v2 here: {real.why}")
        why = gpu_devices.bpf_devices_refusal()
        if why:
            pytest.skip(f"no eBPF device program can be loaded here: {why}")
        v2_only = cgroups.Containment(real.base, frozenset({"devices"}))
        assert v2_only.isolation()["devices"] == "cgroup-v2" and "eBPF device program" in v2_only.text()
        group = v2_only.create("9", 1, gpu_minors=frozenset({2}))
        nodes = _device_nodes(tmp_path / "dev", gpu_devices.nvidia_major())
        r = subprocess.run(["/bin/sh", "-c", f"echo $$ > {group.v2}/cgroup.procs && exec {sys.executable} -c "
                            f"'{OPENER}' {' '.join(nodes)}"], capture_output=True, text=True)
        seen = dict(ln.split() for ln in r.stdout.splitlines())
        assert seen == {"nvidia0": "EPERM", "nvidia1": "EPERM", "nvidia2": seen["nvidia2"], "nvidia3": "EPERM",
                        "nvidiactl": seen["nvidiactl"]}, (seen, r.stderr)
        assert {seen["nvidia2"], seen["nvidiactl"]} <= {"ENXIO", "ENODEV"}, seen
        assert wait_for("its cgroup to be removed", group.remove)
    finally:
        cgroups.remove_instance(tmp_path, {}, kill=True)


def test_the_device_program_is_a_chain_of_tests_ending_deny_then_allow():
    prog = gpu_devices.gpu_filter(frozenset({0, 3}), 195)
    assert len(prog) == 8 * (4 + 5 + 4)  # loads, 2 + 2 + 1 tests, deny and allow
    code = [prog[i] for i in range(0, len(prog), 8)]
    assert code[4:9] == [0x55, 0x55, 0x15, 0x15, 0x35] and code[-4:] == [0xB7, 0x95, 0xB7, 0x95]


def test_where_no_device_program_can_be_loaded_device_isolation_is_said_to_be_off_and_why(tmp_path):
    c = cgroups.Containment(tmp_path, frozenset({"memory", "cpu"}), devices_why="Operation not permitted")
    assert c.isolation() == {"containment": "cgroup-v2", "memory": "cgroup-v2", "cpu": "cgroup-v2", "devices": None}
    assert "devices: off (cgroup v2 needs an eBPF device program, BPF_PROG_TYPE_CGROUP_DEVICE, which could not be " \
        "loaded here: Operation not permitted; a job can open another GPU's /dev/nvidiaN" in c.text()
    assert "memory: cgroup v2 (--mem: memory.max)" in c.text()
    none = cgroups.Containment(None, why="SHEPHERD_CGROUP=off")
    assert none.isolation() == {"containment": "process-group", "memory": None, "cpu": None, "devices": None}
    assert none.path("1", 1) is None and "devices: off (jobs are not in cgroups)" in none.text()


def test_cgroup_v1_hierarchies_and_the_nvidia_major_are_read_from_the_kernels_files(tmp_path):
    (tmp_path / "mountinfo").write_text(
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "25 31 0:22 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "26 31 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "27 31 0:24 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n")
    assert cgroups.v1_mounts(str(tmp_path / "mountinfo")) == {
        "memory": Path("/sys/fs/cgroup/memory"), "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "freezer": Path("/sys/fs/cgroup/freezer")}
    (tmp_path / "cgroup").write_text("4:memory:/system.slice/x.service\n2:cpu,cpuacct:/\n0::/\n")
    assert cgroups.own_cgroups_v1(str(tmp_path / "cgroup")) == {
        "memory": "/system.slice/x.service", "cpu": "/", "cpuacct": "/"}
    (tmp_path / "devices").write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n"
                                      "\nBlock devices:\n  8 sd\n")
    assert gpu_devices.nvidia_major(str(tmp_path / "devices")) == 195
    (tmp_path / "devices").write_text("Character devices:\n  1 mem\n\nBlock devices:\n195 nvidia\n")
    assert gpu_devices.nvidia_major(str(tmp_path / "devices")) == gpu_devices.NVIDIA_MAJOR
    assert gpu_devices.nvidia_major(str(tmp_path / "absent")) == 195


def test_with_100m_a_job_allocating_1_gib_ends_out_of_memory(tenants, users):
    why = memory_limits()
    if why:
        pytest.skip(why)
    job_id = tenants.submit(users.alice, "x=$(head -c 1073741824 /dev/zero | tr '\\0' a); echo survived", mem_mib=100)
    job = tenants.server.wait_state(job_id, "COMPLETED", "FAILED")
    assert (job["state"], job["end_reason"]) == ("FAILED", "OUT_OF_MEMORY"), job
    # the file that held the limit: memory.max (cgroup v2) or memory.limit_in_bytes (v1, a hybrid host: note 036)
    limit = "memory.limit_in_bytes" if "memory" in _probe().v1 else "memory.max"
    assert job["failure"] == (f"OUT_OF_MEMORY: the kernel killed 1 process of it at its memory limit ({limit} "
                              "104857600 bytes, submit --mem)") and job["mem_mib"] == 100, job
    assert "survived" not in tenants.get(users.alice, f"/jobs/{job_id}/logs").text


def test_an_oom_kill_its_cgroup_reports_fails_the_job_out_of_memory_also_after_a_restart(tmp_path):
    """The daemon's side of an OOM kill, where no memory controller is at hand (CI's is
    cgroup v1's): the kernel's files of the run's cgroup are imitated in a plain
    directory - ``cgroup.events`` empty, ``memory.events`` with one ``oom_kill`` - and the
    job itself exits 0."""
    from gpushepherd.daemon.server import Daemon
    from gpushepherd.model.job import JobSpec

    (tmp_path / "policy.yaml").write_text(POLICY)
    fake = tmp_path / "cgroupfs"
    (fake / "job-1-run-1").mkdir(parents=True)  # the first job's cgroup, as the kernel would fill it
    (fake / "job-1-run-1" / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    (fake / "job-1-run-1" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    d = Daemon(tmp_path / "data", policy_path=tmp_path / "policy.yaml", poll_s=0.05)
    d.backend._containment = cgroups.Containment(fake, frozenset({"memory"}))
    d.start()
    try:
        job_id = d.submit(JobSpec(id="", team="ml", workload_class="batch", gpus=1, user="ana", mem_mib=100),
                          [sys.executable, "-c", "print('fine')"], cwd=str(tmp_path))
        assert job_id == "1"

        def view():
            with d.lock:
                return d.job_view(job_id)
        job = wait_for("the job to end", lambda: (v := view())["state"] in ("COMPLETED", "FAILED") and v)
        assert (fake / "job-1-run-1" / "memory.max").read_text() == str(100 * 1024 * 1024)
    finally:
        d.stop()
    assert (job["state"], job["end_reason"], job["exit_code"]) == ("FAILED", "OUT_OF_MEMORY", 0)
    assert job["failure"].startswith("OUT_OF_MEMORY: the kernel killed 1 process of it at its memory limit "
                                     "(memory.max 104857600 bytes"), job["failure"]
    again = Daemon(tmp_path / "data", poll_s=0.05)
    again.start()
    try:
        with again.lock:
            after = again.job_view(job_id)
    finally:
        again.stop()
    assert (after["state"], after["end_reason"], after["failure"]) == ("FAILED", "OUT_OF_MEMORY", job["failure"])


def test_limits_are_refused_naming_the_field_where_they_cannot_be_enforced(tmp_path, monkeypatch):
    monkeypatch.setenv("SHEPHERD_CGROUP", "off")
    s = Server(tmp_path).start()
    try:
        log = s.log.read_text()
        assert "containment: process groups (SHEPHERD_CGROUP=off)" in log, log
        node = httpx.get(s.url + "/nodes", timeout=60).json()[0]
        assert node["containment"]["kind"] == "process-group"
        r = CliRunner().invoke(app, ["nodes", "--server", s.url])
        assert "containment: process groups (SHEPHERD_CGROUP=off)" in r.stdout, r.stdout
        for field, value in (("mem_mib", 100), ("cpus", 1.5)):
            body = {"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": str(tmp_path),
                    field: value}
            r = httpx.post(s.url + "/jobs", json=body, timeout=60)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], r.text
            assert "jobs are not in cgroups here" in r.json()["detail"][0]["msg"]
        small = httpx.post(s.url + "/jobs", timeout=60, json={"class": "batch", "team": "ml", "user": "ana",
                                                               "command": ["true"], "cwd": str(tmp_path), "mem_mib": 8})
        assert small.status_code == 422 and small.json()["detail"][0]["loc"] == ["body", "mem_mib"]
    finally:
        s.stop()


def test_mem_sizes_read_as_slurm_writes_them():
    from gpushepherd.cli.daemon import mem_mib

    assert [mem_mib(t) for t in ("100M", "4G", "1.5G", "512", "512MiB", "2g", "1536K")] == \
        [100, 4096, 1536, 512, 512, 2048, 2]
    import typer
    for bad in ("", "0", "ten", "-5M", "4X"):
        with pytest.raises(typer.BadParameter, match="is not allowed: a size such as 100M"):
            mem_mib(bad)


def test_a_cgroup_v2_is_found_from_mountinfo_and_the_processes_own_cgroup(tmp_path):
    (tmp_path / "mountinfo").write_text(
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "25 31 0:22 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")
    assert cgroups.cgroup2_mount(str(tmp_path / "mountinfo")) == Path("/sys/fs/cgroup/unified")
    (tmp_path / "cgroup").write_text("4:memory:/x\n0::/system.slice/gpushepherd.service\n")
    assert cgroups.own_cgroup(str(tmp_path / "cgroup")) == "/system.slice/gpushepherd.service"
    with pytest.raises(ValueError, match="SHEPHERD_CGROUP: 'relative' is not allowed"):
        cgroups.open_containment(tmp_path, {"SHEPHERD_CGROUP": "relative"})


# -- point 5: the audit log -------------------------------------------------------------
def test_every_action_is_in_the_audit_log_with_who_and_from_where(tenants, users):
    a, b = users.alice, users.bob
    job_id = tenants.submit(a, "sleep 600")
    assert tenants.post(b, "true", team="ml").status_code == 403  # bob is not team ml
    assert tenants.post("admin", "true", user="gsnosuchuser").status_code == 422
    bob_cancel = httpx.post(f"{tenants.server.url}/jobs/{job_id}/cancel", timeout=60,
                            headers={"Authorization": f"Bearer {tenants.tokens[b]}"})
    assert bob_cancel.status_code == 403
    assert httpx.post(f"{tenants.server.url}/jobs/{job_id}/cancel", timeout=60,
                      headers={"Authorization": f"Bearer {tenants.tokens[a]}"}).json()["state"] == "CANCELLED"
    policy = httpx.get(tenants.server.url + "/policy", headers=tenants.server.headers, timeout=60).json()["policy"]
    policy["classes"]["batch"]["grace_period_s"] = 31
    assert httpx.post(tenants.server.url + "/policy", json={"policy": policy, "source": "edited"}, timeout=60,
                      headers=tenants.server.headers).json()["applied"]
    assert httpx.get(tenants.server.url + "/jobs", headers={"Authorization": "Bearer shp_wrong"},
                     timeout=60).status_code == 401
    service = {"name": "svc-mt", "class": "batch", "team": "ml", "command": ["sleep 600"], "shell": True,
               "cwd": str(tenants.work), "min_replicas": 0, "max_replicas": 1, "metric": "queue_length",
               "scale_up_above": 10, "scale_down_below": 1}
    assert httpx.post(tenants.server.url + "/services", json=service, timeout=60,
                      headers={"Authorization": f"Bearer {tenants.tokens[b]}"}).status_code == 403
    made_svc = httpx.post(tenants.server.url + "/services", json=service, timeout=60,
                          headers={"Authorization": f"Bearer {tenants.tokens[a]}"})
    assert made_svc.status_code == 201, made_svc.text
    assert httpx.delete(tenants.server.url + "/services/svc-mt", timeout=60,
                        headers={"Authorization": f"Bearer {tenants.tokens[b]}"}).status_code == 403
    assert httpx.delete(tenants.server.url + "/services/svc-mt", timeout=60,
                        headers={"Authorization": f"Bearer {tenants.tokens[a]}"}).status_code == 200

    def entries():
        return tenants.get("admin", "/audit", since=time.time() - 3600).json()

    def has(action, outcome, **kw):
        return [e for e in entries() if e["action"] == action and e["outcome"] == outcome
                and all(e[k] == v for k, v in kw.items())]

    host = "127.0.0.1"
    sub = wait_for("alice's submission", lambda: has("submit", "ok", user=a, target=job_id))[0]
    assert sub["team"] == "ml" and sub["address"].startswith(host + ":") and sub["token_id"] is not None
    assert sub["detail"]["command"] == json.dumps(["sleep 600"]) and sub["detail"]["class"] == "batch"
    assert wait_for("bob's refused submission", lambda: has("submit", "denied", user=b, team="ml"))
    refused = has("submit", "refused", user="root")[0]
    assert "gsnosuchuser" in refused["detail"]["error"] and refused["target"] is None
    assert wait_for("bob's refused cancel", lambda: has("cancel", "denied", user=b, target=job_id))
    assert has("cancel", "ok", user=a, target=job_id)[0]["team"] == "ml"
    assert has("policy-apply", "ok", user="root")[-1]["detail"]["source"] == "edited"
    made = has("token-create", "ok")
    assert {e["detail"]["for_user"] for e in made} >= {"root", a, b}
    assert all(e["uid"] == os.getuid() and e["address"] == "local (shepherd token create)" for e in made)
    assert wait_for("a token's first use", lambda: has("token-use", "ok", user=a))
    # services (issue 14): create and delete, by whom, from where; bob's refusals too
    assert has("service-create", "ok", user=a, team="ml", target="svc-mt")[0]["token_id"] is not None
    assert wait_for("bob's refused service create", lambda: has("service-create", "denied", user=b, team="ml"))
    assert has("service-delete", "ok", user=a, target="svc-mt")[0]["address"].startswith(host + ":")
    assert wait_for("bob's refused delete", lambda: has("service-delete", "denied", user=b, target="svc-mt"))
    assert wait_for("the wrong token", lambda: has("token-refused", "denied"))[0]["address"].startswith(host)

    # a team token sees its teams' entries only, never policy or token ones
    mine = tenants.get(a, "/audit").json()
    assert mine and {e["team"] for e in mine} == {"ml"}
    assert not {e["action"] for e in mine} & {"policy-apply", "token-create", "token-use"}
    assert {e["team"] for e in tenants.get(b, "/audit").json()} <= {"cv"}

    # shepherd audit: a table, --json, --user, --since
    cli = CliRunner()
    r = cli.invoke(app, ["audit", "--server", tenants.server.url, "--token", tenants.tokens["admin"], "--json",
                         "--user", a, "--since", "1h"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got and {e["user"] for e in got} == {a} and {"submit", "cancel"} <= {e["action"] for e in got}
    r = cli.invoke(app, ["audit", "--server", tenants.server.url, "--token", tenants.tokens["admin"],
                         "--action", "cancel"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "denied" in r.stdout and a in r.stdout and b in r.stdout, r.stdout
    r = cli.invoke(app, ["audit", "--server", tenants.server.url, "--token", tenants.tokens["admin"],
                         "--since", "yesterday-ish"])
    assert r.exit_code == 2 and "--since" in r.output

