"""The web dashboard at /ui (design note 012), against a real `shepherd server`.

The browser tests (marker ``browser``) drive Debian's headless Chromium through its
chromedriver with Selenium; they skip, saying what is missing, where either is absent.
Screenshots go to ``--screenshot-dir DIR`` or a temporary folder the test prints.
``docs/screenshots/ui.png`` is written by ``scripts/ui_screenshot.py`` only.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import pytest
from test_auth import create_token
from test_daemon import DEADLINE_S, POLICY, Server, wait_for, wait_for_file

from gpushepherd.daemon.ui import PLOTS, UI_DIR, PlotCache

UI_POLICY = POLICY.replace("  ml: {}", "  ml: {max_gpus: 2}\n  cv: {nominal_gpus: 2}")
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
PNG = b"\x89PNG\r\n\x1a\n"


def ui_server(tmp: Path) -> Server:
    s = Server(tmp)
    s.policy.write_text(UI_POLICY)
    return s


def busy(s: Server, flag: Path) -> dict[str, str]:
    """Two running ml jobs (one with markup in its command), one ml job pending on the
    team's max_gpus=2 and one running cv job: returns their ids by role."""
    ids = {"running": s.submit(wait_for_file(flag)),
           "xss": s.submit(wait_for_file(flag) + f"\n# {XSS}"),
           "pending": s.submit(wait_for_file(flag), name="eval"),
           "cv": s.submit(wait_for_file(flag), team="cv", user="bo")}
    for role in ("running", "xss", "cv"):
        s.wait_state(ids[role], "RUNNING")
    assert s.job(ids["pending"])["reason"].startswith("QuotaExceeded(teams.ml.max_gpus=2")
    return ids


# ------------------------------------------------------------------ without a browser
def test_page_fetches_nothing_from_elsewhere_and_builds_no_markup_from_strings():
    files = {p.name: p.read_text() for p in UI_DIR.iterdir()}
    assert set(files) == {"index.html", "app.js", "style.css"}
    for name, text in files.items():
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I), f"{name} names another host"
        assert "@import" not in text and "url(" not in text, name
    js = files["app.js"]
    sinks = re.findall(r"\.(?:innerHTML|outerHTML|insertAdjacentHTML|srcdoc)\b|document\.write|\beval\(|new Function"
                       r"|setAttribute\(\s*[\"']on", js)
    assert not sinks, f"app.js builds markup from strings: {sinks}"
    assert 'src="app.js"' in files["index.html"] and 'href="style.css"' in files["index.html"]


class CountingCache(PlotCache):
    def _build(self, now: float) -> dict[str, bytes]:
        return {name: f"{name}@{now}".encode() for name in PLOTS}


def test_plots_are_rebuilt_at_most_once_per_ttl():
    now = [1000.0]
    cache = CountingCache(lambda: [], ttl_s=60.0, clock=lambda: now[0])
    assert cache.png("queue") == b"queue@1000.0"
    now[0] = 1059.0
    assert [cache.png(n) for n in PLOTS] == [b"utilisation@1000.0", b"queue@1000.0", b"quota@1000.0"]
    assert cache.builds == 1
    now[0] = 1060.0
    assert cache.png("quota") == b"quota@1060.0" and cache.builds == 2
    now[0] = 900.0  # a clock stepped back: rebuilt, never served as "fresh" forever
    assert cache.png("quota") == b"quota@900.0" and cache.builds == 3
    with pytest.raises(KeyError):
        cache.png("nope")


def test_static_page_is_open_but_data_and_plots_need_the_token(tmp_path):
    s = ui_server(tmp_path)
    token = create_token(s.data, "--user", "ana", "--team", "ml")
    s.start()
    flag = tmp_path / "go"
    try:
        r = httpx.get(s.url + "/ui", timeout=60)
        assert r.status_code == 307 and r.headers["location"].endswith("/ui/")
        for path, kind in (("/ui/", "text/html"), ("/ui/app.js", "javascript"), ("/ui/style.css", "text/css")):
            r = httpx.get(s.url + path, timeout=60)
            assert r.status_code == 200 and kind in r.headers["content-type"], (path, r.status_code)
        for path in ("/jobs", "/nodes", "/usage", "/policy", "/ui/plots/queue.png"):
            assert httpx.get(s.url + path, timeout=60).status_code == 401, path
        s.token = token
        s.submit(wait_for_file(flag))
        for name in PLOTS:
            r = httpx.get(f"{s.url}/ui/plots/{name}.png", headers=s.headers, timeout=60)
            assert r.status_code == 200 and r.headers["content-type"] == "image/png", r.text
            assert r.content.startswith(PNG)
        r = httpx.get(s.url + "/ui/plots/nope.png", headers=s.headers, timeout=60)
        assert r.status_code == 404 and "'nope'" in r.json()["detail"] and "utilisation, queue, quota" in \
            r.json()["detail"]
    finally:
        flag.touch()
        s.stop()


# ------------------------------------------------------------------ in headless Chromium
def chromium_paths() -> tuple[str, str] | str:
    """(chromium, chromedriver), or why the browser tests cannot run here."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or next(
        (p for p in ("/usr/lib/chromium/chromedriver",) if Path(p).exists()), None)
    if browser is None or driver is None:
        return ("no " + " and no ".join(n for n, p in (("chromium", browser), ("chromedriver", driver)) if p is None)
                + " on PATH (Debian: apt-get install chromium chromium-driver)")
    return browser, driver


def open_browser(width: int = 1400, height: int = 1800):
    """A headless Chromium through the system's chromedriver (Selenium Manager is never
    asked to download one). Skips the test where there is none."""
    found = chromium_paths()
    if isinstance(found, str):
        pytest.skip(f"browser: {found}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=found[1]), options=opts)


@pytest.fixture
def browser():
    drv = open_browser()
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def shots(request, tmp_path_factory) -> Path:
    given = request.config.getoption("--screenshot-dir")
    folder = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_shot(drv, folder: Path, name: str, capsys) -> Path:
    path = folder / name
    assert drv.save_screenshot(str(path)), path
    assert path.read_bytes().startswith(PNG)
    with capsys.disabled():
        print(f"\nscreenshot: {path}")
    return path


def until(drv, what: str, js: str, *args):
    """Poll ``js`` (a script returning a value) in the page until it is truthy."""
    return wait_for(what, lambda: drv.execute_script(js, *args), timeout=DEADLINE_S, every=0.2)


def text_of(drv, css: str) -> str:
    return drv.execute_script("const n = document.querySelector(arguments[0]); return n ? n.textContent : null;", css)


def wait_until_plots_are_shown(drv) -> None:
    until(drv, "the report's plots", "return [...document.querySelectorAll('img[data-plot]')]"
          ".every(i => i.complete && i.naturalWidth > 0)")


@pytest.mark.browser
def test_ui_shows_the_pending_reason_the_gpu_holders_and_escapes_user_input(tmp_path, browser, shots, capsys):
    from selenium.webdriver.common.by import By

    s = ui_server(tmp_path).start()
    flag = tmp_path / "go"
    try:
        ids = busy(s, flag)
        browser.get(s.url + "/ui")
        reason_cell = f"#queue tr[data-job='{ids['pending']}'] td.reason"
        until(browser, "the pending job's reason on the page",
              "const n = document.querySelector(arguments[0]); return n && n.textContent", reason_cell)
        assert text_of(browser, reason_cell) == s.job(ids["pending"])["reason"]
        assert text_of(browser, reason_cell).startswith("QuotaExceeded(teams.ml.max_gpus=2")
        assert text_of(browser, f"#queue tr[data-job='{ids['pending']}'] .job-name") == "eval"  # note 020

        # the GPU grid shows who holds each GPU
        holders = browser.execute_script(
            "return [...document.querySelectorAll('#nodes .gpu')].map(g => "
            "[g.dataset.gpu, [...g.querySelectorAll('.holder')].map(h => h.dataset.job)])")
        held = {job for _gpu, jobs in holders for job in jobs}
        assert len(holders) == 4 and held == {ids["running"], ids["xss"], ids["cv"]}
        assert sum(1 for _gpu, jobs in holders if not jobs) == 1
        gpu_of = {p.split(":")[1]: j for j in (ids["running"], ids["xss"], ids["cv"])
                  for p in [s.job(j)["placement"]]}
        assert {g: jobs for g, jobs in holders if jobs} == {g: [j] for g, j in gpu_of.items()}
        assert "ml/ana batch" in text_of(browser, f"#nodes .holder[data-job='{ids['running']}']")

        # user input is text, never markup
        cmd = text_of(browser, f"#queue tr[data-job='{ids['xss']}'] td.command")
        assert XSS in cmd
        assert browser.execute_script("return document.querySelectorAll('#queue img, #queue script').length") == 0
        assert browser.execute_script("return window.__xss === undefined")

        # usage against quota: ml holds its max of 2, cv 1 of a nominal 2
        row = "return [...document.querySelectorAll(`#usage tr[data-team='${arguments[0]}'] td`)].map(t => t.textContent)"
        assert browser.execute_script(row, "ml")[:4] == ["ml", "2", "-", "2"]
        assert browser.execute_script(row, "cv")[:4] == ["cv", "1", "2", "-"]

        wait_until_plots_are_shown(browser)
        save_shot(browser, shots, "ui.png", capsys)

        # it refreshes itself: the pending job runs once the others end (ended jobs shown on request)
        flag.touch()
        browser.find_element(By.ID, "f-state").send_keys("all")
        browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
        until(browser, "the formerly pending job shown COMPLETED, without a reason",
              "const r = document.querySelector(arguments[0]); return r && r.dataset.state === 'COMPLETED' "
              "&& r.querySelector('td.reason').textContent === ''", f"#queue tr[data-job='{ids['pending']}']")
    finally:
        flag.touch()
        s.stop()


@pytest.mark.browser
def test_ui_with_tokens_asks_for_one_and_shows_nothing_without_it(tmp_path, browser, shots, capsys):
    from selenium.webdriver.common.by import By

    s = ui_server(tmp_path)
    token = create_token(s.data, "--user", "ana", "--team", "ml")
    s.token = token
    s.start()
    flag = tmp_path / "go"
    try:
        job = s.submit(wait_for_file(flag))
        browser.get(s.url + "/ui/")
        until(browser, "the token form", "return !document.getElementById('login').hidden")
        assert browser.execute_script("return document.querySelectorAll('#queue tr[data-job]').length") == 0
        assert browser.execute_script("return document.querySelectorAll('#nodes .gpu').length") == 0
        save_shot(browser, shots, "ui-token-needed.png", capsys)

        browser.find_element(By.ID, "token").send_keys("shp_wrong")
        browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
        until(browser, "the wrong token refused", "return document.getElementById('login-error').textContent")
        assert "unknown or revoked" in text_of(browser, "#login-error")

        browser.find_element(By.ID, "token").send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
        until(browser, "the job on the page once the token is given",
              "return document.querySelector(arguments[0])", f"#queue tr[data-job='{job}']")
        assert browser.execute_script("return document.getElementById('login').hidden")
        assert browser.execute_script("return sessionStorage.getItem('gpushepherd.token')") == token
        wait_until_plots_are_shown(browser)  # fetched with the bearer header, shown from blob URLs
        save_shot(browser, shots, "ui-with-token.png", capsys)
    finally:
        flag.touch()
        s.stop()



# ------------------------------------------------------------------ the three questions (note 029)
ZONE = "Asia/Kolkata"  # UTC+05:30: a zone no test machine runs in, and off by half an hour
COHORT_POLICY = f"""\
name: ui-cohort
clock: {{timezone: {ZONE}}}
cluster:
  nodes:
    - {{name: local, gpus: 4, gpu_type: FAKE, gpu_mem_mib: 16384}}
classes:
  batch: {{grace_period_s: 2}}
teams:
  ml: {{nominal_gpus: 1}}
  cv: {{nominal_gpus: 3}}
cohorts:
  research: {{members: [ml, cv]}}
"""


def spinning(flag: Path) -> str:
    """A job's code that keeps a CPU busy (the static inventory's utilisation) until ``flag``."""
    return f"import os\nwhile not os.path.exists({str(flag)!r}):\n    pass\n"


def in_zone(t: float) -> str:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    return datetime.fromtimestamp(t, ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M:%S")


def no_sideways_scroll(drv) -> tuple[int, int]:
    return drv.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")


@pytest.mark.browser
def test_ui_answers_the_three_questions_job_page_filters_idle_gpus_borrowing_one_zone(tmp_path, browser, shots,
                                                                                       capsys):
    from selenium.webdriver.common.by import By

    s = Server(tmp_path)
    s.policy.write_text(COHORT_POLICY)
    s.start()
    flag = tmp_path / "go"
    try:
        busy_job = s.submit(spinning(flag), time_limit_s=3600)  # time limits: the pending job gets an estimate
        idle_job = s.submit(wait_for_file(flag), time_limit_s=3600)
        talk = s.submit("import sys\nprint('hello-stdout', flush=True)\nprint('to-stderr', file=sys.stderr, "
                        "flush=True)\n" + wait_for_file(flag), team="cv", user="bo", time_limit_s=3600)
        for j in (busy_job, idle_job, talk):
            s.wait_state(j, "RUNNING")
        waiting = s.submit(wait_for_file(flag), gpus=2, name="big", time_limit_s=600)
        assert s.job(waiting)["state"] == "PENDING"

        browser.get(s.url + "/ui/")
        until(browser, "the zone in the header", "return document.getElementById('tz').textContent")
        assert text_of(browser, "#tz") == f"times in {ZONE}"

        # allocated-but-idle: the GPU of the job that sleeps, not the one that spins
        gpu_of = {j: s.job(j)["placement"].split(":")[1] for j in (busy_job, idle_job)}
        until(browser, "the sleeping job's GPU marked idle",
              "const g = document.querySelector(`#nodes .gpu[data-gpu='${arguments[0]}']`); "
              "return g && g.classList.contains('idle')", gpu_of[idle_job])
        idle_gpu = f"#nodes .gpu[data-gpu='{gpu_of[idle_job]}']"
        assert "allocated, idle" in text_of(browser, idle_gpu)
        assert browser.execute_script("return document.querySelector(arguments[0]).classList.contains('idle')",
                                      f"#nodes .gpu[data-gpu='{gpu_of[busy_job]}']") is False
        free = [g for g in browser.execute_script(
            "return [...document.querySelectorAll('#nodes .gpu')].map(g => [g.dataset.gpu, g.className])")
            if "busy" not in g[1]]
        assert len(free) == 1 and "idle" not in free[0][1]

        # cohort borrowing: ml holds 2 GPUs on a nominal 1 in cohort research; cv 1 of 3
        until(browser, "the usage rows", "return document.querySelector(\"#usage tr[data-team='ml']\")")
        row = "return [...document.querySelectorAll(`#usage tr[data-team='${arguments[0]}'] td`)].map(t => t.textContent)"
        ml, cv = browser.execute_script(row, "ml"), browser.execute_script(row, "cv")
        assert ml[0:4] == ["ml", "2", "1", "-"] and ml[5:7] == ["research", "borrowing 1 GPU from research"]
        assert cv[5:7] == ["research", "0"]

        # the pending job's estimated start is written in the policy's zone
        est = wait_for("the pending job's estimate", lambda: s.job(waiting)["estimated_start"])
        cell = f"#queue tr[data-job='{waiting}'] td.estimate"
        until(browser, "the pending job's estimate on the page", "const n = document.querySelector(arguments[0]); "
              "return n && n.textContent", cell)
        assert text_of(browser, cell).startswith("\u2264 " + in_zone(est))  # an upper bound: time limits
        save_shot(browser, shots, "ui-three-questions.png", capsys)

        # filters: team, then state (Slurm's word); kept in the URL
        browser.find_element(By.ID, "f-team").send_keys("cv")
        browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
        shown = "return [...document.querySelectorAll('#queue tbody tr[data-job]')].map(r => r.dataset.job)"
        until(browser, "only cv's job", f"return JSON.stringify(({shown.replace('return ', '')})) === "
              f"JSON.stringify([{talk!r}])")
        assert browser.execute_script("return location.hash") == "#team=cv"
        browser.find_element(By.ID, "f-clear").click()
        browser.find_element(By.ID, "f-state").send_keys("PD")
        browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
        until(browser, "only the pending job", f"return JSON.stringify(({shown.replace('return ', '')})) === "
              f"JSON.stringify([{waiting!r}])")
        browser.find_element(By.ID, "f-state").clear()
        browser.find_element(By.ID, "f-state").send_keys("nope")
        browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
        until(browser, "the refused filter named", "return document.getElementById('filter-error').textContent")
        assert "'nope' is not allowed" in text_of(browser, "#filter-error")
        browser.find_element(By.ID, "f-clear").click()

        # a page per job: history with reasons in the zone, output, utilisation
        until(browser, "cv's job in the queue", "return document.querySelector(arguments[0])",
              f"#queue tr[data-job='{talk}'] a.job-link")
        browser.find_element(By.CSS_SELECTOR, f"#queue tr[data-job='{talk}'] a.job-link").click()
        until(browser, "the job's output", "return document.getElementById('job-stdout').textContent"
              ".includes('hello-stdout')")
        assert browser.execute_script("return location.hash") == f"#job={talk}"
        assert text_of(browser, "#job-title") == f"job {talk}"
        # the page fetches stdout, then stderr: it may show the first before the second arrives
        # (CI on 15cf85c read '' here once)
        until(browser, "the job's stderr", "return document.getElementById('job-stderr').textContent"
              ".includes('to-stderr')")
        view = s.job(talk)
        rows = browser.execute_script("return [...document.querySelectorAll('#job-history tbody tr')]"
                                      ".map(r => [...r.children].map(c => c.textContent))")
        assert rows == [[in_zone(h["t"]), h["from"], h["to"], h["reason"] or ""] for h in view["history"]]
        assert text_of(browser, "dd[data-field='class / team / user']") == "batch / cv / bo"
        assert text_of(browser, "dd[data-field='submitted']").startswith(in_zone(view["submit_time"]))
        until(browser, "a utilisation sample on the job page",
              "return !document.querySelector(\"dd[data-field='GPU utilisation']\").textContent.startsWith('-')")
        browser.get(s.url + f"/ui/#job={waiting}")
        until(browser, "the pending job's page", "return document.getElementById('job-title').textContent === "
              "arguments[0]", f"job {waiting} (big)")
        until(browser, "its reason", "return document.querySelector(\"dd[data-field='reason']\").textContent "
              "!== '-'")
        assert text_of(browser, "dd[data-field='reason']") == s.job(waiting)["reason"]
        save_shot(browser, shots, "ui-job.png", capsys)

        # no sideways scroll at 1024 px, on the cluster page and on a job's page
        browser.set_window_size(1024, 900)
        for path in (f"/ui/#job={talk}", "/ui/"):
            browser.get(s.url + path)
            until(browser, "the page drawn", "return document.getElementById('status').textContent.startsWith("
                  "'policy')")
            width, client = no_sideways_scroll(browser)
            assert client <= 1024 and width <= client, (path, width, client)
        save_shot(browser, shots, "ui-1024.png", capsys)
    finally:
        flag.touch()
        s.stop()


@pytest.mark.browser
def test_ui_queue_pages_through_get_jobs_pages(tmp_path, browser):
    s = ui_server(tmp_path).start()
    flag = tmp_path / "go"
    try:
        ids = [s.submit(wait_for_file(flag))]
        s.wait_state(ids[0], "RUNNING")  # the others need all 4 GPUs: they pend
        ids += [s.submit(wait_for_file(flag), gpus=4, team="cv", user="bo") for _ in range(104)]
        browser.get(s.url + "/ui/")
        shown = "return [...document.querySelectorAll('#queue tbody tr[data-job]')].map(r => r.dataset.job)"
        until(browser, "the first page", shown + ".length === 100")
        assert browser.execute_script(shown) == ids[:100]
        assert text_of(browser, "#page-info") == "page 1"
        browser.find_element("id", "page-next").click()
        until(browser, "the second page", "return document.getElementById('page-info').textContent === "
              "'page 2 (the last)'")
        assert browser.execute_script(shown) == ids[100:]
        assert browser.execute_script("return document.getElementById('page-next').disabled")
        browser.find_element("id", "page-first").click()
        until(browser, "the first page again", "return document.getElementById('page-info').textContent === 'page 1'")
    finally:
        flag.touch()
        s.stop()


@pytest.mark.browser
def test_ui_report_page_scoped_by_the_token_with_a_daily_chart_per_team(tmp_path, browser, shots, capsys):
    from selenium.webdriver.common.by import By

    s = ui_server(tmp_path)
    admin = create_token(s.data, "--user", "root", "--admin")
    ml = create_token(s.data, "--user", "ana", "--team", "ml")
    s.token = admin
    s.start()
    try:
        jobs = [s.submit("import time; time.sleep(0.3)"), s.submit("import time; time.sleep(0.3)", team="cv", user="bo")]
        for j in jobs:
            s.wait_state(j, "COMPLETED")
        browser.get(s.url + "/ui/#report")
        until(browser, "the token form", "return !document.getElementById('login').hidden")
        browser.find_element(By.ID, "token").send_keys(ml)
        browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
        until(browser, "ml's daily chart", "return document.querySelector(\"#report-daily figure[data-team='ml']\")")
        assert browser.execute_script("return [...document.querySelectorAll('#report-daily figure')]"
                                      ".map(f => f.dataset.team)") == ["ml"]
        assert "teams ml" in text_of(browser, "#report-scope") and "UTC" in text_of(browser, "#tz")
        api = httpx.get(s.url + "/report", headers={"Authorization": f"Bearer {ml}"}, timeout=60).json()
        bars = browser.execute_script("return [...document.querySelectorAll(\"#report-daily figure[data-team='ml'] "
                                      "rect\")].map(r => [r.dataset.day, Number(r.dataset.value)])")
        assert bars == [[d, v] for d, v in zip(api["daily"]["days"], api["daily"]["teams"]["ml"])]
        cells = browser.execute_script("return [...document.querySelectorAll(\"section[data-table='usage_by_team'] "
                                       "tbody tr\")].map(r => r.firstChild.textContent)")
        assert cells == ["ml"]
        assert browser.execute_script("return document.querySelectorAll(\"section[data-table='idle_gaps']\").length") == 0
        save_shot(browser, shots, "ui-report.png", capsys)
        browser.set_window_size(1024, 900)
        width, client = no_sideways_scroll(browser)
        assert client <= 1024 and width <= client, (width, client)

        # what-if: the policy in force to start from, the rows of the token's team beside each other
        assert json.loads(browser.find_element(By.ID, "w-policy").get_attribute("value"))["name"] == "daemon-test"
        browser.find_element(By.CSS_SELECTOR, "#whatif button[type=submit]").click()
        rows = "return [...document.querySelectorAll(\"section[data-table='measured_baseline_proposed'] tbody tr\")]" \
               ".map(r => [...r.children].slice(0, 2).map(c => c.textContent))"
        until(browser, "the what-if rows", rows + ".length")
        assert browser.execute_script(rows) == [["team ml", "1"]]
        heads = browser.execute_script("return [...document.querySelectorAll(\"section[data-table="
                                       "'measured_baseline_proposed'] th\")].map(h => h.textContent)")
        assert heads[:3] == ["group", "jobs", "mean wait (h)"] and heads[6:9] == ["measured", "baseline", "proposed"]
        # measured beside baseline beside proposed, the API's numbers in hours (note 040)
        api = httpx.post(s.url + "/whatif", json={"policy_yaml": browser.find_element(By.ID, "w-policy")
                                                  .get_attribute("value")},
                         headers={"Authorization": f"Bearer {ml}"}, timeout=120).json()["rows"][0]
        cells = browser.execute_script("return Object.fromEntries([...document.querySelectorAll(\"section[data-table="
                                       "'measured_baseline_proposed'] td[data-col]\")].map(c => [c.dataset.col, "
                                       "c.textContent]));")
        for run in ("measured", "current", "proposed"):
            v = api[f"gpu_hours_{run}"]
            shown = str(int(v)) if float(v).is_integer() else f"{v:#.3g}" if abs(v) < 0.01 else f"{v:.2f}"
            assert cells[f"gpu_hours_{run}"] == shown, (run, cells)  # app.js's cell(): hours()
        bars = browser.execute_script("return [...document.querySelectorAll('.whatif-chart rect[data-run]')]"
                                      ".map(r => [r.dataset.group, r.dataset.run]);")
        assert bars == [["team ml", "measured"], ["team ml", "current"], ["team ml", "proposed"]]
        browser.execute_script("document.getElementById('whatif-result').scrollIntoView();")
        save_shot(browser, shots, "ui-whatif.png", capsys)
        width, client = no_sideways_scroll(browser)  # the wide table scrolls in its own box at 1024 px
        assert width <= client, (width, client)
        browser.execute_script("document.getElementById('w-policy').value = 'name: [unclosed'")
        browser.find_element(By.CSS_SELECTOR, "#whatif button[type=submit]").click()
        until(browser, "the refused policy", "return document.getElementById('whatif-error').textContent")
        assert "not YAML at line 1" in text_of(browser, "#whatif-error")

        # a bad range is named on the page
        browser.find_element(By.ID, "r-from").send_keys("not-a-date")
        browser.find_element(By.CSS_SELECTOR, "#report-range button[type=submit]").click()
        until(browser, "the refused range", "return document.getElementById('report-error').textContent")
        assert "'not-a-date' is not allowed" in text_of(browser, "#report-error")
    finally:
        s.stop()
