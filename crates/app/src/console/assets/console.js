// The operator console. No framework and no build step: this one module,
// served as is. The API key lives in sessionStorage only and travels in the
// Authorization header, never in a URL. Data is written with textContent
// only.

const KEY = "parlance.key";
const PRODUCT = "parlance.product";
const POLL_MS = 5000;

// Inbox groups, in the order an operator works through them.
const GROUPS = [
  { name: "Needs a person", states: ["NEEDS_HUMAN_INTERVENTION"], urgent: true },
  {
    name: "Active",
    states: ["CREATED", "ACTIVE", "WAITING_FOR_REPLY", "WAITING_FOR_AGENT", "HEARTBEAT_SCHEDULED"],
  },
  { name: "Queued", states: ["QUEUED"] },
  { name: "Paused", states: ["PAUSED"] },
  { name: "Finished", states: ["COMPLETED", "ABANDONED", "FAILED"] },
];
const FINISHED = new Set(["COMPLETED", "ABANDONED", "FAILED"]);

const $ = (id) => document.getElementById(id);
let timer = null;

class Unauthorized extends Error {}

function session() {
  const key = sessionStorage.getItem(KEY);
  const product = sessionStorage.getItem(PRODUCT);
  return key && product ? { key, product } : null;
}

function signOut() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(PRODUCT);
}

// Calls the API with `key`; a problem answer becomes an Error carrying its
// title and detail, a 401 an Unauthorized. `headers` are added to the
// request; the answer is `{status, data, etag}`, `data` null on a 304.
async function call(key, method, path, body, headers = {}) {
  const init = { method, headers: { Authorization: `Bearer ${key}`, ...headers } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 401) {
    throw new Unauthorized("wrong key");
  }
  if (res.status === 304) {
    return { status: 304, data: null, etag: res.headers.get("ETag") };
  }
  let data = null;
  try {
    data = await res.json();
  } catch {
    data = null;
  }
  if (!res.ok) {
    const title = (data && data.title) || res.statusText || `HTTP ${res.status}`;
    const detail = data && data.detail ? `: ${data.detail}` : "";
    throw new Error(`${title}${detail}`);
  }
  return { status: res.status, data, etag: res.headers.get("ETag") };
}

// Calls the API with the session's key; a 401 ends the session.
async function api(method, path, body) {
  const s = session();
  if (!s) {
    throw new Unauthorized("signed out");
  }
  return (await call(s.key, method, path, body)).data;
}

// The last answer to each GET the open page asks again (its tag and its
// data): asked again with `If-None-Match`, an unchanged answer is a 304
// with no body.
const tagged = new Map();

// GETs `path` for a page that polls: `{data, changed}`, `changed` false
// when the answer is the one already shown.
async function poll(path) {
  const s = session();
  if (!s) {
    throw new Unauthorized("signed out");
  }
  const last = tagged.get(path);
  const headers = last ? { "If-None-Match": last.etag } : {};
  const answer = await call(s.key, "GET", path, undefined, headers);
  if (answer.status === 304 && last) {
    return { data: last.data, changed: false };
  }
  if (answer.etag) {
    tagged.set(path, { etag: answer.etag, data: answer.data });
  }
  return { data: answer.data, changed: true };
}

// Marks the first time each page shown shows its data: a `rendered`
// performance mark naming the page, which the console's benchmark reads
// (`cargo xtask bench console`).
let renderedMarked = false;

function rendered(page) {
  if (!renderedMarked) {
    renderedMarked = true;
    performance.mark("rendered", { detail: page });
  }
}

function productPath(rest) {
  return `/v1/products/${encodeURIComponent(session().product)}${rest}`;
}

// A time as the API gives it (seconds since the epoch) in UTC, to the
// second: `2026-12-05 03:12:03 UTC`.
function when(t) {
  if (typeof t !== "number" || !Number.isFinite(t)) {
    return t === null || t === undefined ? "—" : String(t);
  }
  return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) {
    node.textContent = String(text);
  }
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, v);
  }
  return node;
}

function showError(id, err) {
  const node = $(id);
  if (err) {
    node.textContent = err.message;
    node.hidden = false;
  } else {
    node.textContent = "";
    node.hidden = true;
  }
}

// Any call that answers 401 sends the operator back to the sign-in page.
function failed(errorId) {
  return (err) => {
    if (err instanceof Unauthorized) {
      signOut();
      route();
    } else {
      showError(errorId, err);
    }
  };
}

function showOnly(id) {
  for (const section of ["sign-in", "inbox", "conversation", "entity", "flows"]) {
    $(section).hidden = section !== id;
  }
  const s = session();
  $("product").textContent = s ? `product ${s.product}` : "";
  $("sign-out").hidden = !s;
  $("nav").hidden = !s;
}

function navigate(path) {
  history.pushState(null, "", path);
  route();
}

function route() {
  if (timer) {
    clearInterval(timer);
    timer = null;
  }
  tagged.clear();
  renderedMarked = false;
  if (!session()) {
    showOnly("sign-in");
    $("key").focus();
    rendered("sign-in");
    return;
  }
  const page = location.pathname.match(
    /^\/console\/(sessions|adoption|flow-sessions|threads)(?:\/([^/]+))?(?:\/([^/]+))?\/?$/,
  );
  if (page) {
    showOnly("entity");
    showEntity(page[1], page.slice(2).filter(Boolean).map(decodeURIComponent));
    return;
  }
  if (/^\/console\/flows\/?$/.test(location.pathname)) {
    showOnly("flows");
    loadFlows();
    return;
  }
  const m = location.pathname.match(/^\/console\/conversations\/([^/]+)\/?$/);
  if (m) {
    const id = decodeURIComponent(m[1]);
    showOnly("conversation");
    loadConversation(id);
    timer = setInterval(() => loadConversation(id), POLL_MS);
  } else {
    showOnly("inbox");
    loadInbox();
    timer = setInterval(loadInbox, POLL_MS);
  }
}

// Sign-in: the key is kept only once the API has accepted it.
async function signIn(event) {
  event.preventDefault();
  performance.mark("sign-in");
  const key = $("key").value.trim();
  showError("sign-in-error", null);
  try {
    const me = (await call(key, "GET", "/v1/me")).data;
    sessionStorage.setItem(KEY, key);
    sessionStorage.setItem(PRODUCT, me.product_id);
    $("key").value = "";
    route();
  } catch (err) {
    signOut();
    showError("sign-in-error", err instanceof Unauthorized ? new Error("Wrong key") : err);
  }
}

// Inbox: each group asked for on its own, newest first, a page at a time,
// so the conversations that need a person are shown however many others
// there are.

const PAGE = 20;
// Each group's conversations shown and where its next page starts.
let inbox = new Map();

function inboxQuery(group, extra = {}) {
  const params = new URLSearchParams();
  const state = $("filter-state").value;
  const contact = $("filter-contact").value.trim();
  params.set("state", (state ? [state] : group.states).join(","));
  params.set("order", "newest");
  if (contact) params.set("contact_id", contact);
  for (const [k, v] of Object.entries(extra)) params.set(k, String(v));
  return `?${params.toString()}`;
}

// The groups the state filter leaves.
function shownGroups() {
  const state = $("filter-state").value;
  return GROUPS.filter((g) => !state || g.states.includes(state));
}

// Asks every shown group again for as many conversations as it shows (a
// page at first); a group whose answer did not change is left as it is.
function loadInbox() {
  const groups = shownGroups();
  Promise.all(
    groups.map((g) => {
      const shown = inbox.get(g.name);
      const limit = Math.max(PAGE, shown ? shown.items.length : 0);
      return poll(productPath(`/conversations${inboxQuery(g, { limit })}`));
    }),
  )
    .then((answers) => {
      showError("inbox-error", null);
      const names = groups.map((g) => g.name).join();
      const regrouped = names !== $("groups").dataset.groups;
      groups.forEach((g, i) => {
        const { data, changed } = answers[i];
        if (changed || regrouped || !inbox.has(g.name)) {
          inbox.set(g.name, { items: data.items || [], next: data.next_cursor || null });
        }
      });
      if (regrouped || answers.some((a) => a.changed)) {
        renderInbox(groups);
      }
      rendered("inbox");
    })
    .catch(failed("inbox-error"));
}

// The group's next page, added below what it shows.
function moreOf(group) {
  const shown = inbox.get(group.name);
  if (!shown || !shown.next) return;
  const query = inboxQuery(group, { limit: PAGE, after: shown.next });
  api("GET", productPath(`/conversations${query}`))
    .then((page) => {
      shown.items = shown.items.concat(page.items || []);
      shown.next = page.next_cursor || null;
      renderInbox(shownGroups());
    })
    .catch(failed("inbox-error"));
}

function renderInbox(groups) {
  const box = $("groups");
  box.replaceChildren();
  box.dataset.groups = groups.map((g) => g.name).join();
  for (const group of groups) {
    const { items, next } = inbox.get(group.name) || { items: [], next: null };
    const section = el("section", null, {
      class: group.urgent ? "group urgent" : "group",
      "data-test": `group-${group.states[0].toLowerCase()}`,
    });
    section.append(el("h2", `${group.name} (${items.length}${next ? "+" : ""})`));
    const rows = el("ul", null, { class: "rows" });
    for (const c of items) {
      const li = el("li", null, { "data-test": "conversation-row" });
      const link = el("a", c.contact_id, {
        href: `/console/conversations/${encodeURIComponent(c.instance_id)}`,
        "data-link": "",
        "data-test": "conversation-link",
      });
      li.append(link, " ", el("span", c.state, { class: "state" }), " ", c.objective);
      rows.append(li);
    }
    section.append(rows);
    if (next) {
      const more = el("button", "More", { type: "button", class: "more", "data-test": "more" });
      more.addEventListener("click", () => moreOf(group));
      section.append(more);
    }
    box.append(section);
  }
}

// Conversation page.

function conversationPath(id, rest = "") {
  return productPath(`/conversations/${encodeURIComponent(id)}${rest}`);
}

let current = null;

// Asks for the conversation and its history again; the page is drawn
// again only when one of them changed, so what the operator is typing or
// reading stays as it is.
function loadConversation(id) {
  Promise.all([poll(conversationPath(id)), poll(conversationPath(id, "/audit"))])
    .then(([view, audit]) => {
      showError("conv-error", null);
      const fresh = current !== id;
      current = id;
      if (fresh || view.changed || audit.changed) {
        renderConversation(view.data, audit.data.items || []);
      }
      rendered("conversation");
    })
    .catch(failed("conv-error"));
}

function renderConversation(view, audit) {
  const c = view.conversation;
  $("conv-id").textContent = c.instance_id;
  $("conv-state").textContent = c.state;
  $("conv-contact").textContent = c.contact_id;
  $("conv-objective").textContent = c.objective;
  $("conv-follow-ups").textContent = `${c.follow_ups_sent} of ${c.max_follow_ups}`;
  $("conv-due").textContent = when(c.heartbeat_due_at);
  $("conv-human-reason").textContent = c.human_reason || "—";

  // Only the commands the state allows are offered; the API still decides.
  const needsPerson = c.state === "NEEDS_HUMAN_INTERVENTION";
  const finished = FINISHED.has(c.state);
  const show = {
    "resume-agent": needsPerson,
    pause: !finished && c.state !== "PAUSED",
    resume: c.state === "PAUSED",
    cancel: !finished,
  };
  for (const [action, visible] of Object.entries(show)) {
    document.querySelector(`[data-action="${action}"]`).hidden = !visible;
  }
  $("send-form").hidden = !(needsPerson || ["WAITING_FOR_REPLY", "HEARTBEAT_SCHEDULED"].includes(c.state));

  const transcript = $("transcript");
  transcript.replaceChildren();
  for (const m of view.transcript || []) {
    const li = el("li", null, { class: m.role, "data-test": "message" });
    li.append(el("span", m.role, { class: "who" }), el("span", when(m.at), { class: "when" }));
    li.append(el("div", m.text));
    transcript.append(li);
  }

  const rows = $("audit");
  rows.replaceChildren();
  for (const r of audit) {
    const tr = el("tr", null, { "data-test": "audit-row" });
    for (const cell of [r.seq, when(r.at), r.from || "—", r.to, r.cause]) {
      tr.append(el("td", cell));
    }
    rows.append(tr);
  }
}

// "Resume agent" hands a conversation that needs a person back to the
// agent; "Resume" ends a pause. Both are the API's `resume`.
const COMMANDS = {
  "resume-agent": "/resume",
  pause: "/pause",
  resume: "/resume",
  cancel: "/cancel",
};

function command(action) {
  if (!current) return;
  const id = current;
  api("POST", conversationPath(id, COMMANDS[action]))
    .then(() => loadConversation(id))
    .catch(failed("conv-error"));
}

function sendAsPerson(event) {
  event.preventDefault();
  if (!current) return;
  const id = current;
  const text = $("send-text").value;
  api("POST", conversationPath(id, "/send"), { text })
    .then(() => {
      $("send-text").value = "";
      loadConversation(id);
    })
    .catch(failed("conv-error"));
}

function init() {
  const select = $("filter-state");
  for (const group of GROUPS) {
    for (const state of group.states) {
      select.append(el("option", state, { value: state }));
    }
  }
  $("sign-in-form").addEventListener("submit", signIn);
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    inbox = new Map();
    tagged.clear();
    loadInbox();
  });
  $("send-form").addEventListener("submit", sendAsPerson);
  $("entity-form").addEventListener("submit", openEntity);
  for (const button of document.querySelectorAll("[data-action]")) {
    button.addEventListener("click", () => command(button.dataset.action));
  }
  $("sign-out").addEventListener("click", () => {
    signOut();
    navigate("/console");
  });
  document.addEventListener("click", (event) => {
    const link = event.target.closest("a[data-link]");
    if (link && !event.metaKey && !event.ctrlKey && !event.shiftKey) {
      event.preventDefault();
      navigate(link.getAttribute("href"));
    }
  });
  window.addEventListener("popstate", route);
  route();
}

// ---- read-only pages: one entity each, its state on its machine's diagram --

const SVG = "http://www.w3.org/2000/svg";
let machinesCache = null;

// The machines' diagrams, from the product's code (no key needed).
async function machines() {
  if (!machinesCache) {
    const res = await fetch("/console/machines.json");
    if (!res.ok) {
      throw new Error(`machines: HTTP ${res.status}`);
    }
    const data = await res.json();
    machinesCache = Object.fromEntries(data.machines.map((m) => [m.name, m]));
  }
  return machinesCache;
}

// A loaded flow's diagram, in the machines' form.
function flowMachine(flow) {
  const states = flow.states.map((s) => s.id);
  const leaves = new Set(flow.transitions.map((t) => t.from));
  return {
    name: flow.name,
    title: `flow ${flow.name}`,
    initial: flow.initial || states[0],
    states,
    terminal: states.filter((s) => !leaves.has(s)),
    edges: flow.transitions.map((t) => ({ from: t.from, to: t.to, cause: t.event })),
  };
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  if (text !== undefined) {
    node.textContent = String(text);
  }
  return node;
}

// Layered layout: one row per BFS depth from the initial state; states not
// reached go in a last row. Edges sharing endpoints share one label.
function layout(machine) {
  const depth = new Map([[machine.initial, 0]]);
  const queue = [machine.initial];
  while (queue.length) {
    const at = queue.shift();
    for (const e of machine.edges) {
      if (e.from === at && !depth.has(e.to)) {
        depth.set(e.to, depth.get(at) + 1);
        queue.push(e.to);
      }
    }
  }
  const last = Math.max(0, ...depth.values()) + 1;
  const rows = [];
  for (const s of machine.states) {
    const d = depth.has(s) ? depth.get(s) : last;
    (rows[d] = rows[d] || []).push(s);
  }
  return rows.filter(Boolean);
}

const BOX_W = 150;
const BOX_H = 30;
const GAP_X = 40;
const ROW_H = 90;

function drawMachine(machine, current) {
  const rows = layout(machine);
  const widest = Math.max(...rows.map((r) => r.length));
  const width = widest * (BOX_W + GAP_X) + GAP_X;
  const height = rows.length * ROW_H + 20;
  const at = new Map();
  rows.forEach((row, r) => {
    const offset = (width - row.length * (BOX_W + GAP_X) + GAP_X) / 2;
    row.forEach((s, i) => {
      at.set(s, { x: offset + i * (BOX_W + GAP_X), y: 20 + r * ROW_H });
    });
  });
  const root = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    role: "img",
    "data-test": "diagram",
    "data-machine": machine.name,
  });
  root.append(svg("title", {}, machine.title));
  const defs = svg("defs");
  const marker = svg("marker", {
    id: `arrow-${machine.name}`,
    viewBox: "0 0 10 10",
    refX: 10,
    refY: 5,
    markerWidth: 7,
    markerHeight: 7,
    orient: "auto-start-reverse",
  });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }));
  defs.append(marker);
  root.append(defs);

  const merged = new Map();
  for (const e of machine.edges) {
    const k = `${e.from}\u0000${e.to}`;
    if (!merged.has(k)) {
      merged.set(k, { from: e.from, to: e.to, causes: [] });
    }
    if (e.cause && !merged.get(k).causes.includes(e.cause)) {
      merged.get(k).causes.push(e.cause);
    }
  }
  const edges = svg("g", { class: "edges" });
  for (const e of merged.values()) {
    const a = at.get(e.from);
    const b = at.get(e.to);
    if (!a || !b) {
      continue;
    }
    let d;
    let lx;
    let ly;
    if (e.from === e.to) {
      const x = a.x + BOX_W;
      const y = a.y + BOX_H / 2;
      d = `M ${x} ${y - 8} C ${x + 40} ${y - 30}, ${x + 40} ${y + 30}, ${x} ${y + 8}`;
      lx = x + 34;
      ly = y;
    } else {
      const down = b.y >= a.y;
      const x1 = a.x + BOX_W / 2;
      const y1 = down && b.y > a.y ? a.y + BOX_H : a.y;
      const x2 = b.x + BOX_W / 2;
      const y2 = down && b.y > a.y ? b.y : b.y + BOX_H;
      // Edges within a row or going back bend aside so they stay visible.
      const bend = b.y > a.y ? 0 : 70;
      const cx = (x1 + x2) / 2 + bend;
      const cy = (y1 + y2) / 2 + (b.y === a.y ? -40 : 0);
      d = `M ${x1} ${y1} Q ${cx} ${cy} ${x2} ${y2}`;
      lx = (x1 + 2 * cx + x2) / 4;
      // Labels of edges going back sit lower, clear of those going forward.
      ly = (y1 + 2 * cy + y2) / 4 + (b.y < a.y ? 16 : 0);
    }
    const active = current && e.from === current;
    edges.append(
      svg("path", {
        d,
        class: active ? "edge from-current" : "edge",
        "marker-end": `url(#arrow-${machine.name})`,
      }),
    );
    if (e.causes.length) {
      edges.append(svg("text", { x: lx, y: ly, class: "edge-label" }, e.causes.join(", ")));
    }
  }
  root.append(edges);

  const nodes = svg("g", { class: "states" });
  for (const [s, p] of at) {
    const classes = ["state-box"];
    if (s === machine.initial) {
      classes.push("initial");
    }
    if ((machine.terminal || []).includes(s)) {
      classes.push("terminal");
    }
    if (s === current) {
      classes.push("current");
    }
    const g = svg("g", { class: classes.join(" "), "data-state": s });
    if (s === current) {
      g.setAttribute("data-test", "current-state");
    }
    g.append(svg("rect", { x: p.x, y: p.y, width: BOX_W, height: BOX_H, rx: 6 }));
    g.append(svg("text", { x: p.x + BOX_W / 2, y: p.y + BOX_H / 2 + 4 }, s));
    nodes.append(g);
  }
  root.append(nodes);
  return root;
}

// The pages: how an entity is looked up, where its state is, its audit
// trail (the machine's transitions) and, for some, a history of their own.
const PAGES = {
  sessions: {
    title: "Session",
    idLabel: "Session id",
    machine: () => "session",
    async load([id]) {
      const base = productPath(`/sessions/${encodeURIComponent(id)}`);
      const [view, audit] = await Promise.all([api("GET", base), api("GET", `${base}/audit`)]);
      return {
        state: view.snapshot.current_state,
        version: view.version,
        fields: view.snapshot,
        audit: audit.records,
      };
    },
  },
  adoption: {
    title: "Adoption",
    idLabel: "User id",
    machine: () => "adoption",
    async load([id]) {
      const base = productPath(`/users/${encodeURIComponent(id)}/adoption`);
      const [record, audit] = await Promise.all([api("GET", base), api("GET", `${base}/audit`)]);
      const sessions = (record.state.sessions && record.state.sessions.index) || [];
      return {
        state: record.state.journey_state,
        version: record.version,
        fields: record.state,
        audit: audit.records,
        historyTitle: "Sessions",
        history: sessions.map((s) => [
          s.session_number,
          s.session_id,
          when(s.started_at),
          when(s.captured_at),
        ]),
        columns: ["#", "Session", "Started", "Captured"],
      };
    },
  },
  "flow-sessions": {
    title: "Flow session",
    idLabel: "Session id",
    flow: true,
    machine: (args) => `flow:${args[0]}`,
    async load([flow, id]) {
      const base = `/v1/ai/${encodeURIComponent(flow)}`;
      const [answer, audit] = await Promise.all([
        api("GET", `${base}/model/${encodeURIComponent(id)}`),
        api("GET", `${base}/audit/${encodeURIComponent(id)}`),
      ]);
      let response = {};
      try {
        response = JSON.parse(answer.response || "{}") || {};
      } catch {
        response = {};
      }
      const dialogue = Array.isArray(response.dialogue) ? response.dialogue : [];
      return {
        state: response.state_name,
        version: typeof response.version === "number" ? response.version : null,
        fields: { ...response, dialogue: undefined, next_actions: answer.next_actions },
        audit: audit.records,
        historyTitle: "Dialogue",
        history: dialogue.map((d, i) => [i + 1, d.actor || "", d.event || "", text(d)]),
        columns: ["#", "Who", "Event", "What"],
      };
    },
  },
  threads: {
    title: "Agent thread",
    idLabel: "Thread id",
    owner: true,
    machine: () => "turn",
    async load([id]) {
      const base = productPath(`/agent/threads/${encodeURIComponent(id)}`);
      const owner = new URLSearchParams(location.search).get("owner");
      const query = owner ? `?user_id=${encodeURIComponent(owner)}` : "";
      const [thread, history] = await Promise.all([
        api("GET", `${base}${query}`),
        api("GET", `${base}/history${query}`),
      ]);
      const diagnostics = (thread.state && thread.state.diagnostics) || {};
      return {
        // The reply stage the last turn was dispatched to.
        state: diagnostics.dispatch || null,
        version: thread.version,
        fields: { owner: thread.owner, interrupt: thread.interrupt, ...thread.state },
        // A thread's trail is its checkpoints.
        audit: null,
        historyTitle: "Checkpoints",
        history: history.checkpoints.map((c) => [
          c.version,
          when(c.at),
          c.source,
          c.interrupted ? "yes" : "",
        ]),
        columns: ["Version", "At", "Source", "Interrupted"],
      };
    },
  },
};

// A table's body, one row of cells each.
function fillRows(body, rows) {
  body.replaceChildren();
  for (const cells of rows) {
    const row = el("tr");
    for (const c of cells) {
      row.append(el("td", c));
    }
    body.append(row);
  }
}

function auditRow(r) {
  return [r.seq, when(r.at), r.from || "", r.to, r.cause];
}

function text(value) {
  if (value === null || value === undefined) {
    return "";
  }
  if (typeof value === "object") {
    return value.actor_text || value.content || value.text || JSON.stringify(value);
  }
  return String(value);
}

// The loaded flows, asked for once per page load; concurrent callers share
// the one request.
let flowsCache = null;

function loadedFlows() {
  if (!flowsCache) {
    flowsCache = api("GET", productPath("/flows")).then(
      (list) => list.flows,
      (err) => {
        flowsCache = null;
        throw err;
      },
    );
  }
  return flowsCache;
}

async function diagramFor(name) {
  if (name.startsWith("flow:")) {
    const flow = (await loadedFlows()).find((f) => f.name === name.slice(5));
    return flow ? flowMachine(flow) : null;
  }
  return (await machines())[name] || null;
}

function showEntity(kind, args) {
  const page = PAGES[kind];
  $("entity").dataset.page = kind;
  $("entity-title").textContent = page.title;
  $("entity-id-label").textContent = page.idLabel;
  $("entity-flow-label").hidden = !page.flow;
  $("entity-owner-label").hidden = !page.owner;
  $("entity-owner").value = new URLSearchParams(location.search).get("owner") || "";
  showError("entity-error", null);
  const id = page.flow ? args[1] : args[0];
  $("entity-id").value = id || "";
  $("entity-body").hidden = true;
  // The flow list and the entity are asked for at once.
  const choice = page.flow ? fillFlowChoice(args[0]) : Promise.resolve();
  const entity = id ? loadEntity(page, args) : Promise.resolve();
  Promise.all([choice, entity])
    .then(() => {
      if (!id) {
        $("entity-id").focus();
      }
      rendered(kind);
    })
    .catch(failed("entity-error"));
}

async function fillFlowChoice(selected) {
  const select = $("entity-flow");
  select.replaceChildren();
  for (const f of await loadedFlows()) {
    select.append(el("option", f.name, { value: f.name }));
  }
  if (selected) {
    select.value = selected;
  }
}

async function loadEntity(page, args) {
  const [data, machine] = await Promise.all([page.load(args), diagramFor(page.machine(args))]);
  $("entity-state").textContent = data.state || "—";
  $("entity-version").textContent = data.version === null ? "—" : String(data.version);
  const diagram = $("entity-diagram");
  diagram.replaceChildren();
  if (machine) {
    diagram.append(drawMachine(machine, data.state));
  }
  const fields = $("entity-fields");
  fields.replaceChildren();
  for (const [k, v] of Object.entries(data.fields || {})) {
    if (v === undefined) {
      continue;
    }
    const row = el("tr");
    row.append(el("th", k));
    const cell = el("td");
    cell.append(el("code", typeof v === "string" ? v : JSON.stringify(v)));
    row.append(cell);
    fields.append(row);
  }
  $("entity-audit-box").hidden = !data.audit;
  fillRows($("entity-audit"), (data.audit || []).map(auditRow));
  $("entity-history-box").hidden = !data.history;
  if (data.history) {
    $("entity-history-title").textContent = data.historyTitle;
    const head = el("tr");
    for (const c of data.columns) {
      head.append(el("th", c));
    }
    $("entity-history-head").replaceChildren(head);
    fillRows($("entity-history"), data.history);
  }
  $("entity-body").hidden = false;
}

function openEntity(event) {
  event.preventDefault();
  const kind = $("entity").dataset.page;
  const id = $("entity-id").value.trim();
  if (!id) {
    return;
  }
  const parts = PAGES[kind].flow ? [$("entity-flow").value, id] : [id];
  const owner = $("entity-owner").value.trim();
  const query = PAGES[kind].owner && owner ? `?owner=${encodeURIComponent(owner)}` : "";
  navigate(`/console/${kind}/${parts.map(encodeURIComponent).join("/")}${query}`);
}

function loadFlows() {
  showError("flows-error", null);
  loadedFlows()
    .then((flows) => {
      const list = $("flow-list");
      list.replaceChildren();
      for (const flow of flows) {
        const box = el("article", undefined, { class: "flow", "data-test": "flow" });
        box.append(el("h2", flow.name));
        box.append(el("p", flow.description));
        const diagram = el("div", undefined, { class: "diagram" });
        diagram.append(drawMachine(flowMachine(flow), null));
        box.append(diagram);
        list.append(box);
      }
      rendered("flows");
    })
    .catch(failed("flows-error"));
}

init();
