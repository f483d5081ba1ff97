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
// title and detail, a 401 an Unauthorized.
async function call(key, method, path, body) {
  const init = { method, headers: { Authorization: `Bearer ${key}` } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 401) {
    throw new Unauthorized("wrong key");
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
  return data;
}

// Calls the API with the session's key; a 401 ends the session.
async function api(method, path, body) {
  const s = session();
  if (!s) {
    throw new Unauthorized("signed out");
  }
  return call(s.key, method, path, body);
}

function productPath(rest) {
  return `/v1/products/${encodeURIComponent(session().product)}${rest}`;
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
  for (const section of ["sign-in", "inbox", "conversation"]) {
    $(section).hidden = section !== id;
  }
  const s = session();
  $("product").textContent = s ? `product ${s.product}` : "";
  $("sign-out").hidden = !s;
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
  if (!session()) {
    showOnly("sign-in");
    $("key").focus();
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
  const key = $("key").value.trim();
  showError("sign-in-error", null);
  try {
    const me = await call(key, "GET", "/v1/me");
    sessionStorage.setItem(KEY, key);
    sessionStorage.setItem(PRODUCT, me.product_id);
    $("key").value = "";
    route();
  } catch (err) {
    signOut();
    showError("sign-in-error", err instanceof Unauthorized ? new Error("Wrong key") : err);
  }
}

// Inbox.

function inboxQuery() {
  const params = new URLSearchParams();
  const state = $("filter-state").value;
  const contact = $("filter-contact").value.trim();
  if (state) params.set("state", state);
  if (contact) params.set("contact_id", contact);
  const q = params.toString();
  return q ? `?${q}` : "";
}

function loadInbox() {
  api("GET", productPath(`/conversations${inboxQuery()}`))
    .then((list) => {
      showError("inbox-error", null);
      renderInbox(list.items || []);
    })
    .catch(failed("inbox-error"));
}

function renderInbox(items) {
  const groups = $("groups");
  groups.replaceChildren();
  for (const group of GROUPS) {
    const members = items
      .filter((c) => group.states.includes(c.state))
      // Newest first within a group; the API lists oldest first.
      .reverse();
    const section = el("section", null, {
      class: group.urgent ? "group urgent" : "group",
      "data-test": `group-${group.states[0].toLowerCase()}`,
    });
    section.append(el("h2", `${group.name} (${members.length})`));
    const rows = el("ul", null, { class: "rows" });
    for (const c of members) {
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
    groups.append(section);
  }
}

// Conversation page.

function conversationPath(id, rest = "") {
  return productPath(`/conversations/${encodeURIComponent(id)}${rest}`);
}

let current = null;

function loadConversation(id) {
  Promise.all([api("GET", conversationPath(id)), api("GET", conversationPath(id, "/audit"))])
    .then(([view, audit]) => {
      showError("conv-error", null);
      current = id;
      renderConversation(view, audit.items || []);
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
    li.append(el("span", m.role, { class: "who" }), el("span", m.at, { class: "when" }));
    li.append(el("div", m.text));
    transcript.append(li);
  }

  const rows = $("audit");
  rows.replaceChildren();
  for (const r of audit) {
    const tr = el("tr", null, { "data-test": "audit-row" });
    for (const cell of [r.seq, r.at, r.from || "—", r.to, r.cause]) {
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
    loadInbox();
  });
  $("send-form").addEventListener("submit", sendAsPerson);
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

init();
