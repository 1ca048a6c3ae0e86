"""Inference services that autoscale on their own signals (R12; design note 014).

A service is a record (table ``services``); its replicas are ordinary jobs
``<service>.<n>`` submitted and cancelled through the event log by the reconcile loop,
so the core places, queues and preempts them like any job. The desired replica count
is the last scaling decision (table ``service_decisions``), committed before the loop
acts on it. The autoscaler (a thread of its own, outside the core) reads the signal -
scraped from the service's Prometheus endpoint or pushed through the API - and decides
with ``observe``, which has no I/O.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import re
import socket
import threading
from urllib.parse import urlsplit
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert, select, update

from gpushepherd.daemon.store import (audit, audit_command, audit_row, service_decisions, services, spec_from_dict,
                                      spec_to_dict)
from gpushepherd.model.events import JobCancelled, JobSubmitted
from gpushepherd.model.job import JobSpec, JobState

log = logging.getLogger("gpushepherd.daemon")

NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
#: a metric name that is GPU utilisation: never a scaling signal (R12)
GPU_UTILISATION = re.compile(r"util|duty_cycle", re.IGNORECASE)
#: the most bytes read from a service's metrics endpoint
MAX_SCRAPE_BYTES = 1024 * 1024
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def create_detail(full: dict) -> dict:
    """The ``detail`` of a ``service-create`` audit row: the replicas' user, class, GPUs
    and command (``audit_command``), the replica range and the signal."""
    spec = full.get("spec", {})
    return {"as_user": spec.get("user"), "class": spec.get("workload_class"), "gpus": spec.get("gpus"),
            "command": audit_command(full.get("argv", [])), "min_replicas": full.get("min_replicas"),
            "max_replicas": full.get("max_replicas"), "metric": full.get("metric")}


class ServiceError(ValueError):
    """Bad service input: ``field`` names it; ``str()`` names the value and what is
    allowed."""

    def __init__(self, field_name: str, msg: str):
        self.field = field_name
        super().__init__(msg)


class MetricMissing(LookupError):
    """The endpoint does not expose the service's metric; ``str()`` names the metric,
    and the names it does expose."""


def parse_selector(text: str) -> tuple[str, dict[str, str]]:
    """``name`` or ``name{label="value", ...}`` -> (name, labels).

    Raises:
        ServiceError: on ``metric``: not a selector, or GPU utilisation (R12).
    """
    m = _SELECTOR.fullmatch(text.strip())
    labels: dict[str, str] = {}
    if m and m[2]:
        body, pos = m[2], 0
        while pos < len(body):
            lm = _LABEL.match(body, pos)
            if not lm:
                m = None
                break
            labels[lm[1]] = lm[2].replace('\\"', '"').replace("\\\\", "\\")
            pos = lm.end()
    if not m:
        raise ServiceError("metric", f"{text!r} is not allowed: a Prometheus metric name, optionally with labels "
                                     "(queue_length, latency_seconds{quantile=\"0.95\"})")
    if GPU_UTILISATION.search(m[1]):
        raise ServiceError("metric", f"{m[1]!r} is not allowed: GPU utilisation is never a scaling signal (R12); "
                                     "use the service's own signal: request queue length, p95 latency, tokens/s")
    return m[1], labels


def read_signal(text: str, selector: str, url: str = "the endpoint") -> tuple[float, bool]:
    """The value of ``selector`` in a Prometheus text exposition: the sum of the
    matching samples, and whether it is a counter (its family's type, or a name ending
    ``_total``; the caller takes a rate).

    Raises:
        MetricMissing: no sample matches (naming the metric names exposed).
        ValueError: the text is not the Prometheus text format.
    """
    name, labels = parse_selector(selector)
    total, found, counter, names = 0.0, False, name.endswith("_total"), set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            names.add(s.name)
            if (s.name == name or (fam.name == name and fam.type in ("gauge", "counter", "untyped")
                                   and s.name in (name, name + "_total"))) \
                    and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
                found = True
                counter = counter or fam.type == "counter"
    if not found:  # the answer's own names are never echoed (note 017: no part of the answer shown)
        raise MetricMissing(f"metric {selector!r} is not exposed by {url} (not among the {len(names)} sample names "
                            "of its answer)")
    return total, counter


class ScrapeRefused(ValueError):
    """A metrics URL outside the scrape allow-list; ``str()`` names the host and what is allowed."""


def _allowed_address(addr: str, networks: list) -> bool:
    ip = ipaddress.ip_address(addr.split("%")[0])
    return ip.is_loopback or any(ip in net for net in networks)


def check_scrape_url(url: str, allow: list[str], hosts: set[str] = frozenset(), resolve: bool = False) -> None:
    """Whether the server may fetch ``url`` (design note 017: a service's ``metrics_url``
    must not turn the server into a proxy). Allowed: loopback (``127.0.0.0/8``, ``::1``,
    ``localhost``), ``hosts`` (the nodes the service's replicas run on), and the
    ``--scrape-allow`` entries ``allow`` (networks in CIDR notation, or host names).
    ``resolve``: also check every address the host resolves to (at scrape time).

    Raises:
        ScrapeRefused: naming the host and what is allowed.
    """
    networks, names = [], set()
    for a in allow:
        try:
            networks.append(ipaddress.ip_network(a, strict=False))
        except ValueError:
            names.add(a.lower())
    host = (urlsplit(url).hostname or "").lower()
    allowed = ("loopback (127.0.0.0/8, ::1, localhost), the nodes its replicas run on"
               + (f", or {', '.join(sorted(allow))}" if allow else "") + " (shepherd server --scrape-allow)")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        if not _allowed_address(host, networks):
            raise ScrapeRefused(f"{url!r} is not allowed: host {host} is not {allowed}")
        return
    if host != "localhost" and host not in names and host not in {h.lower() for h in hosts}:
        raise ScrapeRefused(f"{url!r} is not allowed: host {host!r} is not {allowed}")
    if resolve and host not in names and host not in {h.lower() for h in hosts}:
        try:
            addrs = {i[4][0] for i in socket.getaddrinfo(host, None)}
        except OSError as exc:
            raise ScrapeRefused(f"{url!r}: host {host!r} cannot be resolved ({exc.strerror or exc})") from None
        bad = sorted(a for a in addrs if not _allowed_address(a, networks))
        if bad:
            raise ScrapeRefused(f"{url!r} is not allowed: host {host!r} resolves to {', '.join(bad)}, not {allowed}")


@dataclass
class Service:
    """A service: its row (``config``), its decisions, replicas and live signal state."""

    num: int
    name: str
    created: float
    config: dict
    deleted: float | None = None
    desired: int = 0
    decisions: list[dict] = field(default_factory=list)  # t, from, to, reason; oldest first
    replicas: list[str] = field(default_factory=list)  # job ids, oldest first
    # live state, not stored (note 014: a restart restarts the streaks)
    last_signal: dict | None = None  # t, value, source
    error: str | None = None
    above: int = 0  # consecutive samples above scale_up_above
    below_since: float | None = None  # first of the samples below scale_down_below since
    prev_counter: tuple[float, float] | None = None  # (t, value) of the last counter scrape
    next_scrape: float = 0.0
    ended: bool = False

    @property
    def last_decision_t(self) -> float:
        return self.decisions[-1]["t"] if self.decisions else self.created


def observe(svc: Service, now: float, value: float | None) -> tuple[int, str] | None:
    """Feed one sample of ``svc``'s signal at ``now`` (seconds; ``None``: the sample
    failed, which breaks both streaks); returns ``(to, reason)`` when the replica count
    should change, else ``None``. Updates the streaks; no I/O.

    Rules (note 014; HPA's stabilisation): below ``min`` -> to ``min``; up one when the
    last ``stabilize`` samples were above ``scale_up_above``; down one when the signal
    was below ``scale_down_below`` for ``cooldown_s`` and the last decision is at least
    ``cooldown_s`` old; never outside ``[min, max]``."""
    c, n, metric = svc.config, svc.desired, svc.config["metric"]
    if svc.deleted is not None:
        return None
    if n < c["min_replicas"]:
        return c["min_replicas"], f"scale up {n} -> {c['min_replicas']}: below min {c['min_replicas']}"
    if value is None:
        svc.above, svc.below_since = 0, None
        return None
    if value > c["scale_up_above"]:
        svc.above += 1
        svc.below_since = None
        if svc.above >= c["stabilize"] and n < c["max_replicas"]:
            svc.above = 0
            return n + 1, (f"scale up {n} -> {n + 1}: {metric} {value:g} > {c['scale_up_above']:g} "
                           f"for {c['stabilize']} samples")
        return None
    svc.above = 0
    if value >= c["scale_down_below"]:
        svc.below_since = None
        return None
    if svc.below_since is None:
        svc.below_since = now
    cool = c["cooldown_s"]
    if n > c["min_replicas"] and now - svc.below_since >= cool and now - svc.last_decision_t >= cool:
        held = now - svc.below_since
        svc.below_since = now  # the next step down needs a whole cool-down again
        return n - 1, (f"scale down {n} -> {n - 1}: {metric} {value:g} < {c['scale_down_below']:g} for "
                       f"{held:.1f} s (cool-down {cool:g} s)")
    return None


def validate_config(c: dict) -> None:
    """Check a service's replicas range, signal and timings.

    Raises:
        ServiceError: naming the field, the value and what is allowed.
    """
    if not NAME.fullmatch(c["name"]):
        raise ServiceError("name", f"{c['name']!r} is not allowed: a lowercase letter, then lowercase letters, "
                                   "digits or '-', at most 40 characters")
    lo, hi = c["min_replicas"], c["max_replicas"]
    if hi < 1:
        raise ServiceError("max_replicas", f"{hi!r} is not allowed: at least 1")
    if not 0 <= lo <= hi:
        raise ServiceError("min_replicas", f"{lo!r} is not allowed: 0 <= min_replicas <= max_replicas ({hi})")
    parse_selector(c["metric"])
    up, down = c["scale_up_above"], c["scale_down_below"]
    for key in ("scale_up_above", "scale_down_below", "cooldown_s", "scrape_every_s"):
        if not math.isfinite(c[key]):
            raise ServiceError(key, f"{c[key]!r} is not allowed: a finite number")
    if not down < up:
        raise ServiceError("scale_down_below", f"{down!r} is not allowed: below scale_up_above ({up!r})")
    for key in ("cooldown_s", "scrape_every_s"):
        if not c[key] > 0:
            raise ServiceError(key, f"{c[key]!r} is not allowed: seconds > 0")
    if c["stabilize"] < 1:
        raise ServiceError("stabilize", f"{c['stabilize']!r} is not allowed: samples >= 1")
    url = c.get("metrics_url")
    if url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
        raise ServiceError("metrics_url", f"{url!r} is not allowed: an http:// or https:// URL (or none: signals "
                                          "pushed to POST /services/NAME/signals)")
    if url is not None and len(url) > 2048:
        raise ServiceError("metrics_url", f"{url[:60]!r}...: {len(url)} characters is not allowed: at most 2,048")


class Services:
    """The daemon's services: persistence, the autoscaler thread, and the loop's
    reconcile of replicas (``reconcile``, called in each step with ``daemon.lock``
    held)."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.by_num: dict[int, Service] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------
    def load(self) -> None:
        """Services, their decisions and replicas from the database (at start, after
        the replay and the jobs' numbering)."""
        engine = self.daemon.store.engine
        with engine.connect() as c:
            for r in c.execute(select(services).order_by(services.c.num)).mappings():
                self.by_num[r["num"]] = Service(r["num"], r["name"], r["created"], json.loads(r["config"]),
                                                r["deleted"])
            for r in c.execute(select(service_decisions).order_by(service_decisions.c.seq)).mappings():
                svc = self.by_num.get(r["service"])
                if svc is not None:
                    svc.decisions.append({"t": r["t"], "from": r["from_replicas"], "to": r["to_replicas"],
                                          "reason": r["reason"]})
                    svc.desired = r["to_replicas"]
        owners = {}
        for svc in self.by_num.values():  # a reused name: the newest service older than the replica owns it
            owners.setdefault(svc.name, []).append(svc)
        for job_id in self.daemon.store.job_ids(containing="."):  # replicas only
            name, dot, n = job_id.rpartition(".")
            if dot and n.isdigit() and name in owners:
                mine = [s for s in owners[name] if s.num < int(n)]
                if mine:
                    mine[-1].replicas.append(job_id)
        for svc in self.by_num.values():
            svc.replicas.sort(key=lambda j: int(j.rpartition(".")[2]))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._scrape_loop, name="shepherd-autoscaler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- the API's side (each takes daemon.lock) ---------------------------------
    def create(self, config: dict, spec: JobSpec, argv: list[str], shell: bool, env: dict, cwd: str,
               who: dict | None = None) -> dict:
        """Create a service; returns its view once its row and first decision (to
        ``min_replicas``) are committed. The loop then submits the replicas. ``who``
        (``api.who_of``): its ``service-create`` audit row goes into the same commit.

        Raises:
            ServiceError: bad field (name in use, range, signal, timings).
            SpecError: the policy refuses the replicas' spec.
        """
        from gpushepherd.core.scheduler import SpecError, validate_spec

        validate_config(config)
        d = self.daemon
        if config.get("metrics_url"):
            try:
                check_scrape_url(config["metrics_url"], d.scrape_allow, {n.name for n in d.rules.nodes})
            except ScrapeRefused as exc:
                raise ServiceError("metrics_url", str(exc)) from None
        with d.lock:
            if self.live(config["name"]) is not None:
                raise ServiceError("name", f"{config['name']!r} is not allowed: a service of that name exists "
                                           "(delete it first, or choose another name)")
            now = max(d.clock(), d.sched.now)
            spec = replace(spec, id=f"{config['name']}.0", submit_time=now)
            validate_spec(d.rules, spec)
            why = d.sched.spec_misfit(spec)
            if why is not None:  # else each replica is rejected, and the loop submits another at once
                raise SpecError(f"job {spec.id!r}: gpus: {spec.gpus} is not allowed: each replica would be rejected "
                                f"(no node could ever hold it): {why}")
            num = d.next_num
            full = {**config, "spec": spec_to_dict(spec), "argv": argv, "shell": shell, "env": env, "cwd": cwd}
            svc = Service(num, config["name"], now, full)
            lo = config["min_replicas"]
            with d.store.engine.begin() as c:  # the record and its first decision, one commit
                c.execute(insert(services).values(num=num, name=svc.name, created=now, config=json.dumps(full)))
                self._decide(svc, now, lo, f"create: min {lo} replica{'s' * (lo != 1)}", c)
                if who is not None:  # note 023: the row in the transaction of what it records
                    c.execute(insert(audit).values(audit_row(now, "service-create", who, team=spec.team,
                                                             target=svc.name, detail=create_detail(full))))
            d.next_num += 1
            self.by_num[num] = svc
            d.wake.set()
            return self.view(svc)

    def delete(self, name: str, who: dict | None = None) -> dict:
        """Delete a service: marked and decided to 0 (committed, with its
        ``service-delete`` audit row for ``who``), then the loop cancels its replicas.
        Raises ``KeyError``: no such service."""
        d = self.daemon
        with d.lock:
            svc = self.live(name)
            if svc is None:
                raise KeyError(name)
            now = max(d.clock(), d.sched.now)
            before, n = svc.desired, len(svc.decisions)
            try:
                with d.store.engine.begin() as c:
                    c.execute(update(services).where(services.c.num == svc.num).values(deleted=now))
                    if who is not None:
                        c.execute(insert(audit).values(audit_row(
                            now, "service-delete", who, team=svc.config["spec"]["team"], target=svc.name,
                            detail={"replicas": svc.desired, "created": svc.created})))
                    self._decide(svc, now, 0, f"delete: {svc.desired} -> 0", c)
            except Exception:  # not committed: the service stays as it was
                svc.desired = before
                del svc.decisions[n:]
                raise
            svc.deleted = now
            d.wake.set()
            return self.view(svc)

    def push(self, name: str, values: dict[str, float]) -> dict:
        """A pushed signal sample (``{"queue_length": 12}``); returns the view.

        Raises:
            KeyError: no such service.
            ServiceError: on ``signals``: the service's metric is not in ``values``.
        """
        d = self.daemon
        with d.lock:
            svc = self.live(name)
            if svc is None:
                raise KeyError(name)
            metric = svc.config["metric"]
            if metric not in values:
                raise ServiceError("signals", f"{sorted(values)} is not allowed: this service scales on "
                                              f"{metric!r}; send {{{metric!r}: VALUE}}")
            self._sample(svc, max(d.clock(), d.sched.now), float(values[metric]), False, "pushed")
            return self.view(svc)

    def live(self, name: str) -> Service | None:
        return next((s for s in self.by_num.values() if s.name == name and s.deleted is None), None)

    # -- the signal -------------------------------------------------------------
    def _scrape_loop(self) -> None:
        import httpx

        # no proxies from the environment, no redirects: the URL checked is the one fetched
        client = httpx.Client(follow_redirects=False, trust_env=False)
        try:
            while not self._stop.wait(0.1):
                self._scrape_due(client)
        finally:
            client.close()

    def _replica_hosts(self, svc: Service) -> set[str]:
        """The nodes the service's live replicas are placed on (``daemon.lock`` held)."""
        d = self.daemon
        out = set()
        for j in svc.replicas:
            job = d.sched.jobs.get(j)
            if job is not None and job.state.holds_gpus and j in d.placements:
                out.update(name for name, _gpus in d.placements[j].parts)
        return out

    def _scrape_due(self, client) -> None:
        import httpx

        d = self.daemon
        with d.lock:
            now = max(d.clock(), d.sched.now)
            due = [(s, s.config["metrics_url"], self._replica_hosts(s)) for s in self.by_num.values()
                   if s.deleted is None and s.config.get("metrics_url") and now >= s.next_scrape]
            for s, _, _ in due:
                s.next_scrape = now + s.config["scrape_every_s"]
        for svc, url, hosts in due:  # outside the lock: a slow endpoint never holds the core
            value, counter, error = None, False, None
            try:
                check_scrape_url(url, d.scrape_allow, hosts, resolve=True)
                timeout = min(5.0, svc.config["scrape_every_s"] * 2 + 1)
                with client.stream("GET", url, timeout=timeout) as r:
                    if r.status_code != 200:  # the answer itself is never shown (note 017)
                        raise ValueError(f"scrape of {url} failed: HTTP {r.status_code}"
                                         + (" (redirects are not followed)" if 300 <= r.status_code < 400 else ""))
                    body = b""
                    for chunk in r.iter_bytes():
                        body += chunk
                        if len(body) > MAX_SCRAPE_BYTES:
                            raise ValueError(f"scrape of {url} failed: the answer is larger than "
                                             f"{MAX_SCRAPE_BYTES:,} bytes")
                try:
                    value, counter = read_signal(body.decode("utf-8", "replace"), svc.config["metric"], url)
                except MetricMissing:
                    raise
                except Exception:  # the parser's message quotes the answer: never shown
                    raise ValueError(f"scrape of {url} failed: the answer is not the Prometheus text format") \
                        from None
            except (MetricMissing, ScrapeRefused) as exc:
                error = str(exc)
            except httpx.HTTPError as exc:
                error = f"scrape of {url} failed: {type(exc).__name__}"
            except ValueError as exc:
                error = str(exc)
            try:
                with d.lock:
                    now = max(d.clock(), d.sched.now)
                    self._sample(svc, now, value, counter, "scraped", error)
            except Exception:  # a failed commit is retried at the next sample
                d.ratelog.exception(f"autoscale:{svc.name}", "service %s: autoscaling step failed", svc.name)

    def _sample(self, svc: Service, now: float, value: float | None, counter: bool, source: str,
                error: str | None = None) -> None:
        """One sample (``daemon.lock`` held): a counter becomes a rate per second; a
        decision is committed, then the loop is woken to apply it."""
        svc.error = error
        if value is not None and counter:
            prev, svc.prev_counter = svc.prev_counter, (now, value)
            if prev is None or value < prev[1] or now <= prev[0]:  # first scrape or a reset: no rate yet
                return
            value = (value - prev[1]) / (now - prev[0])
        if value is not None:
            svc.last_signal = {"t": now, "value": value, "source": source}
        if error:
            log.warning("service %s: %s", svc.name, error)
        decision = observe(svc, now, value)
        if decision is not None:
            self._decide(svc, now, *decision)
            log.info("service %s: %s", svc.name, decision[1])
            self.daemon.wake.set()

    def _decide(self, svc: Service, now: float, to: int, reason: str, conn=None) -> None:
        """Commit a decision (in transaction ``conn`` when given, the caller commits),
        then make it ``svc``'s desired count: nothing changes in memory if the write
        fails."""
        row = dict(service=svc.num, t=now, from_replicas=svc.desired, to_replicas=to, reason=reason)
        if conn is None:
            with self.daemon.store.engine.begin() as c:
                c.execute(insert(service_decisions).values(**row))
        else:
            conn.execute(insert(service_decisions).values(**row))
        svc.decisions.append({"t": now, "from": svc.desired, "to": to, "reason": reason})
        svc.desired = to

    # -- the loop's side ---------------------------------------------------------
    def reconcile(self, now: float, batch: list, rows: list) -> list[tuple[int, str]]:
        """Make each service's live replicas match its desired count (``daemon.lock``
        held, in the loop's step): submit new ones or cancel the surplus (pending first,
        then the newest). Returns ``(service, job id)`` of the replicas added to
        ``batch``, to be recorded by ``committed`` once the batch is."""
        d, out = self.daemon, []
        jobs = d.sched.jobs
        cancelling = {e.job_id for e in batch if isinstance(e, JobCancelled)}
        for svc in self.by_num.values():
            if svc.ended:
                continue
            live = [j for j in svc.replicas if j in jobs and not jobs[j].state.terminal and j not in cancelling]
            if svc.deleted is not None and not live:
                svc.ended = True
                continue
            surplus = len(live) - svc.desired
            if surplus > 0:
                order = sorted(live, key=lambda j: (jobs[j].state is not JobState.PENDING, -int(j.rpartition(".")[2])))
                batch.extend(JobCancelled(now, j) for j in order[:surplus])
            if surplus >= 0:
                continue
            c = svc.config
            base = spec_from_dict(c["spec"])  # read once a step, only for a service short of replicas
            if base.workload_class in d.rules.classes and (why := d.sched.spec_misfit(base)) is not None:
                # a policy applied since made its replicas impossible: submitting them would only
                # reject one after another, each step (a tester's find: 38 jobs in 8 s)
                d.ratelog.warning(f"service-misfit:{svc.name}", "service %s: no replica submitted, no node could "
                                  "ever hold one: %s", svc.name, why)
                continue
            for _ in range(-surplus):
                job_id = f"{svc.name}.{d.next_num}"
                spec = replace(base, id=job_id, submit_time=now)
                env = {**c["env"], "SHEPHERD_SERVICE": svc.name, "SHEPHERD_REPLICA": job_id}
                batch.append(JobSubmitted(now, spec))
                rows.append(dict(id=job_id, num=d.next_num, spec=json.dumps(spec_to_dict(spec)),
                                 argv=json.dumps(c["argv"]), shell=c["shell"], pty=False, env=json.dumps(env),
                                 cwd=c["cwd"], state=JobState.PENDING.value, run=0))
                d.next_num += 1
                out.append((svc.num, job_id))
        return out

    def committed(self, added: list[tuple[int, str]]) -> None:
        """Record the replicas ``reconcile`` submitted, once their batch is committed."""
        for num, job_id in added:
            self.by_num[num].replicas.append(job_id)

    # -- views (daemon.lock held) -------------------------------------------------
    def view(self, svc: Service, history: bool = True) -> dict[str, Any]:
        """A service: its settings, desired and running replicas (each with its state,
        placement or pending reason), the last signal, the last scrape error, and
        (``history``) every scaling decision with its reason."""
        d, c = self.daemon, svc.config
        jobs = d.sched.jobs
        live = [j for j in svc.replicas if j in jobs and not jobs[j].state.terminal]
        reps = []
        for j in live:
            v = d.job_view(j) or {}
            reps.append({k: v.get(k) for k in ("id", "state", "placement", "reason", "runs", "preemptions")})
        out = {
            "name": svc.name, "state": "DELETED" if svc.deleted is not None else "ACTIVE", "created": svc.created,
            "class": c["spec"]["workload_class"], "team": c["spec"]["team"], "user": c["spec"].get("user", ""),
            "project": c["spec"].get("project", ""), "gpus": c["spec"]["gpus"],
            "min_replicas": c["min_replicas"], "max_replicas": c["max_replicas"], "metric": c["metric"],
            "metrics_url": c.get("metrics_url"), "scale_up_above": c["scale_up_above"],
            "scale_down_below": c["scale_down_below"], "cooldown_s": c["cooldown_s"],
            "scrape_every_s": c["scrape_every_s"], "stabilize": c["stabilize"], "desired": svc.desired,
            "running": sum(jobs[j].state is JobState.RUNNING for j in live), "replicas": reps,
            "last_signal": svc.last_signal, "error": svc.error, "below_since": svc.below_since,
            "command": c["argv"], "last_decision": svc.decisions[-1] if svc.decisions else None,
        }
        if history:
            out["decisions"] = list(svc.decisions)
        return out

    def views(self) -> list[dict]:
        return [self.view(s, history=False) for s in self.by_num.values() if s.deleted is None]
