"""On a server not run as root and without tokens every caller is the server's own Unix
user (``api.who_of``: the audit rows name it). A job submitted over TCP without a
``user`` was still stored with user ``''``: fair-share and per-user limits counted it under
nobody while the audit log named the server's user (a newcomer's find). Now such a job is
the server's user's; a named user is kept (an open server trusts its callers, as before)."""

from __future__ import annotations

import os
import pwd

from gpushepherd.daemon.api import SubmitBody, check_submitter

ME = pwd.getpwuid(os.geteuid()).pw_name


def _body(**kw) -> SubmitBody:
    return SubmitBody.model_validate({"class": "batch", "team": "ml", "command": ["true"], "cwd": "/", **kw})


def test_a_job_that_names_no_user_is_the_servers_users():
    body = _body()
    assert body.user in ("", None)
    check_submitter(None, body)
    assert body.user == ME


def test_a_named_user_is_kept_on_an_open_server():
    body = _body(user="ana")
    check_submitter(None, body)
    assert body.user == "ana"
