// The gpushepherd dashboard (design notes 012, 029): polls the daemon's JSON API and renders it.
// Every value goes on the page through textContent / createTextNode, never innerHTML:
// job commands, reasons, teams and users are user input.
// Routes (the URL hash): "" or "#team=..&user=..&state=.." the cluster and the queue,
// "#job=ID" one job, "#report" the report.
"use strict";

(function () {
  const POLL_MS = 5000;          // the API's views
  const PLOT_MS = 60000;         // the report's plots (cached for a minute by the server)
  const PAGE = 100;              // jobs per page of the queue (GET /jobs?limit=)
  const HOLDER_PAGES = 20;       // pages of running jobs read for the GPU grid, at most
  const LOG_TAIL = 65536;        // bytes of a job's output shown
  const TOKEN_KEY = "gpushepherd.token";
  const NOT_ENDED = "PENDING,RUNNING,PREEMPTING,STOPPING";
  const HOLDING = "RUNNING,PREEMPTING,STOPPING";
  const API = "../";             // the page is at /ui/, the API at /
  // the SVG namespace, from the page's own <svg> (no URL literal in this file)
  const SVG = () => document.getElementById("svg-ns").namespaceURI;

  class AuthError extends Error {}
  class RefusedError extends Error {}

  const $ = (id) => document.getElementById(id);

  // el("td", {className: "num", title: "..."}, "text", childNode, ...)
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else node[k] = v;  // className, title, hidden, href: properties, never markup
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG(), tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    for (const c of children) node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

  async function get(path) {
    const headers = {};
    if (token()) headers["Authorization"] = "Bearer " + token();
    const r = await fetch(path, {headers, cache: "no-store"});
    if (r.status === 401) {
      let why = "";
      try { why = (await r.json()).detail; } catch (e) { /* not JSON */ }
      throw new AuthError(why || "a token is needed");
    }
    if (r.status === 422 || r.status === 403 || r.status === 404) {
      let why = "HTTP " + r.status;
      try {
        const d = (await r.json()).detail;
        why = Array.isArray(d) ? d.map((x) => x.msg).join("; ") : String(d);
      } catch (e) { /* not JSON */ }
      throw new RefusedError(why);
    }
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r;
  }

  const getJson = async (path) => (await get(path)).json();

  async function post(path, body) {
    const headers = {"Content-Type": "application/json"};
    if (token()) headers["Authorization"] = "Bearer " + token();
    const r = await fetch(path, {method: "POST", headers, body: JSON.stringify(body), cache: "no-store"});
    let data = null;
    try { data = await r.json(); } catch (e) { /* not JSON */ }
    if (r.status === 401) throw new AuthError((data && data.detail) || "a token is needed");
    if (!r.ok) {
      const d = data && data.detail;
      throw new RefusedError(Array.isArray(d) ? d.map((x) => x.msg).join("; ") : String(d || "HTTP " + r.status));
    }
    return data;
  }

  const fmtNum = (v, digits) => (v === null || v === undefined) ? "-" : Number(v).toFixed(digits);
  const fmtGpus = (v) => (v === null || v === undefined) ? "-" : String(Math.round(v * 1000) / 1000);

  // -- one time zone everywhere: the policy's clock.timezone (note 029)
  let zone = "UTC";
  let zoneFmt = null;

  function setZone(tz) {
    if (tz === zone && zoneFmt) return;
    const opts = {year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
                  second: "2-digit", hourCycle: "h23"};
    try {
      zoneFmt = new Intl.DateTimeFormat("en-CA", {...opts, timeZone: tz});
      zone = tz;
    } catch (e) {  // a zone this browser does not know: UTC, and say so
      zoneFmt = new Intl.DateTimeFormat("en-CA", {...opts, timeZone: "UTC"});
      zone = "UTC (the policy's " + tz + " is unknown to this browser)";
    }
    $("tz").textContent = "times in " + zone;
  }

  // "YYYY-MM-DD HH:MM:SS" in the policy's zone
  function fmtClock(t) {
    if (!zoneFmt) setZone("UTC");
    const p = Object.fromEntries(zoneFmt.formatToParts(new Date(t * 1000)).map((x) => [x.type, x.value]));
    return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`;
  }

  function fmtTime(t) {
    if (t === null || t === undefined) return "-";
    const s = Math.round(t - Date.now() / 1000);
    const rel = s <= 0 ? "" : s < 90 ? ` (in ${s} s)` : s < 5400 ? ` (in ${Math.round(s / 60)} min)`
      : ` (in ${(s / 3600).toFixed(1)} h)`;
    return fmtClock(t) + rel;
  }

  function estimate(j) {
    if (j.state !== "PENDING" || j.estimated_start === null || j.estimated_start === undefined) return "";
    return (j.estimated_start_basis === "time limits" ? "\u2264 " : "~ ") + fmtTime(j.estimated_start);
  }

  // -- the route: the URL hash
  function route() {
    const h = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (h.has("job")) return {view: "job", job: h.get("job")};
    if (location.hash === "#report" || h.has("report")) return {view: "report"};
    return {view: "cluster", team: h.get("team") || "", user: h.get("user") || "", state: h.get("state") || ""};
  }

  function jobLink(id) { return el("a", {href: "#job=" + encodeURIComponent(id), className: "job-link"}, id); }

  // -- nodes and GPUs
  // a GPU's utilisation: its own sample, else (no per-GPU sample: a static inventory) its holders' last
  function gpuUtil(g, jobsById) {
    if (g.util_pct !== null && g.util_pct !== undefined) return g.util_pct;
    const u = g.jobs.map((id) => (jobsById.get(id) || {}).gpu_util_pct).filter((v) => v !== null && v !== undefined);
    return u.length ? Math.max(...u) : null;
  }

  // allocated-but-idle: held, and under the threshold by its sample, or a holder the core found idle
  function isIdle(g, jobsById, threshold) {
    if (!g.jobs.length) return false;
    const u = gpuUtil(g, jobsById);
    if (u !== null && u < threshold) return true;
    return g.jobs.some((id) => { const j = jobsById.get(id); return j && j.idle_since !== null && j.idle_since !== undefined; });
  }

  function renderNodes(nodes, jobsById, threshold) {
    $("idle-threshold").textContent = String(threshold);
    $("nodes").replaceChildren(...nodes.map((n) => {
      const gpus = n.gpu.map((g) => {
        const idle = isIdle(g, jobsById, threshold);
        const cls = "gpu" + (g.jobs.length ? " busy" : "") + (idle ? " idle" : "") + (g.unmanaged ? " unmanaged" : "");
        const holders = g.jobs.length
          ? g.jobs.map((id) => {
              const j = jobsById.get(id);
              return el("div", {className: "holder", dataset: {job: id}}, jobLink(id),
                        j ? ` ${j.team}/${j.user} ${j["class"]}` : "");
            })
          : [el("div", {className: "free"}, "free")];
        const mem = g.mem_used_mib !== null && g.mem_used_mib !== undefined
          ? `mem ${g.mem_used_mib} / ${g.mem_total_mib ?? "?"} MiB` : (g.mem_total_mib ? `${g.mem_total_mib} MiB` : "");
        return el("div", {className: cls, dataset: {node: n.name, gpu: String(g.index)}},
          el("div", {className: "title"}, `GPU ${g.index}`),
          ...holders,
          idle ? el("div", {className: "idle-note"}, "allocated, idle") : null,
          el("div", {className: "small util"},
             gpuUtil(g, jobsById) !== null ? `util ${fmtNum(gpuUtil(g, jobsById), 0)} %` : "util -"),
          mem ? el("div", {className: "small"}, mem) : null,
          g.temperature_c !== null && g.temperature_c !== undefined
            ? el("div", {className: "small"}, `${fmtNum(g.temperature_c, 0)} C, ${fmtNum(g.power_w, 0)} W`) : null,
          g.unmanaged ? el("div", {className: "error"},
            "unmanaged: " + (g.unmanaged_processes || []).map((p) => `pid ${p.pid}`).join(", ")) : null);
      });
      return el("div", {className: "node", dataset: {node: n.name}},
        el("h3", {}, `${n.name} - ${n.gpus} x ${n.gpu_type}, ${n.free} free`),
        el("div", {className: "gpus"}, ...gpus));
    }));
  }

  // -- the queue: one page of GET /jobs with the filters (note 029)
  const pager = {key: "", cursors: [null]};  // the cursor of each page seen, for "next" and "first"

  function queueQuery(r) {
    const q = new URLSearchParams({limit: String(PAGE)});
    q.set("state", r.state || NOT_ENDED);
    if (r.team) q.set("team", r.team);
    if (r.user) q.set("user", r.user);
    const key = q.toString();
    if (key !== pager.key) { pager.key = key; pager.cursors = [null]; }
    const c = pager.cursors[pager.cursors.length - 1];
    if (c) q.set("cursor", c);
    return q.toString();
  }

  function renderQueue(page) {
    const rows = page.jobs.map((j) =>
      el("tr", {dataset: {job: j.id, state: j.state}},
        el("td", {className: "id"}, jobLink(j.id), j.array ? `[${j.array}]` : "",
           j.name ? el("div", {className: "small job-name"}, j.name) : null),
        el("td", {}, j["class"]),
        el("td", {}, j.team),
        el("td", {}, j.user),
        el("td", {className: "state-" + j.state}, j.state),
        el("td", {className: "reason"}, j.reason ?? ""),
        el("td", {className: "estimate", title: j.estimated_start_basis === "time limits"
                    ? "an upper bound from time limits, unless jobs that rank higher arrive or backfill first"
                    : "from runtime estimates"}, estimate(j)),
        el("td", {className: "num wide"}, j.priority === null || j.priority === undefined ? "-"
          : Number(j.priority).toLocaleString("en", {maximumFractionDigits: 3})),
        el("td", {className: "num"}, j.share ? `${j.gpus} (${j.share})` : j.gpus),
        el("td", {className: "command wide", title: (j.command || []).join(" ")}, (j.command || []).join(" "))));
    if (!rows.length) rows.push(el("tr", {}, el("td", {colSpan: 10, className: "small"}, "no jobs")));
    document.querySelector("#queue tbody").replaceChildren(...rows);
    const n = pager.cursors.length;
    $("page-info").textContent = `page ${n}` + (page.next ? "" : " (the last)");
    $("page-next").disabled = !page.next;
    $("page-first").disabled = n === 1;
    $("page-next").dataset.next = page.next || "";
  }

  // -- usage against quota, with cohort borrowing (nominal / max GPUs from the policy in force)
  function limit(v) {
    if (v === null || v === undefined) return null;
    return typeof v === "number" ? v : "windowed";
  }

  function cohorts(policy) {  // team -> {name, nominal}
    const out = new Map();
    const teams = (policy && policy.teams) || {};
    for (const [name, c] of Object.entries((policy && policy.cohorts) || {})) {
      for (const m of c.members || []) {
        const team = typeof m === "string" ? m : m.team;
        const nominal = typeof m === "object" && m.nominal_gpus !== undefined ? m.nominal_gpus
          : (teams[team] || {}).nominal_gpus;
        if (!out.has(team)) out.set(team, {name, nominal: typeof nominal === "number" ? nominal : 0});
      }
    }
    return out;
  }

  function renderUsage(usage, policy) {
    const pol = (policy && policy.policy) || {};
    const teams = pol.teams || {};
    const inCohort = cohorts(pol);
    const rows = usage.teams.map((u) => {
      const t = teams[u.team] || {};
      const nominal = limit(t.nominal_gpus), max = limit(t.max_gpus);
      const cap = typeof max === "number" ? max : typeof nominal === "number" ? nominal : null;
      const bar = el("div", {className: "bar" + (cap !== null && u.gpus_in_use > cap ? " over" : ""),
                             title: cap !== null ? `${fmtGpus(u.gpus_in_use)} of ${cap}` : ""}, el("span"));
      bar.firstChild.style.width = cap ? Math.min(100, 100 * u.gpus_in_use / cap) + "%" : "0";
      const c = inCohort.get(u.team);
      const borrowed = c ? Math.max(0, u.gpus_in_use - c.nominal) : 0;
      return el("tr", {dataset: {team: u.team}},
        el("td", {}, u.team),
        el("td", {className: "num"}, fmtGpus(u.gpus_in_use)),
        el("td", {className: "num"}, nominal ?? "-"),
        el("td", {className: "num"}, max ?? "-"),
        el("td", {}, bar),
        el("td", {className: "cohort"}, c ? c.name : "-"),
        el("td", {className: "borrowing" + (borrowed > 0 ? " borrowed" : "")},
           c ? (borrowed > 0 ? `borrowing ${fmtGpus(borrowed)} GPU${borrowed === 1 ? "" : "s"} from ${c.name}` : "0")
             : "-"),
        el("td", {className: "num"}, fmtNum(u.decayed_usage_gpu_s / 3600, 2)),
        el("td", {className: "num"}, fmtNum(u.fair_share_factor, 3)));
    });
    document.querySelector("#usage tbody").replaceChildren(...rows);
  }

  // -- plots: fetched with the token, shown from blob URLs (an <img src> sends no header)
  async function refreshPlots() {
    if (route().view !== "cluster") return;
    for (const img of document.querySelectorAll("img[data-plot]")) {
      try {
        const blob = await (await get(`plots/${img.dataset.plot}.png`)).blob();
        const old = img.src;
        img.src = URL.createObjectURL(blob);
        if (old.startsWith("blob:")) URL.revokeObjectURL(old);
        img.title = "";
      } catch (e) {
        if (e instanceof AuthError) return;
        img.title = String(e.message);
      }
    }
  }

  // -- one job: its view with history, and the tail of its output
  async function logTail(id, stream) {
    const base = `${API}jobs/${encodeURIComponent(id)}/logs?stream=${stream}`;
    const size = Number((await get(base + "&limit=1")).headers.get("X-Log-Size") || "0");
    if (!size) return "";
    return (await get(`${base}&offset=${Math.max(0, size - LOG_TAIL)}&limit=${LOG_TAIL}`)).text();
  }

  function field(name, value) {
    return [el("dt", {}, name), el("dd", {dataset: {field: name}}, value === null || value === undefined || value === ""
      ? "-" : value)];
  }

  async function renderJob(id) {
    const j = await getJson(`${API}jobs/${encodeURIComponent(id)}`);
    $("job-title").textContent = `job ${j.id}` + (j.name ? ` (${j.name})` : "");
    const util = j.gpu_util_pct !== null && j.gpu_util_pct !== undefined
      ? `${fmtNum(j.gpu_util_pct, 0)} % at ${fmtClock(j.sampled_at)}` : null;
    const mem = j.gpu_mem_mib !== null && j.gpu_mem_mib !== undefined ? `${j.gpu_mem_mib} MiB` : null;
    const peak = j.peak_gpu_mem_mib !== null && j.peak_gpu_mem_mib !== undefined
      ? `${j.peak_gpu_mem_mib} MiB` + (j.declared_gpu_mem_mib ? ` of ${j.declared_gpu_mem_mib} MiB declared` : "")
        + (j.over_declared_mem ? " (over)" : "") : null;
    $("job-fields").replaceChildren(...[
      field("state", j.state), field("reason", j.reason), field("estimated start", estimate(j)),
      field("class / team / user", `${j["class"]} / ${j.team} / ${j.user}`), field("project", j.project),
      field("GPUs", j.share ? `${j.gpus} (${j.share})` : j.gpus), field("placement", j.placement),
      field("submitted", fmtTime(j.submit_time)), field("first start", j.first_start ? fmtTime(j.first_start) : null),
      field("runs", j.runs), field("preemptions", j.preemptions),
      field("GPU utilisation", util), field("GPU memory", mem), field("peak GPU memory", peak),
      field("idle since", j.idle_since ? fmtTime(j.idle_since) : null),
      field("exit code", j.exit_code), field("failure", j.failure || j.launch_error),
      field("command", (j.command || []).join(" ")),
    ].flat());
    const hist = (j.history || []).map((h) => el("tr", {},
      el("td", {className: "time"}, fmtClock(h.t)), el("td", {}, h.from), el("td", {}, h.to),
      el("td", {className: "reason"}, h.reason ?? "")));
    if (!hist.length) hist.push(el("tr", {}, el("td", {colSpan: 4, className: "small"}, "no history")));
    document.querySelector("#job-history tbody").replaceChildren(...hist);
    for (const stream of ["stdout", "stderr"]) {
      try {
        $("job-" + stream).textContent = j.runs ? await logTail(id, stream) : "(not started)";
      } catch (e) {
        if (e instanceof AuthError) throw e;
        $("job-" + stream).textContent = "(" + e.message + ")";
      }
    }
  }

  // -- the report (note 029): GET /report, scoped by the token's teams
  // two decimals, or three significant digits below 0.01 (a short job's GPU-hours is not "0.00")
  const hours = (v) => (v !== 0 && Math.abs(v) < 0.01 ? v.toPrecision(3) : v.toFixed(2));

  function cell(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : hours(v);
    return String(v);
  }

  function renderDaily(daily) {
    const teams = Object.keys(daily.teams).sort();
    const days = daily.days;
    const max = Math.max(1e-9, ...teams.flatMap((t) => daily.teams[t]));
    const W = 640, H = 160, left = 46, bottom = 22, barW = (W - left) / Math.max(1, days.length);
    const charts = teams.map((t) => {
      const bars = daily.teams[t].map((v, i) => svg("rect", {
        x: left + i * barW + 2, y: H - bottom - (H - bottom - 10) * v / max, width: Math.max(1, barW - 4),
        height: (H - bottom - 10) * v / max, class: "bar-day", "data-day": days[i], "data-value": v},
        svg("title", {}, `${days[i]}: ${hours(v)} GPU-hours`)));
      const labels = days.map((d, i) => svg("text", {x: left + i * barW + barW / 2, y: H - 6, "text-anchor": "middle",
                                                     class: "axis"}, d.slice(5)));
      const axis = [svg("text", {x: left - 4, y: 14, "text-anchor": "end", class: "axis"}, hours(max)),
                    svg("text", {x: left - 4, y: H - bottom, "text-anchor": "end", class: "axis"}, "0"),
                    svg("line", {x1: left, y1: H - bottom, x2: W, y2: H - bottom, class: "axis-line"})];
      return el("figure", {className: "daily", dataset: {team: t}},
        el("figcaption", {}, `${t}: ${hours(daily.teams[t].reduce((a, b) => a + b, 0))} GPU-hours`),
        svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `GPU-hours per day of team ${t}`},
            ...axis, ...bars, ...labels));
    });
    $("report-daily").replaceChildren(...(charts.length ? charts : [el("p", {className: "small"}, "no GPU-hours")]));
  }

  function renderReport(rep) {
    setZone(rep.timezone || zone);
    $("report-scope").textContent = `${fmtClock(rep.from)} to ${fmtClock(rep.to)}` +
      (rep.clipped ? ` (${rep.clipped})` : "") + "; " +
      (rep.scope.teams === null ? "all teams" : "teams " + (rep.scope.teams.join(", ") || "(none)")) +
      (rep.currency ? `; cost in ${rep.currency}` : "");
    renderDaily(rep.daily);
    $("report-tables").replaceChildren(...Object.entries(rep.tables).map(([name, rows]) => tableOf(name, rows)));
  }

  function tableOf(name, rows) {
    const cols = rows.length ? Object.keys(rows[0]) : [];
    return el("section", {className: "report-table", dataset: {table: name}},
      el("h3", {}, name.replace(/_/g, " ")),
      rows.length ? el("table", {},
        el("thead", {}, el("tr", {}, ...cols.map((c) => el("th", {}, c.replace(/_/g, " "))))),
        el("tbody", {}, ...rows.map((r) => el("tr", {}, ...cols.map((c) =>
          el("td", {className: typeof r[c] === "number" ? "num" : ""}, cell(r[c]))))))) :
        el("p", {className: "small"}, "none"));
  }

  // -- what-if (notes 029, 040): measured (the log) beside the baseline (simulated under the current
  // policy) beside the proposed policy, per team and class: a table and a grouped bar chart
  const RUNS = [["measured", "measured (log)"], ["current", "baseline (simulated)"],
                ["proposed", "proposed (simulated)"]];
  const FIGURES = [["wait_mean_s", "mean wait (h)", 3600], ["wait_p95_s", "p95 wait (h)", 3600],
                   ["jct_mean_s", "mean JCT (h)", 3600], ["gpu_hours", "GPU-hours", 1]];
  const scaled = (v, div) => (v === null || v === undefined ? null : v / div);

  function whatIfTable(rows) {
    const head1 = el("tr", {}, el("th", {rowSpan: 2}, "group"), el("th", {rowSpan: 2}, "jobs"),
      ...FIGURES.map(([, label]) => el("th", {colSpan: 3}, label)));
    const head2 = el("tr", {}, ...FIGURES.flatMap(() => RUNS.map(([, label]) => el("th", {}, label.split(" ")[0]))));
    const body = rows.map((r) => el("tr", {}, el("td", {}, `${r.by} ${r.group}`), el("td", {className: "num"}, r.jobs),
      ...FIGURES.flatMap(([col, , div]) => RUNS.map(([run]) =>
        el("td", {className: "num", dataset: {col: `${col}_${run}`}}, cell(scaled(r[`${col}_${run}`], div)))))));
    return el("section", {className: "report-table", dataset: {table: "measured_baseline_proposed"}},
      el("h3", {}, "measured, baseline, proposed"),
      el("p", {className: "small"}, "measured: what the event log shows for these jobs; baseline: the same jobs " +
         "simulated under the policy in force (how well it matches the log says how far to trust the simulator); " +
         "proposed: simulated under the proposed policy. Waits and JCT in hours."),
      rows.length ? el("table", {}, el("thead", {}, head1, head2), el("tbody", {}, ...body)) :
        el("p", {className: "small"}, "none"));
  }

  function whatIfChart(rows) {
    // mean wait per group, one bar per run, labelled; the SVG is built with DOM calls only
    const W = 640, H = 200, left = 46, bottom = 34, top = 10;
    const vals = rows.map((r) => RUNS.map(([run]) => scaled(r[`wait_mean_s_${run}`], 3600) || 0));
    const peak = Math.max(0, ...vals.flat()), max = peak || 1;  // no wait at all: flat bars, "0 h"
    const groupW = (W - left) / Math.max(1, rows.length), barW = Math.max(1, (groupW - 8) / RUNS.length);
    const bars = rows.flatMap((r, g) => RUNS.map(([run, label], k) => {
      const v = vals[g][k], h = (H - bottom - top) * v / max;
      return svg("rect", {x: left + g * groupW + 4 + k * barW, y: H - bottom - h, width: Math.max(1, barW - 1),
                          height: h, class: `bar-${run}`, "data-group": `${r.by} ${r.group}`, "data-run": run,
                          "data-value": v}, svg("title", {}, `${r.by} ${r.group}, ${label}: ${hours(v)} h`));
    }));
    const labels = rows.map((r, g) => svg("text", {x: left + g * groupW + groupW / 2, y: H - bottom + 14,
                                                   "text-anchor": "middle", class: "axis"}, `${r.by} ${r.group}`));
    const axis = [svg("text", {x: left - 4, y: top + 4, "text-anchor": "end", class: "axis"},
                      peak ? `${hours(peak)} h` : ""),
                  svg("text", {x: left - 4, y: H - bottom, "text-anchor": "end", class: "axis"}, "0 h"),
                  svg("line", {x1: left, y1: H - bottom, x2: W, y2: H - bottom, class: "axis-line"})];
    const legend = RUNS.map(([run, label], k) => [
      svg("rect", {x: left + k * 200, y: H - 12, width: 10, height: 10, class: `bar-${run}`}),
      svg("text", {x: left + k * 200 + 14, y: H - 3, class: "axis"}, label)]).flat();
    return el("figure", {className: "daily whatif-chart"},
      el("figcaption", {}, "mean wait per team and class (hours): measured, baseline, proposed" +
         (peak ? "" : " - no job waited in any of the three")),
      svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "mean wait: measured, baseline, proposed"},
          ...axis, ...bars, ...labels, ...legend));
  }

  // -- what-if (note 029): POST /whatif with the text of the proposed policy
  async function runWhatIf() {
    const body = {policy_yaml: $("w-policy").value};
    if ($("r-from").value.trim()) body.from = $("r-from").value.trim();
    if ($("r-to").value.trim()) body.to = $("r-to").value.trim();
    $("whatif-error").textContent = "";
    $("whatif-status").textContent = "replaying the jobs under both policies...";
    try {
      const out = await post(API + "whatif", body);
      $("whatif-status").textContent = `${fmtClock(out.from)} to ${fmtClock(out.to)}; ` +
        (out.scope.teams === null ? "all teams" : "teams " + (out.scope.teams.join(", ") || "(none)"));
      $("whatif-result").replaceChildren(whatIfChart(out.rows), whatIfTable(out.rows),
                                         tableOf("rejected", out.rejected),
                                         tableOf("not_replayed", out.not_replayed));
    } catch (e) {
      $("whatif-status").textContent = "";
      if (e instanceof AuthError) { askToken(e.message); return; }
      $("whatif-error").textContent = e.message;
    }
  }

  async function refreshReport() {
    const q = new URLSearchParams();
    if ($("r-from").value.trim()) q.set("from", $("r-from").value.trim());
    if ($("r-to").value.trim()) q.set("to", $("r-to").value.trim());
    try {
      renderReport(await getJson(API + "report" + (q.toString() ? "?" + q : "")));
      $("report-error").textContent = "";
    } catch (e) {
      if (e instanceof RefusedError) { $("report-error").textContent = e.message; return; }
      throw e;
    }
  }

  // -- polling
  let last = null;

  function showStatus(text, isError) {
    $("status").textContent = text;
    $("status").className = isError ? "error" : "";
  }

  function askToken(why) {
    $("login").hidden = false;
    $("login-error").textContent = token() ? why : "";
    showStatus("a token is needed", true);
  }

  async function holders() {  // the jobs holding GPUs, page by page (at most HOLDER_PAGES)
    const out = [];
    let cursor = null;
    for (let i = 0; i < HOLDER_PAGES; i++) {
      const q = new URLSearchParams({state: HOLDING, limit: "500"});
      if (cursor) q.set("cursor", cursor);
      const page = await getJson(API + "jobs?" + q);
      out.push(...page.jobs);
      cursor = page.next;
      if (!cursor) break;
    }
    return out;
  }

  function show(view) {
    for (const id of ["cluster", "job", "report"]) $(id).hidden = id !== view;
  }

  let busy = false;

  async function refresh() {
    if (busy) return false;
    busy = true;
    const r = route();
    try {
      const policy = await getJson(API + "policy");
      setZone((policy.policy && policy.policy.clock && policy.policy.clock.timezone) || "UTC");
      show(r.view);
      if (r.view === "job") {
        await renderJob(r.job);
      } else if (r.view === "report") {
        if (!$("w-policy").value) $("w-policy").value = JSON.stringify(policy.policy || {}, null, 2);
        await refreshReport();
      } else {
        let page;
        try {
          page = await getJson(API + "jobs?" + queueQuery(r));
          $("filter-error").textContent = "";
        } catch (e) {
          if (!(e instanceof RefusedError)) throw e;
          $("filter-error").textContent = e.message;
          page = {jobs: [], next: null};
        }
        const [held, nodes, usage] = await Promise.all([holders(), getJson(API + "nodes"), getJson(API + "usage")]);
        last = {page, held, nodes, usage, policy};
        const byId = new Map(held.concat(page.jobs).map((j) => [j.id, j]));
        renderNodes(nodes, byId, usage.idle_threshold_pct ?? 5);
        renderQueue(page);
        renderUsage(usage, policy);
      }
      $("login").hidden = true;
      $("forget").hidden = !token();
      showStatus(`policy ${policy.policy && policy.policy.name ? policy.policy.name + " " : ""}` +
                 `v${policy.version}; updated ${fmtClock(Date.now() / 1000)}`, false);
      return true;
    } catch (e) {
      if (e instanceof AuthError) askToken(e.message);
      else if (e instanceof RefusedError && r.view === "job") showStatus(e.message, true);
      else showStatus(`cannot reach the server: ${e.message} (retrying)`, true);
      return false;
    } finally {
      busy = false;
    }
  }

  function setFilters(r) {
    $("f-team").value = r.team || "";
    $("f-user").value = r.user || "";
    $("f-state").value = r.state || "";
  }

  function start() {
    const r = route();
    if (r.view === "cluster") setFilters(r);
    $("filters").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      for (const k of ["team", "user", "state"]) {
        const v = $("f-" + k).value.trim();
        if (v) q.set(k, v);
      }
      location.hash = q.toString() || "";
      if (!q.toString()) refresh();
    });
    $("f-clear").addEventListener("click", () => { setFilters({}); location.hash = ""; refresh(); });
    $("page-next").addEventListener("click", () => {
      if ($("page-next").dataset.next) { pager.cursors.push($("page-next").dataset.next); refresh(); }
    });
    $("page-first").addEventListener("click", () => { pager.cursors = [null]; refresh(); });
    $("report-range").addEventListener("submit", (ev) => { ev.preventDefault(); refresh(); });
    $("whatif").addEventListener("submit", (ev) => { ev.preventDefault(); runWhatIf(); });
    window.addEventListener("hashchange", () => {
      const now = route();
      if (now.view === "cluster") setFilters(now);
      refresh().then((ok) => { if (ok) refreshPlots(); });
    });
    $("login").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      if (await refresh()) refreshPlots();
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
    refresh().then((ok) => { if (ok) refreshPlots(); });
    setInterval(() => { if (route().view !== "report") refresh(); }, POLL_MS);
    setInterval(refreshPlots, PLOT_MS);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
