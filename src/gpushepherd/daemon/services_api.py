"""The HTTP API of inference services (design note 014): ``POST /services``,
``GET /services``, ``GET /services/{name}``, ``DELETE /services/{name}``,
``POST /services/{name}/signals``.

Errors as the job API's: 422 with ``detail`` a list whose entry's ``loc`` names the
field; 404 for an unknown service; 403 for a team the token may not act for. Create and
delete are audited (``service-create``, ``service-delete``; note 023): a success in the
commit of the service's record, a refusal (403, 422) or a storage failure queued for the
next step, as the API's other refusals.
"""

from __future__ import annotations

import re
import time

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import Field, model_validator

from gpushepherd.core.scheduler import SpecError
from gpushepherd.daemon.api import SECONDS_DOC, Seconds, SubmitBody, _spec_field, check_submitter, who_of
from gpushepherd.daemon.auth import Principal
from gpushepherd.daemon.server import Daemon, audit_outcome
from gpushepherd.daemon.services import ServiceError, create_detail
from gpushepherd.daemon.store import audit_row


class ServiceBody(SubmitBody):
    """A service: the replicas' spec and command (as a job's), the replica range and the
    signal it scales on."""

    name: str = Field(min_length=1, max_length=40, description="[a-z][a-z0-9-]*; replicas are jobs NAME.N")
    min_replicas: int = Field(1, ge=0, le=1000, strict=True)
    max_replicas: int = Field(1, ge=1, le=1000, strict=True)
    metric: str = Field(min_length=1, max_length=512, description="the signal: a Prometheus metric name, "
                        "optionally with labels (queue_length, latency_seconds{quantile=\"0.95\"}, tokens_total: "
                        "a counter, scaled on its rate per second); never GPU utilisation")
    metrics_url: str | None = Field(None, description="where the signal is scraped (Prometheus text format); "
                                    "none: pushed to POST /services/NAME/signals")
    scale_up_above: float = Field(allow_inf_nan=False, description="one replica more when the signal stays above")
    scale_down_below: float = Field(allow_inf_nan=False, description="one replica less when it stays below for "
                                    "the cool-down")
    cooldown_s: Seconds = Field(300.0, gt=0, allow_inf_nan=False, description="how long below before a "
                                f"scale-down, and the least time since the last decision: {SECONDS_DOC}")
    scrape_every_s: Seconds = Field(15.0, gt=0, allow_inf_nan=False, description="time between scrapes: "
                                    f"{SECONDS_DOC}")
    stabilize: int = Field(3, ge=1, le=1000, strict=True, description="samples above before a scale-up")

    @model_validator(mode="after")
    def _not_an_array(self):
        if self.array is not None:
            raise ValueError(f"array: {self.array!r} is not allowed: a service has replicas, not array tasks")
        if self.defer() is not None:  # note 021: jobs only
            given = [f for f, on in (("dependency", bool(self.dependency)), ("begin", self.begin is not None),
                                     ("hold", self.hold)) if on]
            raise ValueError(f"{', '.join(given)}: not allowed for a service (dependency, begin and hold are "
                             "for jobs): its replicas start at once")
        if self.deadline is not None:  # replicas are submitted for as long as it runs (note 022)
            raise ValueError(f"deadline: {self.deadline!r} is not allowed: a service runs until deleted; its "
                             "replicas have no deadline")
        return self

    def config(self) -> dict:
        return {k: getattr(self, k) for k in ("name", "min_replicas", "max_replicas", "metric", "metrics_url",
                                              "scale_up_above", "scale_down_below", "cooldown_s",
                                              "scrape_every_s", "stabilize")}


#: the fields of a service's view only its team (and an admin) sees: the replicas' command,
#: where its signal is scraped and the scrape error (which names that address)
SERVICE_PRIVATE = ("command", "metrics_url", "error")


def _refused(where: str, msg: str) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": [{"loc": ["body", where], "msg": msg,
                                                              "type": "value_error"}]})


def mount_services(app: FastAPI, daemon: Daemon, principal) -> None:
    """Add the services' routes to ``app`` (``principal``: the app's auth dependency)."""

    def may_act(p: Principal | None, team: str) -> None:
        why = p.refusal(team) if p is not None else None
        if why is not None:
            raise HTTPException(403, f"team: {team!r} is not allowed: {why}")

    def audit_failed(request: Request, p: Principal | None, action: str, exc: BaseException, claimed: str = "",
                     **row) -> None:
        """The audit row of a create or delete that did not happen: ``denied`` (403),
        ``refused`` (422, 404), ``failed`` (storage)."""
        if isinstance(exc, HTTPException):
            outcome, error = ("denied" if exc.status_code == 403 else "refused"), exc.detail
        else:
            outcome, error = audit_outcome(exc), str(exc)
        detail = {**row.pop("detail", {}), "error": str(error)[:2000]}
        if claimed and (p is None or claimed != p.user):  # the body's user: never recorded as who (note 084)
            detail["claimed_user"] = claimed
        daemon.audit_later(audit_row(time.time(), action, who_of(request, p), outcome, detail=detail, **row))

    def found(name: str):
        svc = daemon.services.live(name)
        if svc is None:
            raise HTTPException(404, f"service {name!r}: no such service")
        return svc

    @app.post("/services", status_code=201)
    def create(body: ServiceBody, request: Request, p: Principal | None = Depends(principal)):
        """Create a service; its ``min_replicas`` replicas are submitted as jobs of its
        class. Returns the service's view once its record is committed (with its audit row)."""
        claimed = body.user
        row = dict(team=body.team, target=body.name, detail=create_detail(
            {**body.config(), "spec": {"user": body.user, "workload_class": body.workload_class, "gpus": body.gpus},
             "argv": body.command}))
        try:
            check_submitter(p, body, daemon.backend.kind == "local" and daemon.backend.run_as.per_user)  # as POST /jobs
            return daemon.services.create(body.config(), body.spec(), body.command, body.shell, body.env, body.cwd,
                                          who=who_of(request, p))
        except ServiceError as exc:
            audit_failed(request, p, "service-create", HTTPException(422, f"{exc.field}: {exc}"), claimed, **row)
            return _refused(exc.field, str(exc))
        except SpecError as exc:
            audit_failed(request, p, "service-create", HTTPException(422, str(exc)), claimed, **row)
            field = _spec_field(str(exc))
            return _refused({"workload_class": "class"}.get(field, field), re.sub(r"^job '[^']*': ", "", str(exc)))
        except Exception as exc:
            audit_failed(request, p, "service-create", exc, claimed, **row)
            raise

    def seen_by(v: dict, p: Principal | None) -> dict:
        """A service's view as ``p`` may see it, as a job's (note 023, "What another team
        sees"; note 084): whole for no principal (a server without tokens, not run as
        root), an admin, the user who made it and a member of its team; else ``SERVICE_PRIVATE`` (the
        replicas' command, where the signal is scraped and the scrape's error, which
        names it) set to ``None`` and listed in ``hidden``."""
        if p is None or (not p.anonymous and (p.admin or v.get("user") == p.user or p.may_act_for(v["team"]))):
            return v
        hidden = [k for k in SERVICE_PRIVATE if k in v]
        return {**v, **dict.fromkeys(hidden), "hidden": hidden}

    @app.get("/services")
    def services(p: Principal | None = Depends(principal)) -> list:
        """Every service not deleted: desired and running replicas, the last signal;
        another team's without its command, metrics URL and scrape error (``hidden``)."""
        with daemon.lock:
            return [seen_by(v, p) for v in daemon.services.views()]

    @app.get("/services/{name}")
    def service(name: str, p: Principal | None = Depends(principal)) -> dict:
        """One service: its replicas (state, placement or pending reason), the last
        signal and scrape error, and every scaling decision with its reason; another
        team's without its command, metrics URL and scrape error (``hidden``)."""
        with daemon.lock:
            return seen_by(daemon.services.view(found(name)), p)

    @app.delete("/services/{name}")
    def delete(name: str, request: Request, p: Principal | None = Depends(principal)) -> dict:
        """Delete a service: its replicas are cancelled (the deletion committed with its
        audit row)."""
        team = None
        try:
            with daemon.lock:
                team = found(name).config["spec"]["team"]
                may_act(p, team)
            try:
                return daemon.services.delete(name, who=who_of(request, p))
            except KeyError:
                raise HTTPException(404, f"service {name!r}: no such service") from None
        except Exception as exc:
            audit_failed(request, p, "service-delete", exc, team=team, target=name)
            raise

    @app.post("/services/{name}/signals")
    def signals(name: str, values: dict[str, float], p: Principal | None = Depends(principal)):
        """Push a sample of the service's signal: ``{"queue_length": 12}``."""
        with daemon.lock:
            may_act(p, found(name).config["spec"]["team"])
        try:
            return daemon.services.push(name, values)
        except KeyError:
            raise HTTPException(404, f"service {name!r}: no such service") from None
        except ServiceError as exc:
            return _refused(exc.field, str(exc))
