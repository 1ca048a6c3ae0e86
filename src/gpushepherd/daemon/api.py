"""The HTTP API of ``shepherd server`` (FastAPI; the OpenAPI schema is at
``/openapi.json``, the interactive docs at ``/docs``).

Errors: a malformed body is 422 with FastAPI's ``detail`` list, whose ``loc`` names
the field; a spec the policy refuses is 422 with ``detail`` a list of one entry whose
``msg`` names the field, the value and what is allowed; a key given twice in one JSON
object is 422 naming it and where, and a body that is empty, not sent as
``application/json`` or no JSON object is 422 saying so (``UniqueKeysRoute``, every
route that reads a body, after a 401/403 of the caller); an unknown job is 404.
Auth: when the database has a token (or the server runs with ``--auth required``),
every request needs ``Authorization: Bearer TOKEN`` (401 without one or with a wrong or
expired one); a token may submit as its user for its teams and cancel or read the logs
of its teams' jobs only (403 otherwise; an admin token may do all); reads are open to
every valid token; ``/healthz`` and ``/readyz`` need none (Kubernetes probes send none;
note 019). On the local Unix socket the caller is the Unix user the kernel names, no
token; a policy's ``teams.X.members`` limits team X to its members on both paths
(``gpushepherd.daemon.auth``, note 025). A server that runs jobs as their Unix users
(root, note 023) takes nothing from a caller who does not say who it is (HTTP without a
token): it reads what anyone reads and may not submit, cancel, hold, release, update,
requeue, attach, apply a policy, create or delete a service, push a signal, read logs, the
audit log or another job's private fields (403 saying how to authenticate: the socket or a
token; ``auth.ANONYMOUS``, note 084). A server not run as root runs every job as itself:
a tokenless caller is that user, and is recorded as it (a body's ``user`` is never
recorded as who acted unless it is the caller's authenticated identity). Every
submission, cancel, job action, policy apply and token use is in the audit log
(``GET /audit``, note 023). Handlers are plain functions (FastAPI runs them in its
thread pool): they read the core under the daemon's lock and hand changes to the
reconcile loop; ``POST /jobs`` and the token check run on the event loop instead (no
thread hops on the submission path). One WebSocket route, ``/jobs/{id}/attach`` (a pty
job's terminal, note 041; not in the OpenAPI schema, which has no WebSockets), is
authenticated as every request is, on either path.
"""

from __future__ import annotations

import asyncio
import difflib
import email.message
import hashlib
import json
import math
import os
import re
import threading
import time
from dataclasses import replace
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, WebSocket
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.routing import APIRoute
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from starlette.requests import ClientDisconnect, HTTPConnection

from gpushepherd import __version__
from gpushepherd.core.scheduler import Scheduler, SpecError
from gpushepherd.durations import api_seconds
from gpushepherd.daemon.arrays import parse_array
from gpushepherd.daemon.auth import (ANONYMOUS, METRICS_PATH, NO_MEMBERS, NO_TOKEN, UNKNOWN_TCP, Membership, Principal,
                                    is_member, membership_of, socket_principal, user_of_uid)
from gpushepherd.daemon.cgroups import MIN_MEM_MIB
from gpushepherd.daemon.deps import BEGIN_RULE, DEPENDENCY_RULE, parse_begin, parse_dependency
from gpushepherd.daemon.jobpages import (MAX_PAGE_LIMIT, PAGE_LIMIT, JobIndex, decode_cursor, encode_cursor,
                                         page, parse_limit)
from gpushepherd.daemon.jobquery import JOB_NAME_RULE, JobFilter, QueryError, check_job_name
from gpushepherd.daemon.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gpushepherd.daemon.metrics import ResponseCount
from gpushepherd.daemon.policy_change import PolicyConflict
from gpushepherd.daemon.report_api import mount_report
from gpushepherd.daemon.server import Daemon, IdempotencyConflict, JobActionRefused, TokenRequired
from gpushepherd.daemon.store import StorageUnavailable, audit_row, storage_reason
from gpushepherd.daemon.terminal import async_deliver
from gpushepherd.daemon.ui import mount_ui
from gpushepherd.daemon.tcp_peer import peer_uid
from gpushepherd.daemon.unixsock import PEER_KEY
from gpushepherd.model.events import JobSubmitted
from gpushepherd.model.job import MAX_NICE, SHARE_KINDS, GpuShare, JobSpec, first_control_char
from gpushepherd.model.reasons import ReasonCode
from gpushepherd.policy.load import PolicyError, policy_from_dict
from gpushepherd.policy.schema import user_name_refusal
from gpushepherd.timepoints import FORMS as TIME_FORMS, api_time_point


#: what a job's view leaves out for a caller of another team (no admin, not its user;
#: note 023, "What another team sees"): what it runs, where, and its files
PRIVATE_FIELDS = ("name", "command", "cwd", "env", "stdout", "stderr", "checkpoint_dir", "launch_error")
#: seconds ``POST /jobs`` waits for the loop to take a submission (then 503: not confirmed)
SUBMIT_TIMEOUT_S = 60.0
#: the largest request body, bytes (413 above it; note 008, "Input limits")
MAX_BODY_BYTES = 1024 * 1024
#: the largest argv + environment of a job, bytes (Linux's 128 KiB MAX_ARG_STRLEN-ish
#: budget: a longer one would fail at launch with E2BIG; note 008, "Input limits")
MAX_ARGV_ENV_BYTES = 128 * 1024
#: the largest GPU memory a job may ask for, MiB (16 TiB, far above any card)
MAX_MEM_MIB = 16 * 1024 * 1024
#: the longest time limit or estimate, seconds (10 years)
MAX_SECONDS = 10 * 365 * 86400.0
#: the longest user, team, class or project name, characters
MAX_NAME = 255
#: bytes of a run's log one ``GET /jobs/{id}/logs`` returns by default, and at most
LOG_CHUNK_BYTES = 1024 * 1024
MAX_LOG_CHUNK_BYTES = 8 * 1024 * 1024
#: the longest Idempotency-Key, characters
MAX_IDEMPOTENCY_KEY = 255
_IDEM_KEY = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_IDEMPOTENCY_KEY)
#: routes open without a token, as probes are (note 019)
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
#: the ASGI scope key ``principal`` sets on a token-less submission to a server open at the
#: last look: the loop step confirms no token exists (``Command.open_check``, note 032)
OPEN_CHECK_KEY = "gpushepherd.open_check"
#: seconds ``/readyz`` waits for its database read (then the store check fails)
READY_STORE_TIMEOUT_S = 5.0
#: the largest host memory limit of a job, MiB (1 PiB), and CPU limit
MAX_HOST_MEM_MIB = 1024 ** 3
MAX_CPUS = 65536.0
#: audit rows ``GET /audit`` returns by default, and at most
AUDIT_LIMIT, MAX_AUDIT_LIMIT = 1000, 100_000
#: clients whose refused tokens are remembered (one audit row a minute each, note 023)
MAX_REFUSED_CLIENTS = 10_000


def _no_control(field: str, v: str) -> str:
    """``v`` unless it holds a control character (C0, DEL or C1: terminal escapes).

    Raises:
        ValueError: naming the field, the character and what is allowed."""
    bad = first_control_char(v)
    if bad is not None:
        raise ValueError(f"{v!r} is not allowed: {field} without control characters (found {bad!r})")
    return v


def _argv_env_bytes(argv: list[str], env: dict[str, str]) -> int:
    """Bytes the argv and environment take in ``execve`` (each string NUL-terminated)."""
    return sum(len(a.encode()) + 1 for a in argv) + sum(len(k.encode()) + len(v.encode()) + 2
                                                          for k, v in env.items())


#: the numeric fields of a share and their ranges (``ShareBody``; the core's own checks
#: follow at submit: ``core.intake``)
SHARE_RANGES = {"milli": (0, 1000), "mem_mib": (0, MAX_MEM_MIB), "slots": (1, 1024), "procs": (1, 48)}
#: what users write for a share's fields (the policy's and scenarios' words) -> the API's
SHARE_SYNONYMS = {"replica": "slots", "replicas": "slots", "ts_replicas": "slots", "mps_replicas": "slots",
                  "clients": "slots", "fraction": "milli", "gpu_fraction": "milli", "gpu_mem_mib": "mem_mib",
                  "mem": "mem_mib", "memory": "mem_mib", "mig_profile": "profile", "processes": "procs"}
SHARE_DOCS = {"milli": "fraction: thousandths of a GPU; mps: each replica's SM percent x 10",
              "mem_mib": "GPU memory, MiB", "slots": "time_slice: replicas; mps: MPS replicas",
              "procs": "mps: client processes"}


class ShareBody(BaseModel):
    """Part of one GPU (see ``gpushepherd.model.job.GpuShare``)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["fraction", "time_slice", "mps", "mig"]
    milli: int = Field(0, ge=0, le=1000, description="fraction: compute in 1/1000 GPU; mps: SM percent x 10 of "
                       "each replica (0: 100 / the node's max_clients, charged where it lands)")
    mem_mib: int = Field(0, ge=0, le=MAX_MEM_MIB, description="GPU memory in MiB (mps: per replica; 0: the node's "
                         "max_memory_per_client_mib)")
    slots: int = Field(1, ge=1, le=1024, description="time_slice: replicas; mps: MPS replicas (client slots of "
                       "the card's max_clients) taken")
    procs: int = Field(1, ge=1, le=48, description="mps: client processes the job runs; they share its replicas' "
                       "SMs and memory, each limited to 1/procs of them")
    profile: str = Field("", max_length=64, description="mig: the MIG profile (1g.10gb)")

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data):
        """Every refusal names the field as the request wrote it (``share.slots``), the
        value and what is allowed: an unknown key (``replica``: the keys a share takes,
        and the one it is closest to), a kind, a number out of its range, a profile."""
        if not isinstance(data, dict):
            return data  # pydantic names the type expected
        keys = list(cls.model_fields)
        for key in data:
            if key not in cls.model_fields:
                close = [SHARE_SYNONYMS[key]] if key in SHARE_SYNONYMS else \
                    difflib.get_close_matches(str(key), keys, n=1)
                raise ValueError(f"share.{key}: {key!r} is not allowed: a share's keys are {', '.join(keys)}"
                                 + (f" (did you mean {close[0]!r}?)" if close else ""))
        kind = data.get("kind")
        if kind not in SHARE_KINDS:
            raise ValueError(f"share.kind: {kind!r} is not allowed: one of {', '.join(SHARE_KINDS)}"
                             if "kind" in data else f"share.kind: missing, it is required: one of "
                             f"{', '.join(SHARE_KINDS)}")
        for name, (lo, hi) in SHARE_RANGES.items():
            value = data.get(name, lo)
            integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
            if isinstance(value, bool) or not integral or not lo <= value <= hi:
                raise ValueError(f"share.{name}: {value!r} is not allowed: an integer from {lo} to {hi} "
                                 f"({SHARE_DOCS[name]})")
        profile = data.get("profile", "")
        if not isinstance(profile, str) or len(profile) > 64:
            raise ValueError(f"share.profile: {profile!r} is not allowed: a MIG profile name (1g.10gb), at most 64 "
                             "characters")
        return data

    @model_validator(mode="after")
    def _applies(self) -> "ShareBody":
        """A field the kind does not use is refused, not ignored (fraction: milli,
        mem_mib; time_slice: slots, mem_mib; mps: slots, milli, mem_mib, procs; mig: profile)."""
        uses = {"fraction": {"milli", "mem_mib"}, "time_slice": {"slots", "mem_mib"},
                "mps": {"slots", "milli", "mem_mib", "procs"}, "mig": {"profile"}}[self.kind]
        for name in sorted(self.model_fields_set - uses - {"kind"}):
            default = type(self).model_fields[name].default
            if getattr(self, name) != default:
                raise ValueError(f"share.{name}: {getattr(self, name)!r} is not allowed for a {self.kind} share: it "
                                 f"takes kind, {', '.join(sorted(uses))} only")
        return self


#: a duration field of the API: a number is seconds; a string has a unit or Slurm's colons
#: (``gpushepherd.durations.api_seconds``, design note 018)
Seconds = Annotated[float, BeforeValidator(api_seconds)]
SECONDS_DOC = ("seconds (a number), or a string with its unit or in Slurm's --time form: '90s', '30m', '2h', '1d', "
               "'1-12:00:00', '01:30:00' (a string of digits is seconds too)")


#: the most labels a node selector, or taints a toleration list, may hold
MAX_CONSTRAINTS = 64
#: a GPU type a job may ask for: the form of the policy's ``cluster.nodes[].gpu_type``
GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
#: the latest deadline, epoch seconds (9999-12-31T23:59:59Z: what a date can print)
MAX_EPOCH = 253402300799.0
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,252}")
_TAINT = r"^[A-Za-z0-9][^\s]{0,252}$"  # the policy's taint pattern (policy/schema.py), and its length


def node_selector_pairs(v):
    """A node selector as ``(label, value)`` pairs, sorted: from ``{"zone": "a"}`` or
    ``["zone=a", "nvlink"]`` (a bare word is a Slurm feature, value ''). Labels are
    Kubernetes-style keys (``[prefix/]name``: letters, digits, ``._-/``, 1-253); values
    are strings of at most 253 characters without control characters.

    Raises:
        ValueError: naming ``node_selector``, the entry and what is allowed.
    """
    if isinstance(v, dict):
        items = list(v.items())
    elif isinstance(v, list):
        items = []
        for x in v:
            if not isinstance(x, str):
                raise ValueError(f"node_selector: {x!r} is not allowed: a string LABEL=VALUE or LABEL")
            key, _, value = x.partition("=")
            items.append((key, value))
    else:
        raise ValueError(f"node_selector: {v!r} is not allowed: an object {{LABEL: VALUE}} or a list of "
                         "LABEL=VALUE strings")
    if len(items) > MAX_CONSTRAINTS:
        raise ValueError(f"node_selector: {len(items)} labels is not allowed: at most {MAX_CONSTRAINTS}")
    seen: dict[str, str] = {}
    for key, value in items:
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"node_selector: label {key!r} is not allowed: 1-253 letters, digits and ._-/ "
                             "starting with a letter or digit")
        if not isinstance(value, str) or len(value) > 253 or first_control_char(value) is not None:
            raise ValueError(f"node_selector: value {value!r} of {key!r} is not allowed: a string of at most 253 "
                             "characters without control characters")
        if seen.get(key, value) != value:
            raise ValueError(f"node_selector: {key}={value} is not allowed with {key}={seen[key]}: one value a label")
        seen[key] = value
    return sorted(seen.items())


NodeSelector = Annotated[list[tuple[str, str]], BeforeValidator(node_selector_pairs)]
def _toleration(v):
    if not isinstance(v, str) or not re.fullmatch(_TAINT, v):
        raise ValueError(f"{v!r} is not allowed: a taint as the policy writes it: KEY, KEY=VALUE or "
                         "KEY=VALUE:EFFECT (1-253 characters without spaces, starting with a letter or digit)")
    return v


Taint = Annotated[str, BeforeValidator(_toleration)]


class SubmitBody(BaseModel):
    """A job submission. ``class`` is the workload class of the policy."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    workload_class: str = Field(alias="class", min_length=1, max_length=MAX_NAME)
    team: str = Field(min_length=1, max_length=MAX_NAME)
    user: str = Field("", max_length=MAX_NAME)
    project: str = Field("", max_length=MAX_NAME, description="free-form project for showback (Slurm's --wckey; "
                         "'': none); never affects scheduling")
    name: str = Field("", description=f"the job's name (Slurm's --job-name; '': none): "
                      f"{JOB_NAME_RULE}; an array's elements carry it")
    gpus: int = Field(1, ge=1, le=1_000_000, strict=True, description="whole GPUs (1 with a share)")
    share: ShareBody | None = None
    gpu_type: list[str] = Field(default_factory=list, description="allowed GPU types (empty: any)")
    gpu_mem_mib: int = Field(0, ge=0, le=MAX_MEM_MIB, description="minimum memory per GPU, MiB")
    time_limit_s: Seconds | None = Field(None, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description=SECONDS_DOC)
    runtime_estimate_s: Seconds | None = Field(None, gt=0, le=MAX_SECONDS, allow_inf_nan=False,
                                               description=SECONDS_DOC)
    preemptible: bool | None = None
    checkpointable: bool | None = None
    command: list[str] = Field(min_length=1, description="argv; with shell=true, one shell command line")
    shell: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = Field(description="absolute path of an existing directory")
    array: str | None = Field(None, description="a job array (Slurm's --array): 0-99%8 is indices 0..99, at most 8 "
                              "not yet ended at a time; 1,3,5-7; 0-15:4")
    max_retries: int = Field(2, ge=0, le=100, description="array: times a FAILED chunk is run again")
    # kept by the server until they allow (design note 021)
    dependency: str = Field("", max_length=4096, description=f"Slurm's --dependency: {DEPENDENCY_RULE}; "
                            "an unknown job id is refused")
    begin: float | str | None = Field(None, description=f"not before this time (Slurm's --begin): {BEGIN_RULE}")
    hold: bool = Field(False, description="submit held (Slurm's --hold): not scheduled until released")
    pty: bool = Field(False, description="run on a pseudo-terminal that a client attaches to through the WebSocket "
                      "GET /jobs/{id}/attach (Slurm's srun --pty; shepherd run --pty): cancelled once no client has "
                      "been attached for a few seconds while it runs. The local backend only; not with array "
                      "(design note 041)")

    @field_validator("dependency")
    @classmethod
    def _dependency(cls, v: str) -> str:
        if v.strip():
            parse_dependency(v)  # ValueError naming the value and what is allowed
        return v.strip()

    @field_validator("begin")
    @classmethod
    def _begin(cls, v):
        if v is not None:
            parse_begin(v, time.time())  # the syntax; the loop resolves now+ at its own time
        return v

    def defer(self) -> dict | None:
        """What keeps the job from the core (``Daemon.submit_future``'s ``defer``), or ``None``."""
        if not self.dependency and self.begin is None and not self.hold:
            return None
        return {"dependency": self.dependency, "begin": self.begin, "held": self.hold}
    # -- placement constraints and deadline (note 022): JobSpec's fields, absent = none
    node_selector: NodeSelector = Field(default_factory=list, description="labels a node must carry: "
                                        "{\"zone\": \"a\"} or [\"zone=a\", \"nvlink\"] (a bare word is a Slurm "
                                        "feature: the label's value '')")
    tolerations: list[Taint] = Field(default_factory=list, max_length=MAX_CONSTRAINTS, description="taints the job "
                                     "tolerates, as the policy writes them: key=value (Equal), key (Exists: any "
                                     "value), key=value:NoSchedule")
    min_driver: str = Field("", description="lowest NVIDIA driver version, dotted numbers (535.104; '': any)")
    cache_key: str = Field("", max_length=253, description="a model or dataset the job reads: nodes whose policy "
                           "lists it under cached are preferred ('': none)")
    cache_required: bool = Field(False, description="only nodes that hold cache_key")
    deadline: Annotated[float, BeforeValidator(api_time_point)] | None = Field(
        None, ge=0, le=MAX_EPOCH, allow_inf_nan=False, description=f"when the job must be done: epoch seconds, or "
        f"{TIME_FORMS}; flagged (deadline_at_risk) when it cannot end by it, never refused for it")
    gpus_per_pod: int | None = Field(None, ge=1, le=1_000_000, strict=True, description="a gang of pods of this "
                                     "many GPUs each (a divisor of gpus; each pod on one node, pods may share one; "
                                     "Slurm's --gpus-per-task)")
    same_node: bool = Field(False, description="every GPU on one node (Slurm's -N 1)")
    require_island: bool | None = Field(None, description="all its GPUs inside one NVLink island of one node: it "
                                        "waits (NoFit(nvlink-island)) rather than span islands; null: its class's "
                                        "require_island; not with gpus_per_pod (note 037)")
    grace_period_s: Seconds | None = Field(None, ge=0, le=MAX_SECONDS, allow_inf_nan=False,
                                           description="the grace its stops get, at most its class's (the default; "
                                           "only a job that checkpoints gets one): " + SECONDS_DOC)
    # -- cgroup limits (note 023): enforced, never scheduled on
    mem_mib: int | None = Field(None, ge=MIN_MEM_MIB, le=MAX_HOST_MEM_MIB, strict=True, description="host memory "
                                "(RAM) limit of all the job's processes together, MiB (its cgroup's memory.max, no "
                                f"swap past it; at least {MIN_MEM_MIB}: the runner counts too); past it the kernel "
                                "kills a process and the job ends OUT_OF_MEMORY. Refused where the server has no "
                                "cgroup memory controller")
    cpus: float | None = Field(None, gt=0, le=MAX_CPUS, allow_inf_nan=False, description="CPU limit of the job's "
                               "processes together, in CPUs (1.5: one and a half; its cgroup's cpu.max). Refused "
                               "where the server has no cgroup cpu controller")

    @field_validator("min_driver")
    @classmethod
    def _min_driver(cls, v: str) -> str:
        if v and not re.fullmatch(r"\d{1,9}(\.\d{1,9}){0,5}", v):
            raise ValueError(f"{v!r} is not allowed: a driver version as dotted numbers (535.104.05)")
        return v

    @field_validator("cache_key")
    @classmethod
    def _cache_key(cls, v: str) -> str:
        return _no_control("cache_key", v)

    @model_validator(mode="after")
    def _cache_needs_key(self) -> "SubmitBody":
        if self.cache_required and not self.cache_key:
            raise ValueError("cache_required: true is not allowed without cache_key: the key the node must hold")
        if self.deadline is not None and self.array is not None:
            # an array's tasks are submitted as room frees up, some after the deadline, which
            # the core refuses (a deadline after submit_time)
            raise ValueError("deadline is not allowed with array: its tasks are submitted as room frees up, some "
                             "after the deadline; submit the jobs one by one to give each a deadline")
        return self

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        if v is not None:
            parse_array(v)  # ValueError naming the value and what is allowed
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_job_name(v)  # ValueError naming the value and what is allowed

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str) -> str:
        if not os.path.isabs(v) or not os.path.isdir(v):
            raise ValueError(f"{v!r} is not allowed: the absolute path of an existing directory")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"variable name {key!r} is not allowed: a non-empty name without '=' or NUL")
            if "\0" in value:
                raise ValueError(f"the value of {key!r} is not allowed: a string without NUL bytes")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v[0]:
            raise ValueError("'' is not allowed: a program name or path first")
        for i, arg in enumerate(v):
            if "\0" in arg:
                raise ValueError(f"argument {i} ({arg[:40]!r}) is not allowed: strings without NUL bytes")
        return v

    @field_validator("gpu_type")
    @classmethod
    def _gpu_types(cls, v: list[str]) -> list[str]:
        # a node's gpu_type is a policy name (cluster.nodes[].gpu_type): a job asking for
        # anything else could never run; said at submit, not as a rejection later
        if len(v) > MAX_CONSTRAINTS:
            raise ValueError(f"{len(v)} GPU types is not allowed: at most {MAX_CONSTRAINTS}")
        for x in v:
            if not GPU_TYPE.fullmatch(x):
                raise ValueError(f"{x[:80]!r} is not allowed: a GPU type as the policy names one "
                                 "(cluster.nodes[].gpu_type: 1-128 letters, digits and ._-, first a letter or "
                                 "digit, e.g. H100-80GB)")
        return v

    @field_validator("workload_class", "team", "user", "project")
    @classmethod
    def _names(cls, v: str, info) -> str:
        v = _no_control({"workload_class": "class"}.get(info.field_name, info.field_name), v)
        # a user is a Unix user's name: jobs may run as it, usage and fair-share are kept by
        # it, and a policy's teams.X.members names users so (user_name_refusal)
        why = user_name_refusal(v) if info.field_name == "user" and v else None
        if why is not None:
            raise ValueError(why + "; or none for the caller")
        return v

    @model_validator(mode="after")
    def _argv_env_size(self) -> "SubmitBody":
        size = _argv_env_bytes(self.command, self.env)
        if size > MAX_ARGV_ENV_BYTES:
            raise ValueError(f"command and env: {size:,} bytes is not allowed: at most {MAX_ARGV_ENV_BYTES:,} "
                             "bytes together (the OS refuses a longer argv + environment at launch)")
        return self

    def spec(self) -> JobSpec:
        share = GpuShare(**self.share.model_dump()) if self.share else None
        return JobSpec(id="", team=self.team, workload_class=self.workload_class, gpus=self.gpus, user=self.user,
                       gpu_types=tuple(self.gpu_type), gpu_mem_mib=self.gpu_mem_mib, time_limit_s=self.time_limit_s,
                       runtime_estimate_s=self.runtime_estimate_s, preemptible=self.preemptible,
                       checkpointable=self.checkpointable, share=share, project=self.project,
                       name=self.name, node_selector=tuple(self.node_selector), tolerations=tuple(self.tolerations),
                       min_driver=self.min_driver, cache_key=self.cache_key, cache_required=self.cache_required,
                       deadline=self.deadline, gpus_per_pod=self.gpus_per_pod, same_node=self.same_node,
                       grace_period_s=self.grace_period_s, mem_mib=self.mem_mib or 0, cpus=self.cpus or 0.0,
                       require_island=self.require_island)


class UpdateBody(BaseModel):
    """What ``PATCH /jobs/{id}`` may change of a job (``scontrol update``, notes 021 and
    039); only the fields given change."""

    model_config = ConfigDict(extra="forbid")
    time_limit_s: Seconds | None = Field(None, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description=(
        SECONDS_DOC + "; a pending or running job's: its user may lower it, an admin may raise it up to the "
        "class's max runtime"))
    nice: int | None = Field(None, ge=-MAX_NICE, le=MAX_NICE, strict=True, description=(
        "priority adjustment in score points, subtracted from the job's priority (Slurm's nice): its user may "
        "raise it (lower the job's priority), only an admin may lower it (a negative nice moves the job up)"))
    name: str | None = Field(None, description=f"{JOB_NAME_RULE}; '': none")
    begin: float | str | None = Field(None, description=BEGIN_RULE)

    @model_validator(mode="before")
    @classmethod
    def _only(cls, data):
        if isinstance(data, dict):
            other = sorted(set(data) - {"time_limit_s", "nice", "name", "begin"})
            if other:
                raise ValueError(f"{', '.join(other)}: cannot be changed after submit: only time_limit_s, nice, "
                                 "name and begin (cancel and submit again for the rest)")
            if not data:
                raise ValueError("nothing to change: give time_limit_s, nice, name or begin")
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return v if v is None else check_job_name(v)

    @field_validator("begin")
    @classmethod
    def _begin(cls, v):
        if v is not None:
            parse_begin(v, time.time())
        return v


class ErrorBody(BaseModel):
    """Every error answer: ``detail`` is one message, or (422) a list of entries whose
    ``loc`` names the field and ``msg`` the value and what is allowed."""

    detail: str | list[dict]


#: the error answers every route may give, declared in the OpenAPI schema (issue 19)
ERROR_RESPONSES = {code: {"model": ErrorBody, "description": what} for code, what in (
    (400, "A malformed request (HTTP syntax)."),
    (401, "No token, or an unknown, revoked or expired one (once the server has tokens)."),
    (403, ("The token or socket user may not do this (another team's job, not a member of the team, another "
           "user, not an admin; a metrics token off /metrics).")),
    (404, "No such job, service or route."),
    (409, "Not possible in the job's state (hold, release, update, requeue); the detail says what works."),
    (408, "Headers or body not received in time (--header-timeout)."),
    (413, "A request body over 1 MiB."),
    (422, "A field, header or value that is not allowed; each entry names it."),
    (503, "Storage unavailable or not confirmed in time; Retry-After says when to retry."),
)}


class PolicyBody(BaseModel):
    """A policy to check or apply: the policy file's parsed YAML as JSON."""

    model_config = ConfigDict(extra="forbid")
    policy: dict = Field(description="the parsed policy file (see docs/policy.md)")
    source: str = Field("", max_length=4096, description="the file it came from, for messages and history")
    user: str = Field("", max_length=255, description="who the client says applies it: never recorded as who "
                      "did (that is the token's user, the socket's caller, or on a server not run as root without "
                      "tokens the server's user; note 084); a refusal's audit row keeps it as claimed_user")


class _Twice:
    """The key ``_KeysOnce.hook`` adds to an object that names ``key`` twice (never a JSON key)."""

    def __init__(self, key: str):
        self.key = key


#: the ASGI scope key of a JSON body's refusal found by ``UniqueKeysRoute`` (a 422 entry),
#: raised by ``body_keys_once`` once the principal is known (note 084)
BODY_REFUSAL_KEY = "gpushepherd.body_refusal"


class _KeysOnce:
    """``json.loads``' ``object_pairs_hook`` for one body: the object, marked (``_Twice``)
    when a key repeats, and ``found`` set. A body whose keys are all unique is parsed
    once with no other pass; only a marked one is walked (``_twice_at``) for the path."""

    def __init__(self):
        self.found = False

    def hook(self, pairs: list) -> dict:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set = set()
            twice = next(k for k, _ in pairs if k in seen or seen.add(k))
            out[_Twice(twice)] = None
            self.found = True
        return out


def _twice_at(doc) -> tuple | None:
    """The path (keys and indices) of the first key given twice in ``doc``, the key last:
    depth first in document order, without recursion (any depth)."""
    stack: list = [((), doc)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict):
            mark = next((k for k in v if isinstance(k, _Twice)), None)
            if mark is not None:
                return (*path, mark.key)
            stack.extend(((*path, k), x) for k, x in reversed(v.items()) if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            stack.extend(((*path, i), x) for i, x in reversed(list(enumerate(v))) if isinstance(x, (dict, list)))
    return None


def _shown(path: tuple) -> str:
    """A key's path for a message: ``policy.teams.ml``, ``nodes.0.name``; a key that is
    empty or holds a dot or space quoted (``env."".A``)."""
    return ".".join(str(k) if isinstance(k, int) or (k and not set(k) & set('. "')) else json.dumps(k)
                    for k in path)


#: what a body's refusal says it must be (``_body_kind_refusal``)
JSON_OBJECT_NEEDED = "the body must be a JSON object (Content-Type: application/json)"
#: JSON's kinds of value, as a refusal names what came instead of an object
_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
               type(None): "null"}


def is_json_type(content_type: str) -> bool:
    """Whether a ``Content-Type`` is one FastAPI reads as JSON: ``application/json`` or
    ``application/*+json``, with any parameters (``; charset=utf-8``)."""
    message = email.message.Message()
    message["content-type"] = content_type
    sub = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (sub == "json" or sub.endswith("+json"))


def _body_kind_refusal(body: bytes, content_type: str | None) -> dict | None:
    """The 422 entry for a body that is empty or not sent as JSON (every body of this API
    is a JSON object), in words, instead of pydantic's "Field required" or "Input should
    be a valid dictionary" about the value FastAPI made of it; ``None``: sent as JSON.
    No Content-Type is refused too, as FastAPI does since 0.132 (``strict_content_type``:
    a browser sends such a request cross-site without a CORS preflight), on every
    FastAPI version. 422, not 415: FastAPI's own check answers 422, and so does every
    other refusal of a body here (a ``detail`` list the CLI prints)."""
    if not body:
        msg = "the body is empty: a JSON object is required"
    elif not content_type:
        msg = f"{JSON_OBJECT_NEEDED}: the request has no Content-Type"
    elif not is_json_type(content_type):
        msg = f"{JSON_OBJECT_NEEDED}, not {content_type[:80]!r}"
    else:
        return None
    return {"loc": ["body"], "type": "body_type", "msg": msg}


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate_at(doc, at: tuple = ()) -> tuple[list, str] | None:
    """The path (keys and indices) of the first key or string in ``doc`` with a lone
    surrogate (text UTF-8 cannot hold) and that text, its surrogates written ``\\udXXX``;
    ``None``: there is none."""
    def shown(text: str) -> str | None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode()
        return None

    if isinstance(doc, str):
        text = shown(doc)
        return None if text is None else (list(at), text)
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        if isinstance(k, str) and (text := shown(k)) is not None:
            return [*at, text], text
        found = _lone_surrogate_at(v, (*at, k))
        if found is not None:
            return found
    return None


def _body_refusal(request: Request, body: bytes) -> dict | None:
    """The 422 entry for a JSON ``body`` that gives a key twice in one object (JSON leaves
    it open, Python keeps the last one silently; the policy's YAML loader refuses it too,
    ``yamlio``; note 084) or is nested too deeply to read, as the other validation errors
    name theirs, or is no JSON at all (FastAPI's own parse answered that before the
    principal: a caller without a token got 422, not 401). ``None`` when every key is
    unique - the parsed body is then the request's ``json()``, read once."""
    keys = _KeysOnce()
    try:
        # JSON between systems is UTF-8 (RFC 8259, section 8.1; a BOM may be ignored):
        # json.loads of bytes would read UTF-16 and UTF-32 too
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        request._json = None
        return {"loc": ["body"], "type": "json_invalid",
                "msg": f"the body is not UTF-8 (byte {exc.start} of it): a JSON object in UTF-8 is required"}
    try:
        doc = json.loads(text, object_pairs_hook=keys.hook)
    except RecursionError:
        request._json = None  # FastAPI's parse would fail the same way: the refusal answers first
        return {"loc": ["body"], "type": "value_error",
                "msg": "the JSON body is nested too deeply to read: no request of this API needs more than a "
                       "few levels"}
    except ValueError as exc:  # no JSON: refused as FastAPI would, but after the principal (a 401 first)
        request._json = None
        if isinstance(exc, json.JSONDecodeError):
            return {"loc": ["body", exc.pos], "type": "json_invalid",
                    "msg": f"JSON decode error: {exc.msg} at line {exc.lineno}, column {exc.colno} (character "
                           f"{exc.pos}): the body must be one JSON object"}
        return {"loc": ["body"], "type": "json_invalid",
                "msg": f"JSON decode error: {exc}: the body must be one JSON object, in UTF-8"}
    request._json = doc  # Starlette's cache of ``Request.json()``: FastAPI parses it no more
    if _SURROGATE_ESCAPE.search(text) and (found := _lone_surrogate_at(doc)) is not None:
        # a \ud800 escape with no pair is no character: stored, it broke every answer that
        # showed it (a policy's description: GET /policy was a 500 for good, a tester's find)
        request._json = None
        at, value = found
        return {"loc": ["body", *at], "type": "value_error",
                "msg": f"'{value[:80]}' is not allowed: a \\u escape of half a UTF-16 surrogate pair with no "
                       "other half is no character; text in valid Unicode is required"}
    if not isinstance(doc, dict):
        return {"loc": ["body"], "type": "body_type",
                "msg": f"the body must be a JSON object ({{...}}), not {_JSON_KINDS.get(type(doc), 'that')}"}
    if not keys.found:
        return None
    at = _twice_at(doc)
    return {"loc": ["body", *at], "type": "value_error",
            "msg": f"key {at[-1]!r} appears twice in one object (at {_shown(at)}): each key once, as in a "
                   "policy file (which one counts is not defined in JSON)"}


async def body_keys_once(request: HTTPConnection) -> None:
    """The app's dependency after ``principal``: the refusal ``UniqueKeysRoute`` found in
    the request's JSON body, a 422 - after a 401/403 of the principal, as FastAPI's other
    validation errors of a body (note 084).

    Raises:
        RequestValidationError: a key given twice, a body nested too deeply, one that
            is no JSON or no JSON object, empty, or not sent as JSON.
    """
    refusal = request.scope.get(BODY_REFUSAL_KEY)
    if refusal is not None:
        raise RequestValidationError([refusal])


class UniqueKeysRoute(APIRoute):
    """The API's routes: on a route that reads a JSON body (a body parameter), the body is
    parsed once here, and a body that is empty or not sent as JSON (``_body_kind_refusal``),
    no JSON object, a key given twice in one object or a body nested too deeply is kept
    in the scope for ``body_keys_once`` to refuse once the caller is known. A
    route without a body parameter never reads one (its body is ignored, as before)."""

    def get_route_handler(self):
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def unique(request: Request) -> Response:
            try:
                body = await request.body()  # kept by the request: FastAPI reads it again at no cost
            except ClientDisconnect:  # nobody reads the answer; a 4xx, not a server fault (5xx)
                return JSONResponse(status_code=400, content={"detail": "the client closed the connection before "
                                                                        "the body was complete"})
            refusal = _body_kind_refusal(body, request.headers.get("content-type"))
            if refusal is None:
                refusal = _body_refusal(request, body)
            if refusal is not None:
                request.scope[BODY_REFUSAL_KEY] = refusal
            return await handler(request)
        return unique


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is 413 (by its
    ``Content-Length``, or counted as it arrives when chunked) before any handler
    sees it; a smaller one is passed on whole."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self._refuse(int(length), scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # a disconnect: let the app see it
                chunks = None
                first = msg
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
            if size > self.limit:
                return await self._refuse(size, scope, receive, send)
        if chunks is not None:
            first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return first
            return await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, size: int, scope, receive, send) -> None:
        await JSONResponse(status_code=413, content={"detail": f"request body: {size:,} bytes or more is not "
                                                               f"allowed: at most {self.limit:,} bytes"})(
            scope, receive, send)


def _policy_refused(exc: Exception) -> JSONResponse:
    """422 for a policy that is invalid (one entry naming the field) or that conflicts
    with live jobs (one entry per job and field)."""
    if isinstance(exc, PolicyConflict):
        detail = [{"loc": ["body", "policy"], "msg": c.msg, "type": "conflict", "job": c.job, "field": c.field}
                  for c in exc.conflicts]
    else:
        detail = [{"loc": ["body", "policy"], "msg": str(exc), "type": "policy",
                   "field": getattr(exc, "path", "")}]
    return JSONResponse(status_code=422, content={"detail": detail})


def unavailable(exc: BaseException, applied: bool = False) -> JSONResponse:
    """503 for a storage failure or an answer the loop did not give in time: ``detail``
    names the cause and whether anything was applied, ``Retry-After`` when to retry
    (note 017: never "500 and applied")."""
    if isinstance(exc, TimeoutError):
        msg = ("not confirmed within the server's time limit: the server is busy or its storage is slow; it may "
               "still be applied - retry with the same Idempotency-Key (a submission) or simply again (a cancel: "
               "it is idempotent)")
    else:
        reason = storage_reason(exc) or f"database error ({type(exc).__name__})"
        msg = str(StorageUnavailable(reason, applied=applied))
    return JSONResponse(status_code=503, content={"detail": msg},
                        headers={"Retry-After": str(StorageUnavailable.RETRY_AFTER_S)})


def check_submitter(p: Principal | None, body, per_user: bool = False) -> None:
    """With auth, a submission's ``user`` must be the principal's (the token's, or the
    socket caller's; unless admin) and its ``team`` one it may act for
    (``Principal.refusal``: the token's teams, the policy's members; note 025);
    ``user`` defaults to the principal's (without one: the server's Unix user). The same rule for jobs and services (note 017:
    ``POST /services`` skipped the user check). ``per_user``: the server runs jobs as
    their Unix users (note 023), so a caller who does not say who it is (no token, not
    the socket; ``auth.ANONYMOUS`` there) may not submit: it could name any user, root too.

    Raises:
        HTTPException: 403 naming the field, the value and what the token allows.
    """
    if p is None or p.anonymous:
        if p is not None and p.tcp:
            raise HTTPException(403, f"user: {body.user!r} is not allowed: {p.refusal(body.team)}")
        if per_user or p is not None:
            raise HTTPException(403, f"user: {body.user!r} is not allowed without a token: this server runs each "
                                     "job as its Unix user, so it must know who submits (its Unix socket, or "
                                     "shepherd token create --user U, then --token or $SHEPHERD_TOKEN)")
        # a server not run as root, without tokens: every caller is its user (``who_of``), and
        # a job that names none is that user's - not user '' (a newcomer's find)
        body.user = body.user or user_of_uid(os.geteuid())
        return
    if body.user and body.user != p.user and not p.admin:
        who = (f"this connection's owner is Unix user {p.user!r}" if p.tcp else
               f"the socket's caller is Unix user {p.user!r}" if p.via_socket else f"this token is user {p.user!r}")
        raise HTTPException(403, f"user: {body.user!r} is not allowed: {who}")
    why = p.refusal(body.team)
    if why is not None:
        raise HTTPException(403, f"team: {body.team!r} is not allowed: {why}")
    body.user = body.user or p.user


def who_of(request: HTTPConnection, p: Principal | None) -> dict:
    """``who`` of an audit row (note 023): the principal's user and token id (``''``,
    shown ``-``, for ``auth.ANONYMOUS``), or - ``p`` ``None``: a server not run as root
    without tokens, where every caller is the server's user - this process's user, never
    a name the request gives (note 084); ``uid``: the Unix uid the kernel vouches for (the
    local socket's caller, note 025; a traced loopback TCP caller, note 087; else ``None``
    over TCP); ``address``: the client's
    ``HOST:PORT``, or ``unix socket (pid N)``."""
    peer = request.scope.get(PEER_KEY)
    client = request.client
    if peer is not None:
        address = f"unix socket (pid {peer.pid})"
    else:
        address = f"{client.host}:{client.port}" if client is not None and client.host else None
    return {"user": p.user if p is not None else user_of_uid(os.geteuid()),
            "token_id": p.token_id if p is not None else None,
            "uid": p.uid if p is not None else None, "address": address}


class Bearer(HTTPBearer):
    """``HTTPBearer`` that reads a WebSocket's handshake too (``GET /jobs/{id}/attach``)."""

    async def __call__(self, request: HTTPConnection) -> HTTPAuthorizationCredentials | None:
        return await super().__call__(request)


def _spec_field(msg: str) -> str:
    # SpecError text: "job 'ID': FIELD: VALUE is not allowed: ..."
    parts = msg.split(": ")
    return parts[1] if len(parts) > 2 and parts[0].startswith("job ") else "body"


def _spec_loc(field: str) -> list[str]:
    """The error location of a ``SpecError``'s field: ``share.slots`` ->
    ``["body", "share", "slots"]``, as pydantic locates the request's own fields."""
    return ["body", *field.split(".")] if re.fullmatch(r"\w+(\.\w+)*", field) else ["body", field]


def never_fits(rules, spec: JobSpec, now: float) -> str | None:
    """Why no placement or limit of ``rules`` could ever let ``spec`` start
    (``ExceedsCapacity(...)``: a limit it exceeds at its loosest, more than the nodes it
    may use hold, other classes' reserved GPUs), as the core says it of a queued job; read
    on a scratch core of ``rules`` with every node empty, so it is the same whatever the
    job's begin time, dependency or hold, which keep it from the live core (note 021), and
    for an array's tasks, queued later. ``None``: it could start."""
    probe = Scheduler(rules)
    probe.handle([JobSubmitted(now, replace(spec, id="probe", submit_time=now))])
    why = probe.state_reason("probe")
    return why if why is not None and why.startswith(ReasonCode.EXCEEDS_CAPACITY.value) else None


def make_app(daemon: Daemon, auth_required: bool = False) -> FastAPI:
    """The FastAPI application serving ``daemon``.

    Args:
        auth_required: every request needs a valid token even while the database
            has none; otherwise tokens are required once one has ever existed
            (revoking the last one does not turn auth off).
    """
    bearer = Bearer(auto_error=False, scheme_name="HTTPBearer",  # the OpenAPI name it had before note 041
                    description="An API token from `shepherd token create`.")
    per_user = daemon.backend.kind == "local" and daemon.backend.run_as.per_user
    # a root server that runs every job as itself: a tokenless caller is traced (note 087)
    traced = not per_user and os.geteuid() == 0
    used: set[tuple[int, str]] = set()  # (token id, client host) seen this server's life: token-use rows
    refused_at: dict[str, float] = {}  # client host -> time of its last token-refused row

    def audit_token(request: HTTPConnection, p: Principal | None, why: str | None) -> None:
        """The first use of a token from a client host in this server's life, and refused
        tokens (one row a minute per host), in the audit log (note 023)."""
        host = request.client.host if request.client is not None else ""
        what = {"request": f"{request.scope.get('method', 'WEBSOCKET')} {request.url.path}"}
        if p is not None:
            if (p.token_id, host) not in used:
                used.add((p.token_id, host))
                daemon.audit_later(audit_row(time.time(), "token-use", who_of(request, p), target=str(p.token_id),
                                             detail={**what, "first": True}))
            return
        now = time.time()
        if now - refused_at.get(host, float("-inf")) < 60.0:
            return
        if len(refused_at) >= MAX_REFUSED_CLIENTS:
            refused_at.clear()
        refused_at[host] = now
        daemon.audit_later(audit_row(now, "token-refused", who_of(request, ANONYMOUS), "denied",
                                     detail={**what, "error": why}))

    members_cache: list = [None, NO_MEMBERS]  # [version, Membership] of the policy in force

    def membership() -> Membership:
        """The members lists of the policy in force, parsed once per version (read
        without the daemon's lock, as on the event loop: an apply only appends to the
        history, or replaces the list; note 025)."""
        cur = daemon.policy_view()
        if members_cache[0] != cur["version"]:
            members_cache[:] = [cur["version"], membership_of(cur.get("policy"), cur["version"])]
        return members_cache[1]

    def tcp_principal(request: HTTPConnection) -> Principal | None:
        """A tokenless caller of a root server that runs jobs as itself: the Unix user
        owning its loopback connection in the kernel's TCP table, as on the socket;
        ``UNKNOWN_TCP`` when the table does not name it; ``None`` (the server's user, as
        before note 087) for an in-process ASGI client, which has no IP address."""
        client, server = request.client, request.scope.get("server")
        try:
            uid = peer_uid((client.host, client.port), server) if client is not None and server else None
        except ValueError:  # not an IP connection: an in-process client (tests, the demo's own calls)
            return None
        if uid is None:
            return UNKNOWN_TCP
        return replace(socket_principal(uid, open_teams=True, tcp=True), membership=membership())

    async def principal(request: HTTPConnection,
                        cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal | None:
        """The request's (or WebSocket handshake's) principal; ``None`` when auth is off (the
        database never had a token, and not ``auth_required``) and for the probes (``PROBE_PATHS``). On the
        Unix socket, the kernel's user (never a token; note 025). On the event loop, no
        thread: one primary-key read (``Store.active_tokens_cached``), the tokens read
        again only after one was created or revoked.

        Raises:
            HTTPException: 401 without a token, with an unknown, revoked or expired one
                (saying when it expired); 403 for a metrics token off ``/metrics``.
        """
        if request.url.path in PROBE_PATHS:
            return None  # a probe reads no job and sends no token
        if cred is None and not auth_required and not per_user and not traced and request.scope.get(PEER_KEY) is None \
                and request.scope.get("method") == "POST" and request.url.path == "/jobs" \
                and daemon.store.never_had_tokens_cached():
            # a submission without a token to a server open at the last look: the loop step
            # that takes it reads the tokens, once for the step's submissions (note 032)
            request.scope[OPEN_CHECK_KEY] = True
            return None
        active = daemon.store.active_tokens_cached()
        auth_on = bool(active) or auth_required or daemon.store.had_tokens_cached()
        peer = request.scope.get(PEER_KEY)
        if peer is not None:
            return replace(socket_principal(peer.uid, open_teams=not auth_on), membership=membership())
        if not auth_on:  # never had a token: open (loopback only); revoking every token never reopens it
            # jobs run as their users: a caller who says nothing acts for no one (note 084)
            if per_user:
                return ANONYMOUS
            return tcp_principal(request) if traced else None

        p = daemon.store.authenticate(cred.credentials, active) if cred is not None else None
        if p is None:
            why = NO_TOKEN if cred is None else "the token is unknown or revoked"
            if cred is not None:
                audit_token(request, None, why)
            raise HTTPException(401, why, headers={"WWW-Authenticate": "Bearer"})
        if p.expired():
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(p.expires))
            why = (f"the token expired at {when} (token {p.token_id}, user {p.user!r}): ask an admin for a new one "
                   "(shepherd token rotate ID, or token create)")
            audit_token(request, None, why)
            raise HTTPException(401, why, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        if p.scope == "metrics" and request.url.path != METRICS_PATH:
            raise HTTPException(403, f"this token is a metrics scrape token (token {p.token_id}): valid on "
                                     f"{METRICS_PATH} only")
        audit_token(request, p, None)
        return replace(p, membership=membership())

    def confirm_open(request: Request) -> None:
        """For a submission ``principal`` left to the loop (``OPEN_CHECK_KEY``) answered
        without it: raises ``principal``'s 401 if a token exists by now."""
        request.scope[OPEN_CHECK_KEY] = False
        daemon.store.active_tokens_cached()
        if daemon.store.had_tokens_cached():
            raise HTTPException(401, NO_TOKEN, headers={"WWW-Authenticate": "Bearer"})

    def job_team(job_id: str) -> str:
        with daemon.lock:
            team = daemon.job_team(job_id)
        if team is None:
            raise HTTPException(404, f"job {job_id!r}: no such job")
        return team

    def may_act_on(p: Principal | None, job_id: str, what: str, request: Request | None = None,
                   action: str = "") -> None:
        team = job_team(job_id)
        why = p.refusal(team) if p is not None else None
        if why is not None:
            if why.startswith("this token's teams"):  # a token's own teams: the message as before note 025
                why = f"user {p.user!r} may {what} jobs of teams {p.teams_text()} only"
            denied = HTTPException(403, f"job {job_id!r} is team {team!r}'s: {why}")
            if action:
                deny(request, p, action, denied, team=team, target=job_id)
            raise denied

    def deny(request: HTTPConnection, p: Principal | None, action: str, exc: HTTPException, claimed: str = "",
             **row) -> None:
        """An audit row for an action refused by the API itself (403); ``claimed``: the
        ``user`` the body named, kept as ``claimed_user`` in the detail (never as who)."""
        extra = {"claimed_user": claimed} if claimed and (p is None or claimed != p.user) else {}
        daemon.audit_later(audit_row(time.time(), action, who_of(request, p), "denied",
                                     detail={"error": exc.detail, **extra}, **row))

    policy_gate = threading.Semaphore(1)  # one policy validation at a time (note 017)
    app = FastAPI(title="gpushepherd", version=__version__,
                  dependencies=[Depends(principal), Depends(body_keys_once)],  # a 401/403 before a body's 422
                  description="GPU workload scheduler: submit jobs, see the queue and why a job waits.",
                  responses=ERROR_RESPONSES)
    app.router.route_class = UniqueKeysRoute  # every route added below, services' and report's too
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(ResponseCount, metrics=daemon.metrics)  # outermost: a 413 is counted too (note 019)

    from sqlalchemy.exc import SQLAlchemyError

    @app.exception_handler(StorageUnavailable)
    @app.exception_handler(SQLAlchemyError)
    @app.exception_handler(TimeoutError)
    async def _unavailable(_request, exc: Exception) -> JSONResponse:
        """503 with the cause and ``Retry-After``; one log line per kind a minute."""
        kind = "timeout" if isinstance(exc, TimeoutError) else storage_reason(exc) or type(exc).__name__
        daemon.ratelog.warning(f"api:{kind}", "API answered 503: %s", kind)
        return unavailable(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError) -> JSONResponse:
        """422 naming the field; an input of NaN or Infinity is echoed as text (JSON has
        no such numbers), a string with a lone surrogate (JSON's ``"\ud800"``, no
        character, so no UTF-8) with it escaped, and pydantic's "Value error, " prefix is
        dropped."""
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return repr(v)
            if isinstance(v, str):
                return v.encode("utf-8", "backslashreplace").decode("utf-8")
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            return v
        errors = []
        for err in exc.errors():
            err = {k: clean(v) for k, v in err.items() if k != "ctx"}
            if isinstance(err.get("msg"), str) and err["msg"].startswith("Value error, "):
                err["msg"] = err["msg"][len("Value error, "):]
            named = re.match(r"(\w+(?:\.\w+)+): ", str(err.get("msg")))
            loc = list(err.get("loc") or ())
            if named and loc and loc[-1] == named.group(1).split(".")[0]:  # "share.slots: ..." found at share
                err["loc"] = loc[:-1] + named.group(1).split(".")
            errors.append(err)
        return JSONResponse(status_code=422, content={"detail": jsonable_encoder(errors)})

    def sees_all(p: Principal | None, user: str | None, team: str | None) -> bool:
        """Whether ``p`` sees a job's private fields (``PRIVATE_FIELDS``: name, command,
        cwd, env, paths): no principal (tokens off on a server not run as root), an admin,
        the job's user or a member of its team (note 023); never ``auth.ANONYMOUS``."""
        if p is not None and p.anonymous:
            return False
        return p is None or p.admin or user == p.user or p.may_act_for(team or "")

    class SeenFilter:
        """``JobFilter`` as ``p`` sees the jobs: a name ``p`` may not see never matches."""

        def __init__(self, inner: JobFilter, p: Principal | None):
            self.inner, self.p = inner, p

        def __call__(self, view: dict) -> bool:
            return self.match(view["state"], view.get)

        def match(self, state: str, field) -> bool:
            if sees_all(self.p, field("user"), field("team")):
                return self.inner.match(state, field)
            return self.inner.match(state, lambda f: None if f in PRIVATE_FIELDS else field(f))

    def seen_by(v: dict, p: Principal | None) -> dict:
        """``v`` (a job's or array's view) as ``p`` may see it (note 023, "What another
        team sees"): whole for an admin, the job's user, a member of its team and on a
        server without tokens; else with ``PRIVATE_FIELDS`` set to ``None`` and listed
        in ``hidden`` - state, team, class, GPUs, reason and estimate stay."""
        if sees_all(p, v.get("user"), v.get("team")):
            return v
        hidden = [k for k in PRIVATE_FIELDS if k in v]
        return {**v, **dict.fromkeys(hidden), "hidden": hidden}

    def view(job_id: str, history: bool = False) -> dict:
        with daemon.lock:
            v = daemon.job_view(job_id, history=history)
        if v is None:
            raise HTTPException(404, f"job {job_id!r}: no such job")
        return v

    @app.post("/jobs", status_code=201, responses={200: {"description": "An Idempotency-Key seen before with this "
                                                         "body: the job it made (header Idempotent-Replayed)"}})
    async def submit(body: SubmitBody, request: Request, p: Principal | None = Depends(principal),
                     idempotency_key: str | None = Header(None, alias="Idempotency-Key", description=(
                         "Makes a retried submission safe (IETF draft-ietf-httpapi-idempotency-key-header): the "
                         "same key and body again within 24 h answer the job the first made (200, "
                         "Idempotent-Replayed: true); another body is 422. Per token (per user without tokens); "
                         f"1-{MAX_IDEMPOTENCY_KEY} printable ASCII characters."))) -> dict:
        """Submit a job; returns its view once it is in the event log, with
        ``never_fits``: why it (an array: each task) can never start under the policy and
        cluster as they are (``ExceedsCapacity(...)``; kept pending, as Slurm and Kueue keep
        such a job), whatever its begin time or dependency; ``null``: it can. With
        auth, ``user`` is the token's (another needs an admin token) and ``team`` one
        of the token's teams. On the event loop: the loop thread completes the
        submission's future (note 008, "Submission throughput")."""
        unconfirmed = request.scope.get(OPEN_CHECK_KEY, False)  # confirmed by the loop, or before another answer
        try:
            check_submitter(p, body, per_user)
        except HTTPException as exc:
            if unconfirmed:
                confirm_open(request)
            deny(request, p, "submit", exc, claimed=body.user, team=body.team)
            raise
        who = who_of(request, p)
        idem = None
        if idempotency_key is not None:
            if not _IDEM_KEY.fullmatch(idempotency_key):
                if unconfirmed:
                    confirm_open(request)
                return JSONResponse(status_code=422, content={"detail": [
                    {"loc": ["header", "Idempotency-Key"], "type": "value_error",
                     "msg": f"{idempotency_key[:80]!r} is not allowed: 1-{MAX_IDEMPOTENCY_KEY} printable ASCII "
                            "characters"}]})
            scope = (f"uid:{p.uid}" if p.via_socket else f"token:{p.token_id}") if p is not None \
                else f"user:{body.user}"
            digest = hashlib.sha256(json.dumps(body.model_dump(by_alias=True), sort_keys=True,
                                               default=str).encode()).hexdigest()
            idem = (scope, idempotency_key, digest)
        try:
            array = (body.array, *parse_array(body.array), body.max_retries) if body.array is not None else None
            answer = asyncio.get_running_loop().create_future()  # settled by the loop thread (Command.aio)
            daemon.submit_future(body.spec(), body.command, shell=body.shell, env=body.env, cwd=body.cwd,
                                 array=array, idempotency=idem, defer=body.defer(), who=who, pty=body.pty,
                                 open_check=unconfirmed, aio=(asyncio.get_running_loop(), answer))
            # a timeout cancels ``answer`` only: the loop completes the submission all the same
            out = await asyncio.wait_for(answer, SUBMIT_TIMEOUT_S)
        except TokenRequired:  # a token was created before the submission arrived
            raise HTTPException(401, NO_TOKEN, headers={"WWW-Authenticate": "Bearer"}) from None
        except SpecError as exc:
            if unconfirmed:
                confirm_open(request)
            field = {"class": "class", "workload_class": "class"}.get(_spec_field(str(exc)), _spec_field(str(exc)))
            return JSONResponse(status_code=422, content={"detail": [
                {"loc": _spec_loc(field), "msg": re.sub(r"^job '[^']*': ", "", str(exc)), "type": "policy"}]})
        except IdempotencyConflict as exc:
            return JSONResponse(status_code=422, content={"detail": [
                {"loc": ["header", "Idempotency-Key"], "msg": str(exc), "type": "idempotency", "job": exc.job_id}]})
        if isinstance(out, tuple):  # ("replayed", view)
            return JSONResponse(status_code=200, content=jsonable_encoder(with_never_fits(out[1], body)),
                                headers={"Idempotent-Replayed": "true"})
        return with_never_fits(out, body)

    def with_never_fits(v: dict, body: SubmitBody) -> dict:
        """A submission's answer ``v`` with ``never_fits``: why the job (an array: each of
        its tasks) can never start under the policy and cluster as they are, else
        ``None`` - a queued job's ``ExceedsCapacity`` reason, ``never_fits`` of the spec
        of one the core has not seen (kept by a begin time, dependency or hold; an array)."""
        reason = str(v.get("reason") or "")
        if v.get("state") != "PENDING":
            why = None
        elif reason.startswith(ReasonCode.EXCEEDS_CAPACITY.value):
            why = reason
        elif body.array is not None or body.defer() is not None:
            why = never_fits(daemon.rules, body.spec(), daemon.clock())
        else:
            why = None
        return {**v, "never_fits": why}

    index = JobIndex(daemon.store)  # the pages' (number, id) index (note 029)

    @app.get("/jobs")
    def jobs(state: str | None = Query(None, max_length=4096, description="only jobs in these states, a comma "
                                       "list of ours (PENDING, RUNNING, ...) or Slurm's (PD, R, CG, CD, F, CA, "
                                       "TO), any case; 'all': every state"),
             user: str | None = Query(None, max_length=65536, description="only these users' jobs (a comma list)"),
             team: str | None = Query(None, max_length=65536, description="only these teams' jobs (a comma list)"),
             name: str | None = Query(None, max_length=65536, description="only jobs of these names (a comma list)"),
             children: bool = Query(False, description="also each array's child jobs"),
             limit: str | None = Query(None, max_length=64, description=(
                 f"a page of at most this many jobs (1-{MAX_PAGE_LIMIT}); the answer is then an object "
                 "{jobs, next, limit}")),
             cursor: str | None = Query(None, max_length=256, description=(
                 f"the page after this one: the 'next' of an earlier page (pages of {PAGE_LIMIT} unless 'limit')")),
             p: Principal | None = Depends(principal)):
        """Jobs in submission order (by job number): state, reason, estimated start,
        priority. An array is one entry (``done``/``tasks``) unless ``children``. Filters
        (design note 020) must all match; a bad value is 422 naming the parameter.

        Pages (note 029): with ``limit`` or ``cursor`` the answer is ``{"jobs": [...],
        "next": CURSOR | null, "limit": N}``; ask again with ``cursor=next`` until
        ``next`` is null. Every job is on one page only; one submitted meanwhile comes on
        a later page. A page may hold fewer than ``limit`` jobs (even none) and still have
        a ``next``: each page looks at a bounded number of jobs. Without either, the whole
        list (as before). Jobs of teams the caller is no member of come without their
        ``PRIVATE_FIELDS`` (note 023), and a ``name`` filter does not match their names."""
        try:
            keep = SeenFilter(JobFilter(state=state, user=user, team=team, name=name), p)
            size = parse_limit(limit) if limit is not None else PAGE_LIMIT
            after = decode_cursor(cursor) if cursor is not None else 0
        except QueryError as exc:
            return JSONResponse(status_code=422, content={"detail": [
                {"loc": ["query", exc.field], "msg": str(exc), "type": "value_error"}]})
        if limit is None and cursor is None:
            with daemon.lock:
                out = daemon.jobs_view(children=children)
            return [seen_by(j, p) for j in out if keep(j)]
        with daemon.lock:
            views, nxt = page(daemon, index, keep, size, after, children=children)
        views = [seen_by(j, p) for j in views]
        out = {"jobs": views, "next": encode_cursor(nxt) if nxt is not None else None, "limit": size}
        try:  # the views are JSON data already: FastAPI's jsonable_encoder took 70 % of a page's time
            text = json.dumps(out, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError):
            text = json.dumps(jsonable_encoder(out), allow_nan=False, default=str)
        return Response(text, media_type="application/json")

    @app.get("/whoami")
    def whoami(p: Principal | None = Depends(principal)) -> dict:
        """Who this request's token is: ``user``, ``teams``, ``admin``; ``auth`` false
        (and ``user`` null) on a server without tokens, where anyone may act as any
        user (``shepherd queue --me`` then means ``$USER``). On the Unix socket: the
        kernel's user, ``via`` ``"socket"``, its ``uid``, and as ``teams`` those whose
        policy members list it (note 025)."""
        if p is None or p.anonymous:  # anonymous: tokenless HTTP to a root server acts for no one (note 084)
            return {"auth": False, "user": None, "teams": [], "admin": False}
        if p.via_socket:  # the kernel's user (note 025): its teams are those whose members list it
            teams = [t for t, entries in p.membership.teams.items() if p.admin or is_member(p.user, entries)]
            return {"auth": True, "user": p.user, "teams": teams, "admin": p.admin, "via": "tcp" if p.tcp else "socket",
                    "uid": p.uid}
        return {"auth": True, "user": p.user, "teams": list(p.teams), "admin": p.admin}

    @app.get("/jobs/{job_id}")
    def job(job_id: str, p: Principal | None = Depends(principal)) -> dict:
        """One job: its transitions (history) and why it waits now. A job of a team the
        caller is no member of comes without its ``PRIVATE_FIELDS`` (``hidden`` lists
        them; note 023)."""
        return seen_by(view(job_id, history=True), p)

    @app.post("/jobs/{job_id}/cancel")
    def cancel(job_id: str, request: Request, p: Principal | None = Depends(principal)) -> dict:
        """Cancel a job (pending or running); its GPUs are handed on once none of its
        processes is left. With auth: a job of the token's teams only."""
        may_act_on(p, job_id, "cancel", request, "cancel")
        try:
            state = daemon.cancel(job_id, who=who_of(request, p))
        except KeyError:
            raise HTTPException(404, f"job {job_id!r}: no such job") from None
        return {"id": job_id, "state": state}

    def owner_only(action: str, job_id: str, p: Principal | None, request: HTTPConnection | None,
                   verb: str) -> None:
        """The job's user or an admin only (notes 021, 041): a refusal is 403, audited as
        ``action``; an unknown job 404. ``verb``: what is refused, for the message."""
        with daemon.lock:
            user, team = daemon.job_user(job_id), daemon.job_team(job_id)
        if user is None:
            raise HTTPException(404, f"job {job_id!r}: no such job")
        if p is not None and not p.admin and (p.anonymous or p.user != user):
            caller = (p.refusal("") if p.anonymous else f"this connection's owner is user {p.user!r}" if p.tcp else
                      f"this {'socket caller' if p.via_socket else 'token'} is user {p.user!r}")
            denied = HTTPException(403, f"job {job_id!r} is user {user!r}'s: only its user or an admin may {verb} "
                                        f"({caller})")
            deny(request, p, action, denied, team=team, target=job_id)
            raise denied

    def act(kind: str, job_id: str, p: Principal | None, changes: dict | None = None,
            request: Request | None = None) -> dict:
        """A hold, release, update or requeue (note 021): the job's user or an admin only."""
        owner_only(kind, job_id, p, request, f"{kind} it")
        try:
            return daemon.job_action(kind, job_id, changes, who=who_of(request, p), admin=p is None or p.admin)
        except KeyError:
            raise HTTPException(404, f"job {job_id!r}: no such job") from None
        except JobActionRefused as exc:
            raise HTTPException(409, str(exc)) from None
        except SpecError as exc:
            field = _spec_field(str(exc))
            return JSONResponse(status_code=422, content={"detail": [
                {"loc": _spec_loc(field), "msg": re.sub(r"^job '[^']*': ", "", str(exc)), "type": "policy"}]})

    @app.post("/jobs/{job_id}/hold", responses={409: {"description": "Not a pending job the server keeps"}})
    def hold(job_id: str, request: Request, p: Principal | None = Depends(principal)) -> dict:
        """Hold a pending job (``scontrol hold``): not scheduled until released; its reason is
        ``JobHeldUser``. Only a job the server keeps from the scheduler (waiting for a
        dependency or begin time, or submitted with ``hold``): one queued in the scheduler
        already is 409 (note 021). Returns the job's view."""
        return act("hold", job_id, p, request=request)

    @app.post("/jobs/{job_id}/release", responses={409: {"description": "Not a held job"}})
    def release(job_id: str, request: Request, p: Principal | None = Depends(principal)) -> dict:
        """Release a held job (``scontrol release``); a kept job that is not held is
        unchanged. Returns the job's view."""
        return act("release", job_id, p, request=request)

    @app.post("/jobs/{job_id}/requeue", responses={409: {"description": "Not a running job"}})
    def requeue(job_id: str, request: Request, p: Principal | None = Depends(principal)) -> dict:
        """Requeue a running job (``scontrol requeue``): it is stopped (its class's stop
        signal and grace period) and queued again, keeping its id and submit time.
        Returns the job's view."""
        return act("requeue", job_id, p, request=request)

    @app.patch("/jobs/{job_id}", responses={409: {"description": "A job that ended, or name/begin of a queued job"}})
    def update(job_id: str, body: UpdateBody, request: Request, p: Principal | None = Depends(principal)) -> dict:
        """Change a job (``scontrol update``): ``time_limit_s`` and ``nice`` of a pending or
        running job (note 039: its user may lower the limit and raise the nice, an admin
        token - or any caller without auth - also the reverse, the limit up to its class's
        max runtime; a running job's limit below what it has run stops it at once, with
        its grace); ``name`` and ``begin`` only of a job the server keeps from the
        scheduler (held, waiting for a dependency or begin time, note 021), else 409. A
        job that ended is 409; a rule broken is 422 naming the field; any other field is
        422. Logged (event log, audit log, the job's history) and replayed after a
        restart. Returns the job's view."""
        return act("update", job_id, p, body.model_dump(exclude_unset=True), request=request)

    @app.get("/jobs/{job_id}/logs", response_class=PlainTextResponse)
    def logs(job_id: str, stream: Literal["stdout", "stderr"] = "stdout", run: int | None = Query(None, ge=1, le=2**31),
             offset: int = Query(0, ge=0, le=2**62, description="byte to start at"),
             limit: int = Query(LOG_CHUNK_BYTES, ge=1, le=MAX_LOG_CHUNK_BYTES, description="most bytes to return"),
             p: Principal | None = Depends(principal)) -> PlainTextResponse:
        """A run's output (default: the last run): at most ``limit`` bytes from byte
        ``offset`` (note 017: never the whole file at once). The headers
        ``X-Next-Offset`` (where to continue: ``logs -f``, or the next chunk) and
        ``X-Log-Size`` (the file's size now). An offset past the end is an empty
        answer. With auth: a job of the token's teams only."""
        may_act_on(p, job_id, "read the logs of")
        v = view(job_id)
        run = run or v["runs"]
        if not run:
            return PlainTextResponse("", headers={"X-Next-Offset": "0", "X-Log-Size": "0"})
        path = daemon.backend.run_dir(job_id, run) / stream
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return PlainTextResponse("", headers={"X-Next-Offset": str(offset), "X-Log-Size": "0"})
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, min(limit, size - offset), offset) if offset < size else b""
        finally:
            os.close(fd)
        return PlainTextResponse(data.decode(errors="replace"),
                                 headers={"X-Next-Offset": str(offset + len(data)), "X-Log-Size": str(size)})

    @app.post("/policy")
    def apply_policy(body: PolicyBody, request: Request, dry_run: bool = Query(False, description="only check: "
                                                                               "could it be applied now?"),
                     p: Principal | None = Depends(principal)):
        """Apply a policy on the running server, atomically, as the next version
        (admin token once tokens exist; 403 otherwise). Refused with 422 and nothing
        applied: an invalid policy (naming field, value and what is allowed), or one that
        removes a node, class, team or pool a live job holds or waits in, or shrinks a
        node below the GPUs in use (naming each job and field). Identical to the policy
        in force: ``applied`` false. ``dry_run``: any valid token; changes nothing."""
        if p is not None and not p.admin and not dry_run:
            why = p.refusal("") if p.anonymous else f"user {p.user!r} is not an admin"
            denied = HTTPException(403, f"applying a policy needs an admin token (or, on the Unix socket, root or "
                                        f"the server's own user): {why}")
            deny(request, p, "policy-apply", denied, claimed=body.user, target=None)
            raise denied
        who = who_of(request, p)  # never the body's user (note 084): it says who applies, not who may
        by = who["user"]
        try:
            # validated here, in this request's thread, outside the daemon's lock and one at
            # a time (note 017): the loop only checks it against the live jobs
            with policy_gate:
                pol = policy_from_dict(json.loads(json.dumps(body.policy, default=str)), body.source or "<policy>")
            if dry_run:
                with daemon.lock:
                    _pol, _raw, new = daemon.check_policy(body.policy, body.source, pol)
                    cur = daemon.policy_view(with_policy=False)
                    never = daemon.never_start_text(new) if new is not None else ""
                return {**cur, "dry_run": True, "would_apply": new is not None,
                        "message": f"version {cur['version']} is in force; " + (
                            f"this policy could be applied now as version {cur['version'] + 1}{never}"
                            if new is not None else "this policy is identical to it: nothing to apply")}
            return daemon.apply_policy(body.policy, body.source, by, pol=pol, who=who)
        except (PolicyError, PolicyConflict) as exc:
            if not dry_run and isinstance(exc, PolicyError):  # the loop audits what it refuses itself
                daemon.audit_later(audit_row(time.time(), "policy-apply", who, "refused",
                                             detail={"source": body.source, "error": str(exc)[:2000]}))
            return _policy_refused(exc)

    @app.get("/policy")
    def policy() -> dict:
        """The policy in force: version (1, 2, ...), when it was applied (epoch seconds),
        by whom, from which file, and the policy (parsed YAML)."""
        with daemon.lock:
            return daemon.policy_view()

    @app.get("/policy/history")
    def policy_history() -> list:
        """Every version, oldest first: version, t, by, source."""
        with daemon.lock:
            return [{k: v for k, v in x.items() if k != "policy"} for x in daemon.policies]

    def audit_teams(p: Principal) -> list[str] | None:
        """The teams whose audit entries non-admin ``p`` reads: a token's teams; on the
        socket the policy's teams it may act for (``None``: every team - a policy of no
        teams on a server without tokens)."""
        if p.anonymous:
            return []
        if not p.via_socket:
            return list(p.teams)
        known = daemon.rules.teams
        if not known:
            return None if p.open_teams else []
        return [t for t in sorted(known) if p.may_act_for(t)]

    @app.get("/audit")
    def audit(since: float | None = Query(None, ge=0, le=MAX_EPOCH, allow_inf_nan=False,
                                          description="only entries at or after this time, epoch seconds"),
              user: str | None = Query(None, max_length=65536, description="only entries of these users (who "
                                       "acted), a comma list"),
              action: str | None = Query(None, max_length=4096, description="only these actions, a comma list: "
                                         "submit, cancel, hold, release, update, requeue, policy-apply, "
                                         "token-create, token-rotate, token-revoke, token-use, token-refused, "
                                         "service-create, service-delete, attach (a refused terminal attach)"),
              limit: int = Query(AUDIT_LIMIT, ge=1, le=MAX_AUDIT_LIMIT, description="the newest this many"),
              p: Principal | None = Depends(principal)) -> list:
        """The audit log (note 023), oldest first: who (``user``: the token's or the socket
        caller's; without tokens the server's own user on a server not run as root, ``''``
        for a tokenless request to a root one, note 084; ``token_id``; ``uid``: the Unix uid the kernel vouches
        for, for local commands and traced loopback TCP callers (note 087); ``address``: the
        client's HOST:PORT, or ``local (COMMAND)``),
        ``action``, ``team``, ``target`` (job id, token id, policy version), ``outcome`` (ok,
        denied: 403, refused: 422/409, failed: storage) and ``detail`` (what). An admin token
        sees every entry; another token only the entries about jobs of its teams (submits,
        cancels and job actions of its teams, its teams' 403s) - never policy or token
        entries; a Unix-socket caller who is no admin those of the teams it may act for
        (its members lists); without tokens, everything on a server not run as root and
        nothing (403) for a tokenless request to a root one.

        Raises:
            HTTPException: 403 for a caller of no team (the audit log is for admins and
                team members, note 023), naming the user and who may read it.
        """
        def items(v: str | None) -> list[str] | None:
            return None if v is None else [x.strip() for x in v.split(",") if x.strip()]
        teams = None if p is None or p.admin else audit_teams(p)
        if teams == []:
            why = p.refusal("") if p.anonymous else "this user may act for no team"
            raise HTTPException(403, f"the audit log is not allowed for user {p.user or '-'!r}: it is read by admins "
                                "(root or the server's user on the socket, an admin token) and by a team's members "
                                f"for their team's jobs (design note 023), and {why}")
        return daemon.store.audit_entries(since=since, users=items(user), teams=teams, actions=items(action),
                                          limit=limit)

    @app.get("/nodes")
    def nodes() -> list:
        """Nodes of the policy with each GPU's jobs and the free count."""
        with daemon.lock:
            return daemon.nodes_view()

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> Response:
        """Prometheus metrics in the text exposition format (design note 011): queue
        length, GPUs allocated / allocated-but-idle / stranded, quotas and fair-share per
        team, job counters and histograms, per-GPU samples (DCGM-exporter names too).
        With auth: any valid token, like every read, or a metrics scrape token
        (``token create --scope metrics``: valid here only; note 025)."""
        return Response(daemon.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/healthz")
    async def healthz() -> dict:
        """Liveness (a Kubernetes ``livenessProbe``): 200 while the process answers HTTP;
        reads nothing, needs no token (note 019)."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "Not ready: the body's checks say which failed and why"}})
    async def readyz() -> JSONResponse:
        """Readiness (a ``readinessProbe``; note 019): 200 when the reconcile loop
        completed a step within ``--ready-max-step-age`` seconds (30) and the database
        answers a read, else 503; the body is ``{"status": "ready" | "not ready",
        "checks": {"loop": {"ok", "detail", "last_step_age_s", "step_running_s",
        "max_step_age_s", "last_error"}, "store": {"ok", "detail"}}}``. Needs no token and
        never takes the daemon's lock (a stalled loop holds it); the read runs in a thread
        of its own, at most 5 s."""
        loop = daemon.loop_check()
        fut = asyncio.get_running_loop().run_in_executor(None, daemon.store_check)
        try:
            store = await asyncio.wait_for(asyncio.shield(fut), READY_STORE_TIMEOUT_S)
        except TimeoutError:
            store = {"ok": False, "detail": f"the database did not answer within {READY_STORE_TIMEOUT_S:g} s"}
        ready = loop["ok"] and store["ok"]
        return JSONResponse(status_code=200 if ready else 503,
                            content={"status": "ready" if ready else "not ready", "checks": {"loop": loop, "store": store}})

    @app.get("/usage")
    def usage() -> dict:
        """Per team: GPUs in use, decayed usage (GPU-seconds), fair-share factor; and
        ``idle_threshold_pct``, the utilisation % under which a held GPU counts as idle."""
        with daemon.lock:
            return daemon.usage_view()

    @app.websocket("/jobs/{job_id}/attach")
    async def attach(websocket: WebSocket, job_id: str,
                     offset: int = Query(0, ge=0, le=2**62, description="bytes of output already seen"),
                     p: Principal | None = Depends(principal)) -> None:
        """Attach to a running pty job's terminal (note 041), a WebSocket: binary messages
        from the server are the terminal's output (first what was missed since byte
        ``offset``, as far as the server keeps it), binary messages to it are keystrokes
        (Ctrl-C is the byte 0x03: the terminal signals the job's foreground processes),
        a text message ``{"resize": [ROWS, COLS]}`` sets the window size. The server
        closes it (1000) when the terminal ends (the job's processes have exited). The
        job's user or an admin only (403), on a token or the Unix socket; 409 for a job
        without a terminal (not pty, not running, ended). No client for a few seconds
        while it runs: the job is cancelled."""
        owner_only("attach", job_id, p, websocket, "attach to its terminal")
        term = getattr(daemon.backend, "terminals", {}).get(job_id)
        out: asyncio.Queue = asyncio.Queue()
        got = term.subscribe(async_deliver(asyncio.get_running_loop(), out), offset) if term is not None else None
        if got is None:
            v = view(job_id)
            why = ("it was not submitted with pty (shepherd run --pty)" if not v.get("pty") else
                   f"it is {v['state']}: a terminal exists while its run runs" if v["state"] != "RUNNING" else
                   "its run's terminal has ended (or was lost when the server restarted)")
            raise HTTPException(409, f"job {job_id!r} has no terminal to attach to: {why}")
        sub, missed = got
        try:
            await websocket.accept()
            if missed:
                await websocket.send_bytes(missed)

            async def output() -> None:
                while (data := await out.get()) is not None:
                    await websocket.send_bytes(data)
                await websocket.close(1000, "the job's terminal ended")

            async def keys() -> None:
                while True:
                    msg = await websocket.receive()
                    if msg["type"] == "websocket.disconnect":
                        return
                    if msg.get("bytes"):
                        await asyncio.get_running_loop().run_in_executor(None, term.write, msg["bytes"])
                    elif msg.get("text"):
                        try:
                            rows, cols = json.loads(msg["text"])["resize"]
                            term.resize(int(rows), int(cols))
                        except (ValueError, TypeError, KeyError) as exc:
                            await websocket.close(1003, f"not a resize message: {exc}"[:120])
                            return

            tasks = [asyncio.ensure_future(output()), asyncio.ensure_future(keys())]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            term.unsubscribe(sub)

    from gpushepherd.daemon.services_api import mount_services  # it builds on SubmitBody

    mount_services(app, daemon, principal)  # inference services (note 014)
    mount_report(app, daemon, principal)  # the report and what-if, scoped by the caller's teams (note 029)
    mount_ui(app, daemon.store.batches)  # the dashboard (note 012): after the API's routes
    return app
