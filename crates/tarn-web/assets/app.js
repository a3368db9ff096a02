// tarn's web page: the dashboard for administrators, shares and
// snapshots for everyone. It calls the same admin API as the `tarn`
// command (POST /api/call/METHOD) with the session cookie and its CSRF
// token, and refreshes every few seconds. No third-party code.
"use strict";

const REFRESH_MS = 3000;
let session = null; // {user, pool, admin, csrf}
let timer = null;

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

async function api(method, params) {
  const r = await fetch("/api/call/" + method, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": session.csrf },
    body: JSON.stringify(params || {}),
  });
  const body = await r.json().catch(() => ({}));
  if (r.status === 401) {
    showLogin();
    throw new Error("logged out");
  }
  if (!r.ok) throw new Error((body.error && body.error.message) || r.statusText);
  return body.result;
}

function size(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

function duration(s) {
  if (s === null || s === undefined) return "";
  if (s < 90) return s + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function badge(health) {
  const cls = health === "ONLINE" ? "badge" : health === "DEGRADED" ? "badge warn" : "badge bad";
  return el("span", { class: cls }, health);
}

function table(t, head, rows) {
  t.replaceChildren(
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((c) =>
      c instanceof Node ? el("td", {}, c) : el("td", {}, c))))),
  );
}

function leaves(v, out) {
  if (!v.children || v.children.length === 0) out.push(v);
  else v.children.forEach((c) => leaves(c, out));
  return out;
}

function poolCard(st, entry) {
  const used = entry ? entry.allocated / Math.max(entry.size, 1) : 0;
  const devs = [];
  st.vdevs.concat(st.logs || []).forEach((v) => leaves(v, devs));
  const scan = st.scan;
  let scanLine = "no scrub yet";
  if (scan) {
    const going = scan.state === "scanning" || scan.state === "paused";
    const pct = scan.total_bytes ? Math.min(100, (100 * scan.examined_bytes) / scan.total_bytes) : 100;
    const when = scan.ended_unix ? " " + new Date(scan.ended_unix * 1000).toLocaleString() : "";
    scanLine = `${scan.kind} ${scan.state}` + (going ? `, ${pct.toFixed(1)} %` : when) +
      (scan.state === "scanning" ? `, ${size(scan.rate_bytes_per_sec)}/s, ${duration(scan.eta_secs)} left` : "") +
      `, ${size(scan.repaired_bytes)} repaired, ${scan.errors} errors`;
  }
  const scrub = (action) => el("button", {
    onclick: () => api("pool.scrub", { name: st.name, action }).then(refresh, showError),
  }, action[0].toUpperCase() + action.slice(1) + " scrub");
  const devTable = el("table", { class: "devices" });
  table(devTable, ["device", "state", "read", "write", "cksum"], devs.map((d) => [
    d.name, badge(d.health), d.counters.read_errors, d.counters.write_errors, d.counters.cksum_errors,
  ]));
  return el("div", { class: "card pool", "data-pool": st.name },
    el("h3", {}, el("span", {}, st.name), badge(st.health)),
    entry ? el("div", { class: "muted" }, `${size(entry.allocated)} of ${size(entry.size)} used (${(100 * used).toFixed(0)} %)`) : null,
    el("div", { class: "bar" }, el("div", { style: `width:${(100 * used).toFixed(1)}%` })),
    st.message ? el("p", { class: "error" }, st.message) : null,
    el("div", { class: "scroll" }, devTable),
    el("p", { class: "scan muted" }, scanLine),
    el("div", { class: "buttons" }, scrub("start"), scrub("pause"), scrub("cancel")),
  );
}

function drawChart(points) {
  const c = $("#chart");
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const series = points.map((p) => p.pools.reduce((a, r) => [a[0] + r.read_bytes_per_sec, a[1] + r.write_bytes_per_sec], [0, 0]));
  const max = Math.max(1, ...series.map((s) => Math.max(s[0], s[1])));
  const line = (i, color) => {
    g.strokeStyle = color;
    g.lineWidth = 2;
    g.beginPath();
    series.forEach((s, k) => {
      const x = series.length > 1 ? (k / (series.length - 1)) * (c.width - 10) + 5 : 5;
      const y = c.height - 5 - (s[i] / max) * (c.height - 25);
      if (k === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  };
  line(0, "#457b9d");
  line(1, "#e76f51");
  g.fillStyle = "#1d2430";
  g.font = "12px system-ui";
  g.fillText(`read (blue) / write (orange), peak ${size(max)}/s`, 8, 14);
  const last = points[points.length - 1];
  if (last) {
    const hit = last.cache_hit_ratio === null ? "-" : (100 * last.cache_hit_ratio).toFixed(0) + " %";
    const protos = last.protocols.map((p) => `${p.protocol} ${p.requests_per_sec.toFixed(0)} req/s`).join(", ");
    $("#rates").textContent = `cache hits ${hit}` + (protos ? `; ${protos}` : "");
  }
}

function showError(e) {
  $("#error").textContent = e.message || String(e);
}

async function refreshAdmin() {
  const [status, list, history, events, users] = await Promise.all([
    api("pool.status", {}), api("pool.list", {}), api("stats.history", {}),
    api("events.list", { limit: 20 }), api("user.list", {}),
  ]);
  const byName = Object.fromEntries(list.map((e) => [e.name, e]));
  $("#pools").replaceChildren(...status.map((st) => poolCard(st, byName[st.name])));
  if (status.length === 0) $("#pools").replaceChildren(el("p", { class: "muted" }, "no pools yet"));
  drawChart(history);
  table($("#events"), ["time", "severity", "what"], events.slice().reverse().map((e) => [
    new Date(e.time_unix * 1000).toLocaleString(), e.severity, el("span", { class: "wrap" }, e.message),
  ]));
  table($("#users"), ["name", "pool", "uid", "admin"], users.map((u) => [u.name, u.pool, u.uid, u.admin ? "yes" : ""]));
}

async function refresh() {
  if (!session) return;
  try {
    if (session.admin) await refreshAdmin();
    const [shares, datasets] = await Promise.all([
      api("share.list", {}), api("dataset.list", { snapshots: true }),
    ]);
    // A user's list carries their own access; an administrator's the
    // share records, whose user lists are summed up.
    const users = (m) => (m ? Object.entries(m.users || {}).map(([u, a]) => `${u}=${a}`).join(" ") : "");
    table($("#shares"), ["share", "dataset", "access"], shares.map((s) => [
      s.share.name, s.share.dataset,
      session.admin
        ? [s.share.nfs ? "nfs" : "", s.share.webdav ? "webdav " + users(s.share.webdav) : "",
          s.share.smb ? "smb " + users(s.share.smb) : ""].filter(Boolean).join("; ")
        : [s.webdav ? "webdav " + s.webdav : "", s.smb ? "smb " + s.smb : ""].filter(Boolean).join(", "),
    ]));
    table($("#datasets"), ["name", "used", "refer", ""], datasets.map((d) => {
      const snap = d.name.includes("@");
      let action = "";
      if (session.admin && snap) {
        action = el("button", { onclick: () => {
          if (confirm(`Destroy ${d.name}?`)) api("dataset.destroy", { name: d.name, recursive: false }).then(refresh, showError);
        } }, "Destroy");
      } else if (session.admin) {
        action = el("button", { onclick: () => {
          const now = new Date().toISOString().replace(/[-:]/g, "").slice(0, 15);
          api("dataset.snapshot", { names: [`${d.name}@web-${now}`], recursive: false }).then(refresh, showError);
        } }, "Snapshot");
      }
      return [d.name, size(d.used), size(d.referenced), action];
    }));
    $("#error").textContent = "";
  } catch (e) {
    if (e.message !== "logged out") showError(e);
  }
}

function showApp() {
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#logout").hidden = false;
  $("#who").textContent = `${session.user}${session.admin ? " (administrator)" : ""}`;
  document.querySelectorAll("[data-admin]").forEach((s) => { s.hidden = !session.admin; });
  refresh();
  clearInterval(timer);
  timer = setInterval(refresh, REFRESH_MS);
}

function showLogin() {
  session = null;
  clearInterval(timer);
  $("#app").hidden = true;
  $("#logout").hidden = true;
  $("#who").textContent = "";
  $("#login").hidden = false;
}

$("#login").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("#login-error").textContent = "";
  const r = await fetch("/api/login", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ user: $("#user").value, password: $("#password").value }),
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    $("#login-error").textContent = (body.error && body.error.message) || r.statusText;
    return;
  }
  session = body;
  $("#password").value = "";
  showApp();
});

$("#logout").addEventListener("click", async () => {
  await fetch("/api/logout", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": session ? session.csrf : "" },
    body: "{}",
  }).catch(() => {});
  showLogin();
});

(async () => {
  const r = await fetch("/api/session", { credentials: "same-origin" });
  if (r.ok) {
    session = await r.json();
    showApp();
  } else {
    showLogin();
  }
})();
