"""One duration grammar (issue 18 point 1, design note 018): Slurm's ``--time`` forms and
unit suffixes in ``gpushepherd.durations``, each CLI option that takes a duration (what a
bare number means there, said in ``--help``), and the API's string durations."""

from __future__ import annotations

import math

import pytest
import test_regressions_api as regressions
from typer.testing import CliRunner

from gpushepherd.cli.main import app
from gpushepherd.durations import MAX_SECONDS, allowed_forms, api_seconds, parse_duration

api, cli = regressions.api, regressions.cli  # fixtures: an in-process server, the CLI against it
body, msgs = regressions.body, regressions.msgs


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("0.5", 30), ("1:30", 90), ("90:00", 5400), ("2:00:00", 7200), ("26:00:00", 93600),
    ("1-2", 93600), ("1-02", 93600), ("1-02:30", 95400), ("1-02:30:15", 95415), ("0-0:0:1", 1),
    ("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("2w", 1209600), ("1.5h", 5400), (" 7d ", 604800),
    ("90 m", 5400),
])
def test_every_form_in_seconds_with_a_bare_number_in_minutes_as_slurm(text, seconds):
    assert parse_duration(text) == seconds


def test_a_bare_number_is_what_the_caller_says():
    assert parse_duration("600", bare="seconds") == 600
    assert parse_duration("600", bare="minutes") == 36000
    with pytest.raises(ValueError, match=r"^'600' is not allowed: give its unit \(600s, 600m, 600h\)"):
        parse_duration("600", bare=None)
    assert parse_duration("10:00", bare=None) == 600  # colon forms mean the same everywhere
    # a bare 0 where a unit is needed is refused for being 0, not pointed at 0s (refused too)
    with pytest.raises(ValueError, match=r"^'0' is not allowed: a duration > 0 \(MM:SS"):
        parse_duration("0", bare=None)


@pytest.mark.parametrize("text, message", [
    ("0", "'0' is not allowed: a duration > 0 (MINUTES, MM:SS"),
    ("0s", "'0s' is not allowed: a duration > 0"),
    ("1:99:99", "'1:99:99' is not allowed: minutes and seconds after the first field are < 60 (MM:SS, HH:MM:SS)"),
    ("5:60", "'5:60' is not allowed: minutes and seconds after the first field are < 60"),
    ("1-24", "'1-24' is not allowed: D-HH:MM:SS with hours < 24, minutes and seconds < 60"),
    ("1-00:60", "'1-00:60' is not allowed: D-HH:MM:SS with hours < 24"),
    ("ten", ("'ten' is not allowed: MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (Slurm's --time) or a "
             "number with a unit: 30s, 10m, 2h, 1d, 2w")),
    ("-5s", "'-5s' is not allowed: MINUTES, MM:SS"),
    ("1h30m", "'1h30m' is not allowed: MINUTES"),
    ("", "'' is not allowed: MINUTES"),
    ("1:2:3:4", "'1:2:3:4' is not allowed: MINUTES"),
    ("10M", "'10M' is not allowed: MINUTES"),  # M is not minutes (nor months): lower-case units only
    ("UNLIMITED", "'UNLIMITED' is not allowed here: a finite duration (MINUTES"),
    ("99999999999999999999999", "'99999999999999999999999' is not allowed: at most 10 years"),
    ("5256001", "'5256001' is not allowed: at most 10 years"),  # minutes: just over 10 years
    ("9" * 50, "... is not allowed: at most 10 years"),
])
def test_every_error_names_the_value_and_what_is_allowed(text, message):
    with pytest.raises(ValueError) as exc:
        parse_duration(text)
    assert message in str(exc.value)


def test_unlimited_zero_and_the_maximum_where_the_caller_allows_them():
    assert parse_duration("UNLIMITED", unlimited=True) == math.inf
    assert parse_duration("infinite", unlimited=True) == math.inf
    assert parse_duration("0", zero=True) == 0
    assert parse_duration("10 m", maximum=600) == 600
    with pytest.raises(ValueError, match=r"'11m' is not allowed: at most 10 min"):
        parse_duration("11m", maximum=600)
    assert parse_duration("5256000") == MAX_SECONDS  # 10 years of minutes: the longest
    assert allowed_forms("seconds").startswith("SECONDS, MM:SS")


def test_the_api_reads_a_number_or_a_digit_string_as_seconds_and_any_other_string_by_the_grammar():
    assert api_seconds(3600) == 3600 and api_seconds("3600") == 3600 and api_seconds(None) is None
    assert api_seconds("2h") == 7200 and api_seconds("1-00:00") == 86400
    with pytest.raises(ValueError, match="'2 hours' is not allowed"):
        api_seconds("2 hours")


# -- the CLI ---------------------------------------------------------------------------
def _limit(api, out: str) -> float:
    job_id = out.split()[-1]
    return api.daemon.sched.jobs[job_id].spec.time_limit_s


@pytest.mark.parametrize("given, seconds", [("30", 1800), ("1:30", 90), ("2:00:00", 7200), ("1-0", 86400),
                                            ("45s", 45), ("2h", 7200)])
def test_submit_time_is_slurms_minutes_end_to_end(cli, api, tmp_path, given, seconds):
    code, out, err = cli("submit", "-c", "batch", "-A", "research", "-t", given, "-D", str(tmp_path), "--", "true")
    assert code == 0, err
    assert _limit(api, out) == seconds


@pytest.mark.parametrize("given, needle", [
    ("1:99:99", "'1:99:99' is not allowed: minutes and seconds after the first field are < 60"),
    ("0", "'0' is not allowed: a duration > 0"),
    ("UNLIMITED", "leave --time out for the class's default limit"),
    ("2 hours", "'2 hours' is not allowed: MINUTES, MM:SS"),
])
def test_submit_time_errors_name_the_option_and_submit_nothing(cli, api, tmp_path, given, needle):
    code, _, err = cli("submit", "-c", "batch", "-A", "research", "-t", given, "-D", str(tmp_path), "--", "true")
    assert code == 2 and "--time" in err and needle in " ".join(err.split())
    assert api.get("/jobs").json() == []


def _help(*cmd: str) -> str:
    return " ".join(CliRunner().invoke(app, [*cmd, "--help"], terminal_width=200).output.split())


def test_every_duration_option_says_its_unit_in_help():
    assert "MINUTES (a bare number is minutes)" in _help("submit")
    server = _help("server")
    for option in ("--sample-every", "--idle-after", "--requeue-backoff", "--db-busy-timeout", "--header-timeout"):
        assert f"{option} DURATION" in server, option
    assert server.count("seconds, or with a unit: 30s, 10m, 2h") == 5
    service = _help("service", "create")
    assert "--cooldown DURATION" in service and "--scrape-every DURATION" in service
    assert service.count("seconds, or with a unit") == 2
    assert "with its unit (7d, 36h, 90m, 2w)" in _help("whatif")
    assert "at least 1 s: seconds, or with a unit" in _help("simulate")


@pytest.mark.parametrize("args, needle", [
    (["--sample-every", "0.05"], "'0.05' is not allowed: at least 0.1 s"),
    (["--idle-after", "soon"], "'soon' is not allowed: SECONDS, MM:SS"),
    (["--requeue-backoff", "6m"], "'6m' is not allowed: at most 5 min"),
    (["--header-timeout", "0"], "'0' is not allowed: a duration > 0"),
])
def test_server_duration_options_are_refused_naming_the_option(tmp_path, args, needle):
    res = CliRunner().invoke(app, ["server", "--data-dir", str(tmp_path / "d"), *args])
    assert res.exit_code == 2 and args[0] in res.output and needle in " ".join(res.output.split())
    assert not (tmp_path / "d").exists()  # refused before anything is made


def test_simulate_stranded_every_takes_a_unit_and_refuses_less_than_a_second():
    res = CliRunner().invoke(app, ["simulate", "--stranded-every", "0.5"])
    assert res.exit_code == 2 and "'0.5' is not allowed: at least 1 s" in " ".join(res.output.split())


def test_the_api_takes_a_time_limit_as_a_string_with_its_unit(api, tmp_path):
    r = api.post("/jobs", json=body(tmp_path, time_limit_s="1-12:00:00"))
    assert r.status_code == 201, r.text
    assert api.daemon.sched.jobs[r.json()["id"]].spec.time_limit_s == 36 * 3600
    r = api.post("/jobs", json=body(tmp_path, time_limit_s=90))  # a number: seconds, as always
    assert api.daemon.sched.jobs[r.json()["id"]].spec.time_limit_s == 90
    r = api.post("/jobs", json=body(tmp_path, time_limit_s="soon"))
    assert r.status_code == 422 and "time_limit_s" in msgs(r) and "'soon' is not allowed" in msgs(r)
