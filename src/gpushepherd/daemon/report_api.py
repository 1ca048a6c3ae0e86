"""The report and what-if through the API (issue 18 point 8, design note 029).

``GET /report`` answers what ``shepherd report`` prints (note 010) as JSON, and
``POST /whatif`` what ``shepherd whatif`` does, both built by ``gpushepherd.report``
from the store's event log, so a team lead needs no shell on the server. Both are
scoped by the caller: an admin token (or a server without tokens) sees every team; any
other principal the teams it may act for (``Principal.refusal``: a token's teams, the
policy's members lists on the socket). pandas and matplotlib are imported inside the
handlers only (they are optional extras of the client).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from datetime import time as dtime
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpushepherd.daemon.auth import Principal

WEEK_S = 7 * 86400.0
#: the most days the daily chart has (a longer range is refused: ask for a shorter one)
MAX_DAYS = 400
#: seconds a replay of the event log is reused
REPLAY_TTL_S = 60.0
H = 3600.0


class ReplayCache:
    """The store's event log replayed (``gpushepherd.report.replay``) and its history,
    at most once per ``ttl_s`` seconds, one replay at a time."""

    def __init__(self, batches: Callable[[], object], ttl_s: float = REPLAY_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.batches, self.ttl_s, self.clock = batches, ttl_s, clock
        self.lock = threading.Lock()
        self.at: float | None = None
        self.value = None
        self.builds = 0

    def get(self):
        """``(Replay, History)``.

        Raises:
            gpushepherd.report.HistoryError: the log is empty.
        """
        from gpushepherd.report import replay

        with self.lock:
            now = self.clock()
            if self.at is None or not 0 <= now - self.at < self.ttl_s:
                rp = replay(self.batches())
                self.value, self.at = (rp, rp.history()), now
                self.builds += 1
            return self.value


def teams_in_scope(p: Principal | None, teams: set[str]) -> list[str] | None:
    """The teams of ``teams`` the caller may see; ``None``: all (an admin, or no auth on a
    server not run as root); none for ``auth.ANONYMOUS`` (its ``refusal`` is never ``None``)."""
    if p is None or p.admin:
        return None
    return sorted(t for t in teams if p.refusal(t) is None)


def scoped(hist, teams: list[str] | None):
    """``hist`` with only the rows of ``teams`` (``None``: as it is)."""
    if teams is None:
        return hist
    keep = set(teams)
    return replace(hist, **{name: getattr(hist, name)[getattr(hist, name)["team"].isin(keep)].reset_index(drop=True)
                            for name in ("jobs", "held", "pending", "reasons", "idle")})


def records(df) -> list[dict]:
    """A DataFrame as JSON records (NaN: null)."""
    return json.loads(df.to_json(orient="records", double_precision=10))


def daily_gpu_hours(hist, rep, teams: list[str] | None) -> dict[str, Any]:
    """GPU-hours per team per day of the policy's zone over the report's range:
    ``{"days": ["YYYY-MM-DD", ...], "teams": {team: [hours per day]}}``.

    Raises:
        ValueError: more than ``MAX_DAYS`` days.
    """
    import numpy as np

    clock = hist.rules.clock
    epoch, tz = (clock.epoch, clock.tz) if clock else (0.0, None)
    a, b = rep.t_start, rep.t_end
    starts, bounds = [], []
    d = rep.local(a).date()
    while (t := datetime.combine(d, dtime(0), tzinfo=tz).timestamp() - epoch) < b:  # local midnights
        if len(starts) >= MAX_DAYS:
            raise ValueError(f"the range is not allowed: at most {MAX_DAYS} days")
        starts.append(d)
        bounds.append(max(a, t))
        d += timedelta(days=1)
    bounds.append(b)
    held = hist.held
    start = held["start"].to_numpy(dtype=float)
    end = held["end"].fillna(hist.t_last).to_numpy(dtype=float)
    gpus = held["gpus"].to_numpy(dtype=float)
    names = sorted(set(held["team"]) | set(teams or ()))
    out = {t: [0.0] * len(starts) for t in names}
    team_of = held["team"].to_numpy()
    for i in range(len(starts)):
        secs = np.clip(np.minimum(end, bounds[i + 1]) - np.maximum(start, bounds[i]), 0.0, None)
        for t in names:
            out[t][i] = round(float((secs * gpus)[team_of == t].sum()) / H, 10)
    return {"days": [d.strftime("%Y-%m-%d") for d in starts], "teams": out}


def parse_range(text_from: str | None, text_to: str | None, rp, since_s: float = WEEK_S) -> tuple[float, float]:
    """``[from, to)`` epoch seconds: each an ISO date/time in the policy's zone or epoch
    seconds (``shepherd report``'s grammar); default ``to`` the last event (its jobs'
    events counted: ``build_report``'s ``through_end``), ``from``
    ``since_s`` before ``to``.

    Raises:
        HTTPException: 422 naming ``from`` or ``to``, the value and what is allowed.
    """
    from gpushepherd.cli.report import parse_when

    tz = rp.rules.clock.tz if rp.rules.clock else None

    def when(text: str, name: str) -> float:
        try:
            return parse_when(text, name, tz)
        except ValueError as exc:
            raise refused(name, str(exc).split(": ", 1)[1]) from None

    b = when(text_to, "to") if text_to is not None else rp.t_last
    a = when(text_from, "from") if text_from is not None else b - since_s
    if not a < b:
        raise refused("from", f"{text_from!r} is not allowed: a time before 'to' ({text_to or 'the last event'})")
    if b <= rp.t_first or a > rp.t_last:
        span = " to ".join(datetime.fromtimestamp(t, tz).isoformat(timespec="seconds") for t in (rp.t_first, rp.t_last))
        raise refused("from", f"the range {text_from or a!r} - {text_to or b!r} is not allowed: it must overlap the "
                              f"event log ({span})")
    return a, b


def refused(field: str, msg: str) -> HTTPException:
    return HTTPException(422, [{"loc": ["query", field], "msg": f"{field}: {msg}", "type": "value_error"}])


def json_response(out: dict) -> Response:
    return Response(json.dumps(out, allow_nan=False, default=str), media_type="application/json")


class WhatIfBody(BaseModel):
    """A proposed policy to replay the log's jobs under (``shepherd whatif``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    policy: dict | None = Field(None, description="the proposed policy file's parsed YAML (see docs/policy.md)")
    policy_yaml: str | None = Field(None, description="or the policy file's text (YAML or JSON), as /ui sends it")
    from_: str | None = Field(None, alias="from", max_length=64, description="start: ISO time (the policy's zone) "
                              "or epoch seconds; default 7 days before 'to'")
    to: str | None = Field(None, max_length=64, description="end (excluded); default the last event")

    @model_validator(mode="after")
    def _one_policy(self) -> WhatIfBody:
        if (self.policy is None) == (self.policy_yaml is None):
            raise ValueError("policy: exactly one of policy (the parsed file) and policy_yaml (its text) is allowed")
        return self

    def proposed(self) -> dict:
        """The proposed policy as parsed data.

        Raises:
            ValueError: ``policy_yaml`` that is not YAML, naming the line.
            TypeError: YAML that is not a mapping.
        """
        if self.policy is not None:
            return self.policy
        import yaml

        try:
            raw = yaml.safe_load(self.policy_yaml)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            raise ValueError(f"not YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
        if not isinstance(raw, dict):
            raise TypeError(f"a policy is a mapping (name:, cluster:, classes:, teams: ...), not {type(raw).__name__}")
        return raw


def mount_report(app: FastAPI, daemon, principal) -> ReplayCache:
    """Add ``GET /report`` and ``POST /whatif`` to ``app`` (under its auth). Returns the
    replay cache (its ``builds`` count is what tests look at)."""
    cache = ReplayCache(daemon.store.batches)
    whatif_gate = threading.Semaphore(1)

    def replayed():
        from gpushepherd.report import HistoryError

        try:
            return cache.get()
        except HistoryError as exc:
            raise HTTPException(503, f"no report yet: {exc}") from None

    @app.get("/report")
    def report(t_from: str | None = Query(None, alias="from", max_length=64, description=(
                   "start: an ISO date or date-time in the policy's clock.timezone (2026-11-30, 2026-11-30T08:00) or "
                   "epoch seconds; default 7 days before 'to'")),
               t_to: str | None = Query(None, alias="to", max_length=64, description=(
                   "end (excluded), the same forms; default the last event (included)")),
               p: Principal | None = Depends(principal)) -> Response:  # noqa: B008 (FastAPI's idiom)
        """Showback/chargeback over ``[from, to)`` (``shepherd report``, note 010): the
        report's tables as JSON records (``usage_by_team`` / ``_project`` / ``_user`` /
        ``_class``: jobs, GPU-hours, cost, share, idle GPU-hours; ``waits_by_class``;
        ``top_pending_reasons``; ``usage_against_quota``; ``idle_gaps``, for an admin),
        ``daily`` GPU-hours per team per day of the policy's zone, ``timezone``,
        ``currency``, ``scope.teams`` (``null``: every team). Scoped (note 029): a
        non-admin sees its teams' rows only. 422 for a bad range, 503 while the log is empty."""
        from gpushepherd.report import build_report

        rp, hist = replayed()
        a, b = parse_range(t_from, t_to, rp)
        teams = teams_in_scope(p, set(rp.rules.teams) | set(hist.jobs["team"]))
        mine = scoped(hist, teams)
        rep = build_report(mine, a, b, title="gpushepherd report", through_end=t_to is None)
        tables = dict(rep.tables)
        if teams is not None:
            tables.pop("idle_gaps", None)  # cluster-wide: free GPUs against every team's pending jobs
            for name, df in list(tables.items()):
                if "team" in df.columns:
                    tables[name] = df[df["team"].isin(teams)].reset_index(drop=True)
        try:
            daily = daily_gpu_hours(mine, rep, teams)
        except ValueError as exc:
            raise refused("from", str(exc)) from None
        clock = rp.rules.clock
        return json_response({
            "from": a, "to": b, "start": rep.t_start, "end": rep.t_end, "clipped": rep.clipped,
            "timezone": str(clock.tz) if clock else "UTC", "currency": rep.currency,
            "scope": {"teams": teams}, "tables": {k: records(v) for k, v in tables.items()}, "daily": daily})

    @app.post("/whatif", responses={503: {"description": "Another what-if is running, or the log is empty"}})
    def whatif(body: WhatIfBody, p: Principal | None = Depends(principal)) -> Response:  # noqa: B008
        """Replay the jobs submitted in ``[from, to)`` (default the last 7 days of the
        log) through the simulator under the policy in force and under ``policy``
        (``shepherd whatif``, note 010): per class and team jobs, rejected, wait mean /
        p95, mean JCT, GPU-hours, each as ``_measured`` (the log's own figures for the
        same jobs, note 040), ``_current`` (the baseline), ``_proposed`` and ``_change``. Scoped (note 029): a
        non-admin sees its teams' rows and rejected jobs only (no per-class rows: they mix
        teams). Changes nothing; one at a time (503 with Retry-After otherwise); 422
        naming the field for an invalid policy or range."""
        from gpushepherd.core.scheduler import SpecError
        from gpushepherd.policy.load import PolicyError, policy_from_dict
        from gpushepherd.report.whatif import run_whatif

        if not whatif_gate.acquire(timeout=0):
            return JSONResponse(status_code=503, content={"detail": "another what-if is running: retry in a minute"},
                                headers={"Retry-After": "60"})
        try:
            rp, hist = replayed()
            try:
                raw = body.proposed()
            except (ValueError, TypeError) as exc:
                return JSONResponse(status_code=422, content={"detail": [
                    {"loc": ["body", "policy_yaml"], "msg": f"policy_yaml: {exc}", "type": "value_error"}]})
            try:
                proposed = policy_from_dict(json.loads(json.dumps(raw, default=str)), "<whatif>")
            except PolicyError as exc:
                return JSONResponse(status_code=422, content={"detail": [
                    {"loc": ["body", "policy"], "msg": str(exc), "type": "policy", "field": getattr(exc, "path", "")}]})
            try:
                a, b = parse_range(body.from_, body.to, rp)
            except HTTPException as exc:
                exc.detail[0]["loc"][0] = "body"
                raise
            try:
                wi = run_whatif(rp, proposed.rules, a, b, source="the proposed policy")
            except (SpecError, ValueError) as exc:
                return JSONResponse(status_code=422, content={"detail": [
                    {"loc": ["body", "policy"], "msg": str(exc), "type": "policy"}]})
            teams = teams_in_scope(p, set(rp.rules.teams) | set(proposed.rules.teams) | set(hist.jobs["team"]))
            table, rejected = wi.table, wi.rejected
            team_of = dict(zip(hist.jobs["job_id"], hist.jobs["team"]))
            not_replayed = [{"job": j, "why": why} for j, why in wi.not_replayed
                            if teams is None or team_of.get(j) in teams]
            if teams is not None:
                table = table[(table["by"] == "team") & table["group"].isin(teams)]
                rejected = rejected[rejected["team"].isin(teams)]
            return json_response({"from": a, "to": b, "scope": {"teams": teams}, "rows": records(table),
                                  "rejected": records(rejected), "not_replayed": not_replayed})
        finally:
            whatif_gate.release()

    return cache
