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

const COLORS = ["#457b9d", "#e76f51", "#2a9d8f", "#e9c46a", "#8d5fd3", "#264653", "#f4a261", "#6c757d"];

// The series of one metric: per pool (reads and writes) and, for
// operations and latency, per protocol.
function seriesOf(points, metric) {
  const out = new Map();
  const put = (label, k, v) => {
    if (!out.has(label)) out.set(label, new Array(points.length).fill(null));
    out.get(label)[k] = v;
  };
  points.forEach((p, k) => {
    for (const r of p.pools) {
      if (metric === "bytes") {
        put(`${r.pool} read`, k, r.read_bytes_per_sec);
        put(`${r.pool} write`, k, r.write_bytes_per_sec);
      } else if (metric === "iops") {
        put(`${r.pool} read`, k, r.read_iops);
        put(`${r.pool} write`, k, r.write_iops);
      } else {
        put(`${r.pool} read`, k, r.read_latency_ms);
        put(`${r.pool} write`, k, r.write_latency_ms);
      }
    }
    if (metric !== "bytes") {
      for (const r of p.protocols) {
        put(r.protocol, k, metric === "iops" ? r.requests_per_sec : r.latency_ms);
      }
    }
  });
  return [...out.entries()].map(([label, values], i) => ({ label, values, color: COLORS[i % COLORS.length] }));
}

function unitOf(metric, v) {
  if (metric === "bytes") return `${size(v)}/s`;
  if (metric === "iops") return `${v.toFixed(v < 10 ? 1 : 0)}/s`;
  return `${v.toFixed(v < 10 ? 2 : 0)} ms`;
}

function drawChart(points) {
  const metric = $("#chart-metric").value;
  const c = $("#chart");
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const series = seriesOf(points, metric);
  const max = Math.max(1e-9, ...series.flatMap((s) => s.values.filter((v) => v !== null)));
  for (const s of series) {
    g.strokeStyle = s.color;
    g.lineWidth = 2;
    g.beginPath();
    let pen = false;
    s.values.forEach((v, k) => {
      if (v === null) { pen = false; return; }
      const x = points.length > 1 ? (k / (points.length - 1)) * (c.width - 10) + 5 : 5;
      const y = c.height - 5 - (v / max) * (c.height - 25);
      if (pen) g.lineTo(x, y); else g.moveTo(x, y);
      pen = true;
    });
    g.stroke();
  }
  g.fillStyle = "#1d2430";
  g.font = "12px system-ui";
  const span = $("#chart-range").value === "day" ? "last day, per 5 minutes" : "last hour, per 10 seconds";
  g.fillText(`peak ${unitOf(metric, max)} (${span})`, 8, 14);
  $("#legend").replaceChildren(...series.map((s) => {
    const last = [...s.values].reverse().find((v) => v !== null);
    const e = el("span", {}, `${s.label}${last === undefined ? "" : ": " + unitOf(metric, last)}`);
    e.style.setProperty("--c", s.color);
    return e;
  }));
  const now = points[points.length - 1];
  if (now) {
    const hit = now.cache_hit_ratio === null ? "-" : (100 * now.cache_hit_ratio).toFixed(0) + " %";
    const protos = now.protocols.map((p) => `${p.protocol} ${p.requests_per_sec.toFixed(0)} req/s`).join(", ");
    $("#rates").textContent = `cache hits ${hit}` + (protos ? `; ${protos}` : "");
  }
}

function showError(e) {
  $("#error").textContent = e.message || String(e);
}

async function refreshAdmin() {
  const [status, list, history, events, users, alerts] = await Promise.all([
    api("pool.status", {}), api("pool.list", {}), api("stats.history", { day: $("#chart-range").value === "day" }),
    api("events.list", { limit: 20 }), api("user.list", {}), api("alert.list", {}),
  ]);
  const byName = Object.fromEntries(list.map((e) => [e.name, e]));
  $("#pools").replaceChildren(...status.map((st) => poolCard(st, byName[st.name])));
  if (status.length === 0) $("#pools").replaceChildren(el("p", { class: "muted" }, "no pools yet"));
  drawChart(history);
  table($("#events"), ["time", "severity", "what"], events.slice().reverse().map((e) => [
    new Date(e.time_unix * 1000).toLocaleString(), e.severity, el("span", { class: "wrap" }, e.message),
  ]));
  table($("#users"), ["name", "pool", "uid", "admin", ""], users.map((u) => [u.name, u.pool, u.uid, u.admin ? "yes" : "",
    el("span", { class: "buttons", "data-user": u.name },
      button("Password", () => {
        const password = prompt(`New password for ${u.name}:`);
        if (password) act("user.passwd", { pool: u.pool, name: u.name, password });
      }),
      button(u.admin ? "Not admin" : "Make admin", () => act("user.admin", { pool: u.pool, name: u.name, admin: !u.admin })),
      button("Delete", () => {
        if (confirm(`Delete the user ${u.name} of ${u.pool}?`)) act("user.del", { pool: u.pool, name: u.name });
      })),
  ]));
  table($("#alerts"), ["name", "to", "from", "sent", "last error", ""], alerts.map((a) => {
    const t = a.alert.target;
    const to = t.webhook ? t.webhook.url : t.email ? `mail to ${t.email.to.join(", ")}` : t.program ? "a program" : "";
    return [a.alert.name, el("span", { class: "wrap" }, to), a.alert.min_severity, a.sent,
      el("span", { class: "wrap" }, a.last_error || ""),
      el("span", { class: "buttons" },
        button("Test", () => act("alert.test", { name: a.alert.name })),
        button("Delete", () => { if (confirm(`Delete the alert ${a.alert.name}?`)) act("alert.del", { name: a.alert.name }); }))];
  }));
}

function button(label, onclick) {
  return el("button", { type: "button", onclick }, label);
}

// An administrator's change: the method, then a fresh page.
async function act(method, params) {
  try {
    const r = await api(method, params);
    await refresh();
    return r;
  } catch (e) {
    showError(e);
    return undefined;
  }
}

async function showProps(name) {
  let props;
  try {
    props = await api("dataset.get", { name, properties: [] });
  } catch (e) { showError(e); return; }
  $("#props-title").textContent = `Properties of ${name}`;
  table($("#props-table"), ["property", "value", "source", ""], props.map((p) => [
    p.property, el("span", { class: "wrap" }, p.value),
    typeof p.source === "string" ? p.source : Object.keys(p.source || {})[0] || "",
    button("Change", async () => {
      const value = prompt(`New ${p.property} of ${name}:`, p.value);
      if (value !== null && value !== p.value && await act("dataset.set", { name, property: p.property, value }) !== undefined) {
        showProps(name);
      }
    }),
  ]));
  $("#props").hidden = false;
}

function parseUsers(text) {
  const m = {};
  for (const w of (text || "").split(/[\s,]+/).filter(Boolean)) {
    const [u, a] = w.split("=");
    m[u] = a === "ro" ? "ro" : "rw";
  }
  return m;
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
    table($("#shares"), ["share", "dataset", "access", ""], shares.map((s) => [
      s.share.name, s.share.dataset,
      session.admin
        ? [s.share.nfs ? "nfs" : "", s.share.webdav ? "webdav " + users(s.share.webdav) : "",
          s.share.smb ? "smb " + users(s.share.smb) : ""].filter(Boolean).join("; ")
        : [s.webdav ? "webdav " + s.webdav : "", s.smb ? "smb " + s.smb : ""].filter(Boolean).join(", "),
      session.admin ? button("Remove", () => {
        if (confirm(`Stop serving the share ${s.share.name}? Its files stay.`)) act("share.del", { pool: s.pool, name: s.share.name });
      }) : "",
    ]));
    table($("#datasets"), ["name", "used", "refer", ""], datasets.map((d) => {
      const snap = d.name.includes("@");
      const destroy = button("Destroy", () => {
        if (confirm(`Destroy ${d.name}${snap ? "" : " with its snapshots and the datasets below it"}? This cannot be undone.`)) {
          act("dataset.destroy", { name: d.name, recursive: !snap });
        }
      });
      let actions = "";
      if (session.admin && snap) {
        actions = el("span", { class: "buttons", "data-dataset": d.name },
          button("Rollback", () => {
            if (confirm(`Roll ${d.name.split("@")[0]} back to ${d.name}? Changes made since are lost.`)) {
              act("dataset.rollback", { snapshot: d.name, destroy_newer: false });
            }
          }),
          button("Clone", () => {
            const name = prompt(`Name of the new filesystem cloned from ${d.name}:`, d.name.split("@")[0] + "-clone");
            if (name) act("dataset.clone", { snapshot: d.name, name });
          }),
          destroy);
      } else if (session.admin) {
        actions = el("span", { class: "buttons", "data-dataset": d.name },
          button("Snapshot", () => {
            const now = new Date().toISOString().replace(/[-:]/g, "").slice(0, 15);
            act("dataset.snapshot", { names: [`${d.name}@web-${now}`], recursive: false });
          }),
          button("Properties", () => showProps(d.name)),
          d.name.includes("/") ? destroy : "");
      }
      return [d.name, size(d.used), size(d.referenced), actions];
    }));
    $("#error").textContent = "";
  } catch (e) {
    if (e.message !== "logged out") showError(e);
  }
}

function showApp() {
  $("#login").hidden = true;
  $("#tabs").hidden = false;
  showTab(location.hash.startsWith("#files") ? "files" : "dash");
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
  $("#tabs").hidden = true;
  $("#files-view").hidden = true;
  $("#logout").hidden = true;
  $("#who").textContent = "";
  $("#login").hidden = false;
}

function onForm(id, handler) {
  $(id).addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (await handler() !== undefined) ev.target.reset();
  });
}

onForm("#ds-new", () => {
  const properties = {};
  if ($("#ds-compression").value) properties.compression = $("#ds-compression").value;
  return act("dataset.create", { name: $("#ds-name").value.trim(), properties, parents: false });
});
onForm("#share-new", () => {
  const share = { name: $("#share-name").value.trim(), dataset: $("#share-dataset").value.trim() };
  if ($("#share-webdav").value.trim()) share.webdav = { users: parseUsers($("#share-webdav").value) };
  if ($("#share-smb").value.trim()) share.smb = { users: parseUsers($("#share-smb").value) };
  return act("share.add", { share });
});
onForm("#user-new", async () => {
  const name = $("#new-user").value.trim();
  const r = await act("user.add", { name, password: $("#new-user-password").value });
  if (r !== undefined && $("#new-user-admin").checked) return act("user.admin", { name, admin: true });
  return r;
});
onForm("#alert-new", () => act("alert.add", { alert: {
  name: $("#alert-name").value.trim(),
  target: { webhook: { url: $("#alert-url").value.trim() } },
  min_severity: $("#alert-severity").value,
} }));
$("#props-close").addEventListener("click", () => { $("#props").hidden = true; });
$("#chart-metric").addEventListener("change", refresh);
$("#chart-range").addEventListener("change", refresh);

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

// ---- Files: the shares of a logged-in user, or a share link's folder.

const CHUNK = 8 << 20;
// Rows of a listing shown at once, then added per frame.
const FIRST_ROWS = 400;
const MORE_ROWS = 4000;
let listing = 0;
// Made once: a formatter per call is what makes long lists slow.
const DATE = new Intl.DateTimeFormat(undefined, { dateStyle: "short", timeStyle: "short" });
const COLLATE = new Intl.Collator(undefined, { numeric: true });
const IMAGE = /\.(jpe?g|png)$/i;
let listView = false;
// Where the file calls go: a share of the user, or a link (/s/TOKEN).
let files = null; // {list(path), file(path), start, session(id), headers(), share, path, writable, link}

const enc = (path) => path.split("/").filter(Boolean).map(encodeURIComponent).join("/");
const join = (a, b) => (a ? a + "/" + b : b);

function userFiles(share) {
  return {
    share, path: "", writable: false, link: false,
    list: (p) => `/api/files/${encodeURIComponent(share)}/${enc(p)}?list`,
    file: (p) => `/api/files/${encodeURIComponent(share)}/${enc(p)}`,
    start: "/api/upload",
    session: (id) => `/api/upload/${id}`,
    headers: () => ({ "X-CSRF-Token": session ? session.csrf : "" }),
  };
}

function linkFiles(token) {
  return {
    share: null, path: "", writable: false, link: true,
    list: (p) => `/s/${token}/f/${enc(p)}?list`,
    file: (p) => `/s/${token}/f/${enc(p)}`,
    start: `/s/${token}/upload`,
    session: (id) => `/s/${token}/upload/${id}`,
    headers: () => ({}),
  };
}

async function call(url, opts) {
  const r = await fetch(url, Object.assign({ credentials: "same-origin" }, opts || {}));
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    const e = new Error((body.error && body.error.message) || r.statusText);
    e.status = r.status;
    e.code = body.error && body.error.code;
    throw e;
  }
  return body;
}

function post(url, body) {
  return call(url, {
    method: "POST",
    headers: Object.assign({ "Content-Type": "application/json" }, files.headers()),
    body: JSON.stringify(body),
  });
}

function filesError(e) {
  $("#files-error").textContent = e ? e.message || String(e) : "";
}

function crumbs() {
  const parts = files.path.split("/").filter(Boolean);
  const top = files.link ? files.name : files.share;
  const out = [el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); openFolder(""); } }, top)];
  parts.forEach((p, i) => {
    const to = parts.slice(0, i + 1).join("/");
    out.push(" / ", el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); openFolder(to); } }, p));
  });
  $("#crumbs").replaceChildren(...out);
}

async function openFolder(path) {
  // A newer listing stops an older one (its answer and its filling).
  const gen = ++listing;
  files.path = path;
  filesError(null);
  crumbs();
  $("#zip-link").href = files.file(path) + "?zip";
  $("#versions").hidden = true;
  if (files.upload) {
    $("#listing").replaceChildren();
    return;
  }
  let body;
  try {
    body = await call(files.list(path));
  } catch (e) {
    filesError(e);
    return;
  }
  if (gen !== listing) return;
  files.writable = body.writable;
  $("#new-folder").hidden = !files.writable;
  $("#upload-label").hidden = !(files.writable || files.upload);
  $("#drop").hidden = !(files.writable || files.upload);
  const entries = body.entries.sort((a, b) =>
    (a.kind === "dir") === (b.kind === "dir") ? COLLATE.compare(a.name, b.name) : a.kind === "dir" ? -1 : 1);
  // Photos show as a grid of server-made thumbnails (never the
  // originals); the rest, and everything in list view, as rows.
  const images = entries.filter((e) => e.kind === "file" && IMAGE.test(e.name));
  const grid = images.length > 0 && !listView;
  $("#view-toggle").hidden = images.length === 0;
  $("#view-toggle").textContent = listView ? "Show photos as a grid" : "Show as a list";
  const tiles = document.createDocumentFragment();
  if (grid) {
    for (const e of images) {
      const p = join(path, e.name);
      tiles.append(el("a", { class: "tile", href: files.file(p), target: "_blank", rel: "noopener", title: e.name },
        el("img", { loading: "lazy", alt: e.name, src: files.file(p) + `?thumb&v=${e.mtime}-${e.ctime}-${e.size}` })));
    }
  }
  $("#grid").replaceChildren(tiles);
  $("#grid").hidden = !grid;
  // Thousands of rows: plain DOM calls, one formatter, one click
  // handler for the whole list (below), and rows the browser lays out
  // only when they scroll into view (content-visibility in app.css).
  const rows = document.createDocumentFragment();
  const cell = (row, text, cls) => {
    const c = document.createElement("span");
    c.textContent = text;
    if (cls) c.className = cls;
    row.appendChild(c);
    return c;
  };
  const act = (box, tag, label, what, href) => {
    const b = document.createElement(tag);
    b.textContent = label;
    b.dataset.act = what;
    if (tag === "a") { b.className = "button"; b.href = href; } else { b.type = "button"; }
    box.append(b, " ");
  };
  const build = (e) => {
    const p = join(path, e.name);
    const row = document.createElement("div");
    row.className = "row";
    row.setAttribute("role", "row");
    row.dataset.name = e.name;
    row.dataset.kind = e.kind;
    const name = cell(row, "", "name");
    if (e.bad_name) {
      // Its real name is not text: reachable over SMB, NFS or WebDAV.
      name.textContent = e.name + " (name not shown exactly)";
    } else if (e.kind === "dir") {
      const a = document.createElement("a");
      a.href = "#";
      a.dataset.act = "open";
      a.textContent = e.name + "/";
      name.appendChild(a);
    } else if (e.kind === "file") {
      const a = document.createElement("a");
      a.href = files.file(p);
      a.target = "_blank";
      a.rel = "noopener";
      a.textContent = e.name;
      name.appendChild(a);
    } else {
      name.textContent = e.name + (e.kind === "link" ? " (link)" : "");
    }
    cell(row, e.kind === "dir" ? "" : size(e.size), "size");
    cell(row, DATE.format(new Date(e.mtime * 1000)), "date");
    const actions = cell(row, "", "acts");
    if (!e.bad_name) {
      if (e.kind === "file") act(actions, "a", "Download", "download", files.file(p) + "?download");
      if (!files.link && (e.kind === "file" || e.kind === "dir")) act(actions, "button", "Versions", "versions");
      if (files.writable) {
        act(actions, "button", "Rename", "rename");
        act(actions, "button", "Delete", "delete");
      }
    }
    return row;
  };
  const shown = entries.filter((e) => !(grid && e.kind === "file" && IMAGE.test(e.name)));
  if (shown.length === 0) {
    $("#listing").replaceChildren(grid ? "" : el("p", { class: "muted" }, "This folder is empty."));
    return;
  }
  const head = el("div", { class: "row head" }, el("span", {}, "name"), el("span", { class: "size" }, "size"),
    el("span", { class: "date" }, "modified"), el("span", {}));
  head.setAttribute("role", "row");
  // The first screens at once, the rest a few thousand rows per frame:
  // a big folder shows immediately and the page stays responsive.
  for (const e of shown.slice(0, FIRST_ROWS)) rows.appendChild(build(e));
  $("#listing").replaceChildren(head, rows);
  let next = FIRST_ROWS;
  const more = () => {
    if (gen !== listing || next >= shown.length) return;
    const part = document.createDocumentFragment();
    for (const e of shown.slice(next, next + MORE_ROWS)) part.appendChild(build(e));
    $("#listing").appendChild(part);
    next += MORE_ROWS;
    requestAnimationFrame(more);
  };
  requestAnimationFrame(more);
}

// One handler for every row's links and buttons.
$("#listing").addEventListener("click", (ev) => {
  const t = ev.target.closest("[data-act]");
  const tr = t && t.closest(".row");
  if (!tr || t.dataset.act === "download") return;
  ev.preventDefault();
  const p = join(files.path, tr.dataset.name);
  const kind = tr.dataset.kind;
  if (t.dataset.act === "open") openFolder(p);
  else if (t.dataset.act === "versions") showVersions(p, kind);
  else if (t.dataset.act === "rename") renameEntry(p);
  else if (t.dataset.act === "delete") deleteEntry(p, kind);
});

async function renameEntry(p) {
  const to = prompt("New name or path (inside this share):", p);
  if (!to || to === p) return;
  try {
    await post("/api/files-op", { op: "rename", share: files.share, path: p, to });
    openFolder(files.path);
  } catch (e) { filesError(e); }
}

async function deleteEntry(p, kind) {
  if (!confirm(`Delete ${p}${kind === "dir" ? " and everything in it" : ""}?`)) return;
  try {
    await post("/api/files-op", { op: "delete", share: files.share, path: p });
    openFolder(files.path);
  } catch (e) { filesError(e); }
}

async function showVersions(p, kind) {
  let list;
  try {
    list = await call(files.file(p) + "?versions");
  } catch (e) { filesError(e); return; }
  $("#versions-title").textContent = `Previous versions of ${p}`;
  const rows = [];
  let prev = null;
  for (const v of list) {
    // Snapshots that hold the same version show it once.
    const key = kind === "file" ? `${v.size}/${v.mtime}` : v.snapshot;
    if (key === prev) continue;
    prev = key;
    const restore = files.writable ? el("button", { class: "restore", onclick: async () => {
      if (!confirm(`Put back ${p} as it was in ${v.snapshot}? What is there now is kept in a new snapshot.`)) return;
      try {
        await post("/api/files-op", { op: "restore", share: files.share, path: p, snapshot: v.snapshot });
        $("#versions").hidden = true;
        openFolder(files.path);
      } catch (e) { filesError(e); }
    } }, "Restore") : "";
    rows.push([new Date(v.time * 1000).toLocaleString(), v.snapshot,
      kind === "file" ? size(v.size) : "", new Date(v.mtime * 1000).toLocaleString(), restore]);
  }
  table($("#versions-table"), ["snapshot time", "snapshot", "size", "modified", ""], rows);
  if (rows.length === 0) $("#versions-table").replaceChildren(el("tr", {}, el("td", {}, "no snapshot holds it")));
  $("#versions").hidden = false;
}

// One file: start a session, send chunks, and after a dropped connection
// ask where the server stands and go on from there.
async function upload(file) {
  const item = el("li", {}, `${file.name}: starting`);
  $("#uploads").append(item);
  const dir = files.path;
  try {
    const start = (replace) => post(files.start, { share: files.share, path: dir, name: file.name,
      size: file.size, replace });
    let s;
    try {
      s = await start(false);
    } catch (e) {
      if (e.code !== "exists" || files.link || !confirm(`Replace ${file.name}?`)) throw e;
      s = await start(true);
    }
    let offset = 0;
    let failures = 0;
    let replaceNow = false;
    // Where the server stands after a chunk failed, asked again and again
    // (with growing pauses, 20 at most in a row) while the network is down
    // or a cut chunk is still arriving there (its connection not noticed
    // as gone yet): the answer has no chunk in progress.
    const status = async (cause) => {
      for (;;) {
        if (++failures > 20) throw cause;
        await new Promise((ok) => setTimeout(ok, Math.min(10000, 500 * failures)));
        try {
          const r = await call(files.session(s.id), { headers: files.headers() });
          if (!r.busy) return r;
        } catch (e) {
          if (e.status && e.status < 500) throw e;
          cause = e;
        }
      }
    };
    for (;;) {
      // With every byte there (the offset at the size), an empty chunk
      // asks the server to put the file in place: again, if the name was
      // taken or the placing failed the time before.
      const end = Math.min(file.size, offset + CHUNK);
      let r;
      try {
        r = await call(files.session(s.id), {
          method: "PUT",
          headers: Object.assign({ "Content-Type": "application/octet-stream", "Upload-Offset": String(offset) },
            replaceNow ? { "Upload-Replace": "true" } : {}, files.headers()),
          body: file.slice(offset, end),
        });
        failures = 0;
      } catch (e) {
        if (e.code === "exists" && !files.link && !replaceNow) {
          // Every byte is there but the name was taken meanwhile.
          if (!confirm(`${file.name} appeared meanwhile. Replace it?`)) throw e;
          replaceNow = true;
        } else {
          // Worth another try: a lost connection, a server error, a chunk
          // cut short or sent at a stale offset, a chunk still arriving.
          // Anything else (a refused placing among them) is final.
          const again = !e.status || e.status >= 500 || e.code === "offset" || e.code === "busy"
            || (e.status === 400 && offset < file.size);
          if (!again) throw e;
        }
        r = await status(e);
      }
      offset = r.offset;
      item.textContent = `${file.name}: ${Math.floor((100 * offset) / Math.max(1, file.size))} %`;
      if (r.done) { item.textContent = r.name ? `${file.name}: uploaded as ${r.name}` : `${file.name}: uploaded`; break; }
    }
  } catch (e) {
    item.textContent = `${file.name}: ${e.message}`;
    item.className = "error";
  }
  if (files.path === dir) openFolder(dir);
}

async function uploadAll(list) {
  for (const f of list) await upload(f);
}

$("#upload-input").addEventListener("change", (ev) => {
  uploadAll(Array.from(ev.target.files));
  ev.target.value = "";
});
const drop = $("#drop");
drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (ev) => {
  ev.preventDefault();
  drop.classList.remove("over");
  uploadAll(Array.from(ev.dataTransfer.files));
});

$("#new-folder").addEventListener("click", async () => {
  const name = prompt("Name of the new folder:");
  if (!name) return;
  try {
    await post("/api/files-op", { op: "mkdir", share: files.share, path: join(files.path, name) });
    openFolder(files.path);
  } catch (e) { filesError(e); }
});
$("#view-toggle").addEventListener("click", () => { listView = !listView; openFolder(files.path); });
$("#versions-close").addEventListener("click", () => { $("#versions").hidden = true; });
$("#link-button").addEventListener("click", () => { $("#link-form").hidden = !$("#link-form").hidden; });
$("#link-make").addEventListener("click", async () => {
  const upload = document.querySelector("input[name=link-mode]:checked").value === "upload";
  const params = { share: files.share, path: files.path, upload };
  if ($("#link-pw").value) params.password = $("#link-pw").value;
  if ($("#link-days").value) params.expires_in_secs = Number($("#link-days").value) * 86400;
  try {
    const made = await api("link.create", params);
    const url = `${location.origin}/s/${made.token}`;
    $("#link-out").replaceChildren("Send this address: ", el("a", { id: "link-url", href: url }, url));
    $("#link-pw").value = "";
  } catch (e) { filesError(e); }
});

async function showFiles() {
  let shares;
  try {
    shares = await call("/api/files");
  } catch (e) { filesError(e); return; }
  const pick = $("#share-pick");
  const current = files && !files.link ? files.share : null;
  pick.replaceChildren(...shares.map((s) => el("option", { value: s.name }, s.name)));
  if (shares.length === 0) {
    filesError(new Error("no shares of yours hold files"));
    return;
  }
  pick.value = current && shares.some((s) => s.name === current) ? current : shares[0].name;
  files = userFiles(pick.value);
  openFolder("");
}
$("#share-pick").addEventListener("change", () => { files = userFiles($("#share-pick").value); openFolder(""); });

function showTab(which) {
  $("#tab-dash").classList.toggle("on", which === "dash");
  $("#tab-files").classList.toggle("on", which === "files");
  $("#app").hidden = which !== "dash";
  $("#files-view").hidden = which !== "files";
  if (which === "files") showFiles();
}
$("#tab-dash").addEventListener("click", () => { history.replaceState(null, "", "#"); showTab("dash"); });
$("#tab-files").addEventListener("click", () => { history.replaceState(null, "", "#files"); showTab("files"); });

// A visitor through a share link: no login, the link's folder only.
async function showLink(token) {
  $("#logout").hidden = true;
  $("#link-button").hidden = true;
  $("#new-folder").hidden = true;
  let info;
  try {
    info = await call(`/s/${token}/info`);
  } catch (e) {
    $("#files-view").hidden = false;
    filesError(e);
    return;
  }
  $("#who").textContent = `shared folder ${info.name}`;
  if (!info.open) {
    $("#unlock").hidden = false;
    return;
  }
  $("#unlock").hidden = true;
  $("#files-view").hidden = false;
  files = linkFiles(token);
  files.upload = info.upload;
  files.name = info.name;
  $("#share-pick").hidden = true;
  $("#zip-link").hidden = info.upload;
  $("#upload-label").hidden = !info.upload;
  $("#drop").hidden = !info.upload;
  if (info.upload) $("#listing").replaceChildren();
  openFolder("");
}

$("#unlock").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const token = location.pathname.split("/")[2];
  try {
    await call(`/s/${token}/unlock`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ password: $("#link-password").value }),
    });
    showLink(token);
  } catch (e) {
    $("#unlock-error").textContent = e.message;
  }
});

(async () => {
  const m = location.pathname.match(/^\/s\/([0-9a-f]{64})\/?$/);
  if (m) {
    showLink(m[1]);
    return;
  }
  const r = await fetch("/api/session", { credentials: "same-origin" });
  if (r.ok) {
    session = await r.json();
    showApp();
  } else {
    showLogin();
  }
})();
