// The gpushepherd dashboard (design note 012): polls the daemon's JSON API and renders it.
// Every value goes on the page through textContent / createTextNode, never innerHTML:
// job commands, reasons, teams and users are user input.
"use strict";

(function () {
  const POLL_MS = 5000;          // the API's views
  const PLOT_MS = 60000;         // the report's plots (cached for a minute by the server)
  const TOKEN_KEY = "gpushepherd.token";
  const ENDED_KEY = "gpushepherd.showEnded";
  const ENDED = new Set(["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED"]);
  const API = "../";             // the page is at /ui/, the API at /

  class AuthError extends Error {}

  const $ = (id) => document.getElementById(id);

  // el("td", {className: "num", title: "..."}, "text", childNode, ...)
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else node[k] = v;  // className, title, hidden: properties, never markup
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
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
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r;
  }

  const fmtNum = (v, digits) => (v === null || v === undefined) ? "-" : Number(v).toFixed(digits);
  const fmtGpus = (v) => (v === null || v === undefined) ? "-" : String(Math.round(v * 1000) / 1000);

  function fmtTime(t) {
    if (t === null || t === undefined) return "-";
    const d = new Date(t * 1000);
    const s = Math.round(t - Date.now() / 1000);
    const rel = s <= 0 ? "now" : s < 90 ? `in ${s} s` : s < 5400 ? `in ${Math.round(s / 60)} min`
      : `in ${(s / 3600).toFixed(1)} h`;
    return `${d.toLocaleString()} (${rel})`;
  }

  function replaceChildren(node, children) {
    node.replaceChildren(...children);
  }

  // -- nodes and GPUs
  function renderNodes(nodes, jobsById) {
    replaceChildren($("nodes"), nodes.map((n) => {
      const gpus = n.gpu.map((g) => {
        const cls = "gpu" + (g.jobs.length ? " busy" : "") + (g.unmanaged ? " unmanaged" : "");
        const holders = g.jobs.length
          ? g.jobs.map((id) => {
              const j = jobsById.get(id);
              return el("div", {className: "holder", dataset: {job: id}},
                        j ? `${id} ${j.team}/${j.user} ${j["class"]}` : id);
            })
          : [el("div", {className: "free"}, "free")];
        const mem = g.mem_used_mib !== null && g.mem_used_mib !== undefined
          ? `mem ${g.mem_used_mib} / ${g.mem_total_mib ?? "?"} MiB` : (g.mem_total_mib ? `${g.mem_total_mib} MiB` : "");
        return el("div", {className: cls, dataset: {node: n.name, gpu: String(g.index)}},
          el("div", {className: "title"}, `GPU ${g.index}`),
          ...holders,
          el("div", {className: "small"},
             g.util_pct !== null && g.util_pct !== undefined ? `util ${fmtNum(g.util_pct, 0)} %` : "util -"),
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

  // -- the queue
  function renderQueue(jobs) {
    const showEnded = $("show-ended").checked;
    const rows = jobs.filter((j) => showEnded || !ENDED.has(j.state)).map((j) =>
      el("tr", {dataset: {job: j.id, state: j.state}},
        el("td", {}, j.id + (j.array ? `[${j.array}]` : ""),
           j.name ? el("div", {className: "small job-name"}, j.name) : null),
        el("td", {}, j["class"]),
        el("td", {}, j.team),
        el("td", {}, j.user),
        el("td", {className: "state-" + j.state}, j.state),
        el("td", {className: "reason"}, j.reason ?? ""),
        el("td", {title: j.estimated_start_basis === "time limits"
                    ? "an upper bound from time limits, unless higher-priority work arrives"
                    : "from runtime estimates"},
           j.state === "PENDING" && j.estimated_start != null
             ? (j.estimated_start_basis === "time limits" ? "\u2264 " : "~ ") + fmtTime(j.estimated_start) : ""),
        el("td", {className: "num"}, j.priority === null || j.priority === undefined ? "-"
          : Number(j.priority).toLocaleString(undefined, {maximumFractionDigits: 3})),
        el("td", {className: "num"}, j.share ? `${j.gpus} (${j.share})` : j.gpus),
        el("td", {className: "command", title: (j.command || []).join(" ")}, (j.command || []).join(" "))));
    if (!rows.length) rows.push(el("tr", {}, el("td", {colSpan: 10, className: "small"}, "no jobs")));
    replaceChildren(document.querySelector("#queue tbody"), rows);
  }

  // -- usage against quota: nominal / max GPUs from the policy in force
  function limit(v) {
    if (v === null || v === undefined) return null;
    return typeof v === "number" ? v : "windowed";
  }

  function renderUsage(usage, policy) {
    const teams = (policy && policy.policy && policy.policy.teams) || {};
    const rows = usage.teams.map((u) => {
      const t = teams[u.team] || {};
      const nominal = limit(t.nominal_gpus), max = limit(t.max_gpus);
      const cap = typeof max === "number" ? max : typeof nominal === "number" ? nominal : null;
      const bar = el("div", {className: "bar" + (cap !== null && u.gpus_in_use > cap ? " over" : ""),
                             title: cap !== null ? `${fmtGpus(u.gpus_in_use)} of ${cap}` : ""}, el("span"));
      bar.firstChild.style.width = cap ? Math.min(100, 100 * u.gpus_in_use / cap) + "%" : "0";
      return el("tr", {dataset: {team: u.team}},
        el("td", {}, u.team),
        el("td", {className: "num"}, fmtGpus(u.gpus_in_use)),
        el("td", {className: "num"}, nominal ?? "-"),
        el("td", {className: "num"}, max ?? "-"),
        el("td", {}, bar),
        el("td", {className: "num"}, fmtNum(u.decayed_usage_gpu_s / 3600, 2)),
        el("td", {className: "num"}, fmtNum(u.fair_share_factor, 3)));
    });
    replaceChildren(document.querySelector("#usage tbody"), rows);
  }

  // -- plots: fetched with the token, shown from blob URLs (an <img src> sends no header)
  async function refreshPlots() {
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

  let last = null;  // the last data fetched, re-rendered when "show ended" changes

  function showStatus(text, isError) {
    $("status").textContent = text;
    $("status").className = isError ? "error" : "";
  }

  function askToken(why) {
    $("login").hidden = false;
    $("login-error").textContent = token() ? why : "";
    showStatus("a token is needed", true);
  }

  async function refresh() {
    try {
      const [jobs, nodes, usage, policy] = await Promise.all(
        ["jobs", "nodes", "usage", "policy"].map(async (p) => (await get(API + p)).json()));
      last = {jobs, nodes, usage, policy};
      render();
      $("login").hidden = true;
      $("forget").hidden = !token();
      showStatus(`policy ${policy.policy && policy.policy.name ? policy.policy.name + " " : ""}` +
                 `v${policy.version}; updated ${new Date().toLocaleTimeString()}`, false);
      return true;
    } catch (e) {
      if (e instanceof AuthError) askToken(e.message);
      else showStatus(`cannot reach the server: ${e.message} (retrying)`, true);
      return false;
    }
  }

  function render() {
    if (!last) return;
    const byId = new Map(last.jobs.map((j) => [j.id, j]));
    renderNodes(last.nodes, byId);
    renderQueue(last.jobs);
    renderUsage(last.usage, last.policy);
  }

  function start() {
    $("show-ended").checked = sessionStorage.getItem(ENDED_KEY) === "1";
    $("show-ended").addEventListener("change", () => {
      sessionStorage.setItem(ENDED_KEY, $("show-ended").checked ? "1" : "0");
      render();
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
    setInterval(refresh, POLL_MS);
    setInterval(refreshPlots, PLOT_MS);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
