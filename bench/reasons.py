"""Benchmark: how many pending reasons shown on a replay are wrong (issue 20, acceptance:
"the reason-accuracy figure on a live run").

    .venv/bin/python bench/reasons.py                          # Philly days 40-47 at 192x8, mixed rules
    .venv/bin/python bench/reasons.py --days 40:70 --every 200 --per-call 40
    .venv/bin/python bench/reasons.py --plain                  # philly.yaml as it is

Replays a Philly window through the simulator (``Simulator``, the same core the daemon
runs) and, after every ``--every``-th ``Scheduler.handle`` call, takes up to
``--per-call`` pending jobs (evenly spaced in queue order, so the head and the tail are
both seen) and checks the reason each would be shown (``Scheduler.pending_reason``, what
``shepherd why``, ``GET /jobs`` and ``/ui`` print) with the oracle's own checks
(``tests/oracle_checks.py``, ``Checker.pending``):

* **b_work** - the job passes the one admission rule right now but waits: its reason
  hides a start the core missed;
* **c_reason** - the reason is not the real blocker: lifted (that limit raised, that
  reservation or hold removed, that strict queue left, anti-affinity off), the job is not
  admitted and not refused by a later rule; or the ids and times it names are not what
  it says (victims that are not exiting, a hold nobody has, an eligibility time nobody
  wakes for).

A job counts as *wrong* when any check fails for it; the figure is wrong / checked.

By default the window runs under ``examples/policies/philly.yaml`` with the rules a
combined-rules site uses laid over it (``--plain`` turns this off): every team in one
cohort with nominal GPUs in proportion to its shares (reclaim of lower classes),
``production-inference.reserved_gpus: 16``, a night window on ``batch``, a per-user cap on
``sandbox`` (16 GPUs), class preemption on with a 600 s minimum runtime, EASY backfill with 4
reservations. The trace has no production-inference jobs: the reservation only takes
GPUs away from everyone else, which is what it does on a site whose serving is idle.

Prints the checked count, the share wrong, a breakdown by the admission rule that
refused each checked job (``RULE_NAMES``) and the first few failures in full, and the
replay's CPU seconds beside the same replay without checks (the baseline).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "philly_rfold" / "philly_trace.csv.gz"

from oracle_checks import RULE_NAMES, Checker, Report  # noqa: E402


def mixed(raw: dict, gpus: int) -> dict:
    """``raw`` (a policy dict) with the combined rules of the module docstring laid over
    it; ``gpus``: the cluster's GPUs (nominal quotas add up to at most it less the
    reservation)."""
    teams = raw.get("teams", {})
    total = sum(t.get("shares", 1) for t in teams.values()) or 1
    room = gpus - 16
    new_teams = {name: {**t, "nominal_gpus": room * t.get("shares", 1) // total} for name, t in sorted(teams.items())}
    return {**raw,
            "teams": new_teams,
            "cohorts": {"all": {"members": sorted(new_teams), "reclaim": "lower_priority"}} if new_teams else {},
            "classes": {**raw.get("classes", {}),
                        "production-inference": {"reserved_gpus": 16},
                        "batch": {"windows": [{"name": "night", "from": "20:00", "to": "08:00",
                                               "max_gpus": gpus // 2}], "max_gpus": gpus // 4},
                        "sandbox": {"max_gpus_per_user": 16}},
            "preemption": {"enabled": True, "min_runtime_s": 600},
            "backfill": {"enabled": True, "reservations": 4}}


class _One:
    """The scheduler as the checks see it, with one pending job (the one checked)."""

    def __init__(self, sched, job):
        self._sched, self._job = sched, job

    def pending_jobs(self):
        return [self._job]

    def __getattr__(self, name):
        return getattr(self._sched, name)


class _Counting(Report):
    def fail(self, prop: str, text: str) -> None:
        self.counts["fail:" + prop] += 1
        super().fail(prop, text)


class Sampler:
    """Checks the reasons of up to ``per_call`` pending jobs of a scheduler (evenly
    spaced in queue order) with the oracle's checks, and counts what it saw."""

    def __init__(self, rules, per_call: int):
        self.report = _Counting()
        self.checker = Checker(SimpleNamespace(rules=rules), self.report)
        self.per_call = per_call
        self.by_rule: Counter = Counter()
        self.by_reason: Counter = Counter()
        self.wrong_by_rule: Counter = Counter()
        self.state = {"calls": 0, "checked": 0, "wrong": 0, "check_cpu": 0.0}

    def rules_changed(self, rules) -> None:
        """A policy change in a daemon's log: the checks read the new rules."""
        self.checker = Checker(SimpleNamespace(rules=rules), self.report)

    def sample(self, sched) -> None:
        c0 = time.process_time()
        report, state = self.report, self.state
        pending = list(sched.pending_jobs())
        if pending:
            step = max(1, len(pending) // self.per_call)
            for job in pending[::step][:self.per_call]:
                before = sum(v for k, v in report.counts.items() if k.startswith("fail:"))
                v = sched.admission.decide(job, sched.profile_for(job))
                self.checker.pending(_One(sched, job))
                after = sum(v for k, v in report.counts.items() if k.startswith("fail:"))
                name = RULE_NAMES.get(v.rule, str(v.rule))
                self.by_reason[re.sub(r"\d+(\.\d+)?", "N", str(sched.pending_reason(job.id)))] += 1
                state["checked"] += 1
                self.by_rule[name] += 1
                if after > before:
                    state["wrong"] += 1
                    self.wrong_by_rule[name] += 1
        state["check_cpu"] += time.process_time() - c0

    def result(self, **extra) -> dict:
        return {"state": self.state, "by_rule": self.by_rule, "by_reason": self.by_reason,
                "wrong_by_rule": self.wrong_by_rule, "report": self.report, **extra}


def run(args) -> dict:
    from gpushepherd.policy import override_cluster, policy_from_dict, read_policy_dict
    from gpushepherd.sim.engine import Simulator
    from gpushepherd.sim.mapping import to_sim_jobs
    from gpushepherd.sim.traces import parse_days, read_trace, select

    raw = override_cluster(read_policy_dict(args.policy), args.cluster)
    n, g = (int(x) for x in args.cluster.split("x"))
    if not args.plain:
        raw = mixed(raw, n * g)
    pol = policy_from_dict(raw, args.policy)
    rows = select(read_trace(args.trace, "philly"), parse_days(args.days))
    jobs = to_sim_jobs(rows, pol.rules, estimates="limit")

    t0 = time.process_time()
    Simulator(pol.rules, jobs).run()
    plain_cpu = time.process_time() - t0

    sim = Simulator(pol.rules, jobs)
    sched = sim.sched
    inner = sched.handle
    sampler = Sampler(pol.rules, args.per_call)

    def handle(events):
        out = inner(events)
        sampler.state["calls"] += 1
        if not sampler.state["calls"] % args.every:
            sampler.sample(sched)
        return out

    sched.handle = handle
    t0 = time.process_time()
    sim.run()
    cpu = time.process_time() - t0 - sampler.state["check_cpu"]
    return sampler.result(plain_cpu=plain_cpu, cpu=cpu, jobs=len(jobs))


#: the live run's policy: one 8-GPU server with the rules a small team combines
LIVE_POLICY = """\
name: live-reasons
cluster:
  nodes:
    - {name: local, gpus: 8, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  production-inference: {reserved_gpus: 1, grace_period_s: 2}
  training: {max_gpus: 4, grace_period_s: 3}
  batch: {max_gpus: 4, grace_period_s: 1}
  sandbox: {max_gpus_per_user: 1}
teams:
  ml: {nominal_gpus: 4}
  data: {nominal_gpus: 3}
cohorts:
  all: {members: [ml, data], reclaim: lower_priority}
preemption: {enabled: true, min_runtime_s: 4}
backfill: {enabled: true, reservations: 2}
priority:
  weights: {class: 1000000, fair_share: 10000, age: 1000, time_limit: 500}
  recalc_s: 5
"""


def live_run(jobs: int, seed: int, base: Path) -> Path:
    """Run ``jobs`` real jobs (``sleep``-like Python processes of 2-15 s, mixed classes,
    teams, users and sizes, submitted over about ``jobs / 2`` seconds) through a real
    ``shepherd server`` (the kill campaign's ``Server``: static 8-GPU inventory) under
    ``LIVE_POLICY``, wait until every job ended, stop it; returns its data directory."""
    import random

    import httpx
    from fault_campaign import Server

    os.environ.setdefault("SHEPHERD_RUN_AS", "server")  # as in bench/api_submit.py (note 023)
    rng = random.Random(seed)
    srv = Server(base, LIVE_POLICY)
    srv.wait_up(srv.spawn())
    kinds = [("production-inference", 1, "svc", 20, 40), ("training", 4, "alice", 8, 15), ("batch", 1, "etl", 2, 8),
             ("batch", 2, "etl", 3, 10), ("sandbox", 1, "bob", 2, 6), ("research-training", 2, "carol", 4, 12)]
    try:
        for n in range(jobs):
            cls, gpus, user, lo, hi = rng.choice(kinds)
            dur = round(rng.uniform(lo, hi), 1)
            body = {"class": cls, "team": rng.choice(["ml", "data"]), "user": user, "gpus": gpus,
                    "command": [sys.executable, "-c", f"import time; time.sleep({dur})"], "cwd": str(base),
                    "time_limit_s": round(dur * rng.uniform(1.5, 3)) + 5}
            if cls == "training":
                body["checkpointable"] = True
            r = httpx.post(srv.url + "/jobs", json=body, timeout=60)
            if r.status_code not in (200, 201):
                raise SystemExit(f"bench: submission {n} refused: {r.status_code} {r.text[:300]}")
            time.sleep(rng.uniform(0.0, 1.0))
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            views = httpx.get(srv.url + "/jobs", timeout=60).json()
            if all(v["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED") for v in views):
                break
            time.sleep(2.0)
        else:
            raise SystemExit("bench: the live run's jobs did not all end within 900 s")
    finally:
        srv.stop()
    return srv.data


def run_log(args) -> dict:
    """The reasons of a live run: a daemon's event log (``--db``) replayed batch by batch
    as the daemon's core took it (``report.history.replay``'s path: a policy change
    restores the state under the new rules), every pending job checked after every
    ``--every``-th batch."""
    import json

    from gpushepherd.core.scheduler import Scheduler
    from gpushepherd.daemon.store import Store
    from gpushepherd.policy import policy_from_dict

    url = args.db if "://" in args.db else Store.sqlite_url(Path(args.db))
    store = Store(url)
    sched = sampler = None
    jobs: set[str] = set()
    t0 = time.process_time()
    try:
        for _t, kind, item in store.batches():
            if kind == "policy":
                rules = policy_from_dict(item, source="policy in the event log", intake=False).rules
                if sched is None:
                    sched, sampler = Scheduler(rules), Sampler(rules, args.per_call)
                else:
                    sched = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))
                    sampler.rules_changed(rules)
                continue
            sched.handle(list(item))
            jobs.update(j for j in sched.jobs)
            sampler.state["calls"] += 1
            if not sampler.state["calls"] % args.every:
                sampler.sample(sched)
    finally:
        store.close()
    if sampler is None:
        raise SystemExit(f"bench: no policy in the event log of {args.db}: not a gpushepherd database")
    cpu = time.process_time() - t0 - sampler.state["check_cpu"]
    return sampler.result(plain_cpu=float("nan"), cpu=cpu, jobs=len(jobs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--policy", default=str(ROOT / "examples" / "policies" / "philly.yaml"))
    ap.add_argument("--cluster", default="192x8")
    ap.add_argument("--days", default="40:47")
    ap.add_argument("--every", type=int, help="check after every Nth handle call (default 200; with --db 1)")
    ap.add_argument("--per-call", type=int, default=40, help="pending jobs checked per sampled call (default 40)")
    ap.add_argument("--plain", action="store_true", help="the policy as it is, no combined rules laid over it")
    ap.add_argument("--db", help="a live run instead: a daemon's data directory or database URL, its event log "
                                 "replayed batch by batch (e.g. `shepherd demo --keep --data-dir D`, then --db D)")
    ap.add_argument("--live", type=int, metavar="JOBS", help="run JOBS real jobs through a real server under "
                                                             "LIVE_POLICY first, then check its log (as --db)")
    ap.add_argument("--keep", metavar="DIR", help="with --live: the server's folder (kept; default a temporary one)")
    args = ap.parse_args()
    if args.live is not None and args.live < 1:
        print(f"bench: --live: {args.live} is not allowed: a number of jobs >= 1", file=sys.stderr)
        return 2
    if args.db and "://" not in args.db and not (Path(args.db) / "shepherd.db").is_file():
        print(f"bench: --db: {args.db!r} is not allowed: a daemon's data directory (with shepherd.db) or a "
              "database URL", file=sys.stderr)
        return 2
    if args.live:
        import tempfile

        base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="shepherd-live-"))
        base.mkdir(parents=True, exist_ok=True)
        args.db = str(live_run(args.live, 0, base))
    if args.every is None:
        args.every = 1 if args.db else 200
    if args.every < 1 or args.per_call < 1:
        print("bench: --every and --per-call must be >= 1", file=sys.stderr)
        return 2
    if args.db:
        return report(run_log(args), f"live run {args.db}, {{jobs}} jobs, the policy in its log; checked after "
                                     f"{'every batch' if args.every == 1 else f'every {args.every}th batch'}, "
                                     f"up to {args.per_call} pending jobs each")
    if not Path(args.trace).exists():
        print(f"bench: trace {args.trace} not found (it lives in ../shared/traces)", file=sys.stderr)
        return 2
    rules = "philly.yaml as it is" if args.plain else "philly.yaml + cohort, reservation, window, caps, preemption"
    return report(run(args), f"Philly days {args.days} at {args.cluster}, {{jobs}} jobs, {rules}; every "
                             f"{args.every}th call, up to {args.per_call} pending jobs each")


def report(r: dict, title: str) -> int:
    st = r["state"]
    print(title.replace("{jobs}", str(r["jobs"])))
    share = st["wrong"] / st["checked"] if st["checked"] else 0.0
    print(f"  reasons checked: {st['checked']}   wrong: {st['wrong']} ({share:.2%})")
    counts = r["report"].counts
    print(f"  failed checks: b_work {counts['fail:b_work']}, c_reason {counts['fail:c_reason']}, "
          f"g_live {counts['fail:g_live']}")
    print("  by the rule that refused the job:   checked   wrong")
    for name, k in sorted(r["by_rule"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"    {name:<28} {k:>9} {r['wrong_by_rule'][name]:>7}")
    print("  the reasons shown (numbers as N), most common first:")
    for text, k in sorted(r["by_reason"].items(), key=lambda kv: (-kv[1], kv[0]))[:8]:
        print(f"    {k:>7}  {text}")
    for f in r["report"].failures[:10]:
        print(f"  - {f}")
    print(f"  replay CPU s: {r['cpu']:.1f} with reasons asked (checks excluded, {st['check_cpu']:.1f} s)"
          + (f", baseline without: {r['plain_cpu']:.1f}" if r["plain_cpu"] == r["plain_cpu"] else ""))
    return 1 if st["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
