// The console: runs, sessions, workflow executions and knowledge bases, for the people who
// run agentstream. Each view is a URL under /console (links load pages; filters live in the
// query string), read from the API with the session cookie that signing in set.
// Text from the server is only ever set with textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const view = $("view");
const path = location.pathname.replace(/\/+$/, "");
const query = new URLSearchParams(location.search);
const RUN_STATUSES = ["running", "awaiting_approval", "completed", "error", "timeout", "cancelled", "interrupted"];
const EXECUTION_STATUSES = RUN_STATUSES.filter((s) => s !== "awaiting_approval");
const LIVE = new Set(["running"]);

class SignedOut extends Error {}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

// --- the API ---------------------------------------------------------------------------

async function api(url, init = {}) {
  const response = await fetch(url, init);
  if (response.status === 401) {
    showSignIn();
    throw new SignedOut();
  }
  if (!response.ok) throw new Error(await errorMessage(response));
  return response.status === 204 ? null : response.json();
}

// What a button or a form does, with its controls disabled meanwhile and a failure said in
// the status line (when signed out, the sign-in form is showing already).
async function attempt(controls, work) {
  for (const control of controls) control.disabled = true;
  try {
    await work();
  } catch (error) {
    if (!(error instanceof SignedOut)) setStatus(error.message, true);
  } finally {
    for (const control of controls) control.disabled = false;
  }
}

function onClick(button, work) {
  button.type = "button";
  button.addEventListener("click", () => attempt([button], work));
}

function onSubmit(form, work) {
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    attempt(form.querySelectorAll("button"), work);
  });
}

function send(method, url, body) {
  return api(url, { method, headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
}

function withQuery(url, params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) if (value) search.set(name, value);
  const text = search.toString();
  return text ? `${url}?${text}` : url;
}

// --- building blocks -------------------------------------------------------------------

function link(href, text, className) {
  const a = element("a", className, text);
  a.href = href;
  return a;
}

function runHref(runId) {
  const id = encodeURIComponent(runId);
  return runId.startsWith("wfx_") ? `/console/executions/${id}` : `/console/runs/${id}`;
}

function badge(status) {
  const span = element("span", "status", status.replaceAll("_", " "));
  span.dataset.status = status;
  return span;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

function duration(ms) {
  if (ms === null || ms === undefined) return "";
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

function cost(usd) {
  return usd === null || usd === undefined ? "—" : `$${usd.toFixed(usd < 0.01 ? 5 : 3)}`;
}

function json(value) {
  return element("pre", "", JSON.stringify(value, null, 2));
}

function heading(text) {
  return element("h2", "", text);
}

// A table of `rows`; each column is [title, cell(row) -> Node or text, class?]. More rows
// can be appended later (a next page) with the returned `add`.
function table(columns, rows, emptyText) {
  const wrapper = element("div");
  const tableNode = element("table");
  const head = element("tr");
  for (const [title, , className] of columns) head.append(element("th", className, title));
  const body = element("tbody");
  tableNode.append(element("thead"), body);
  tableNode.tHead.append(head);
  const empty = element("p", "empty", emptyText);
  const add = (more) => {
    for (const row of more) {
      const tr = element("tr");
      for (const [, cell, className] of columns) {
        const td = element("td", className);
        td.append(cell(row) ?? "");
        tr.append(td);
      }
      body.append(tr);
    }
    empty.hidden = body.children.length > 0;
    tableNode.hidden = !empty.hidden;
  };
  wrapper.append(tableNode, empty);
  add(rows);
  return { node: wrapper, add };
}

// A page of a list endpoint ({<key>: [...], next_cursor}) as a table, with a "Load more".
async function pagedTable(url, params, key, columns, emptyText) {
  const first = await api(withQuery(url, params));
  const { node, add } = table(columns, first[key], emptyText);
  let cursor = first.next_cursor;
  const more = element("button", "secondary more", "Load more");
  more.hidden = !cursor;
  onClick(more, async () => {
    const next = await api(withQuery(url, { ...params, cursor }));
    add(next[key]);
    cursor = next.next_cursor;
    more.hidden = !cursor;
  });
  node.append(more);
  return node;
}

// Filters as a form over the query string: choices, and a time range read in local time
// and sent as UTC.
function filters(fields) {
  const form = element("form", "filters");
  for (const field of fields) {
    const label = element("label", "", field.label);
    let input;
    if (field.options) {
      input = element("select");
      input.append(new Option("Any", ""));
      for (const option of field.options) input.append(new Option(option, option));
    } else {
      input = element("input");
      input.type = field.type || "text";
    }
    input.name = field.name;
    const current = query.get(field.name) || "";
    input.value = field.type === "datetime-local" && current ? localInput(current) : current;
    label.append(input);
    form.append(label);
  }
  const apply = element("button", "", "Apply");
  apply.type = "submit";
  form.append(apply);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const params = {};
    for (const field of fields) {
      const value = form.elements[field.name].value;
      params[field.name] = field.type === "datetime-local" && value ? new Date(value).toISOString() : value;
    }
    location.assign(withQuery(location.pathname, params));
  });
  return form;
}

function localInput(iso) {
  const moment = new Date(iso);
  if (Number.isNaN(moment.getTime())) return "";
  return new Date(moment.getTime() - moment.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

const TIME_RANGE = [
  { name: "since", label: "From", type: "datetime-local" },
  { name: "until", label: "Until", type: "datetime-local" },
];

function params(names) {
  return Object.fromEntries(names.map((name) => [name, query.get(name) || ""]));
}

// --- runs ------------------------------------------------------------------------------

const RUN_COLUMNS = [
  ["Run", (run) => link(runHref(run.id), run.id, "id")],
  ["Agent", (run) => run.agent_id],
  ["Status", (run) => badge(run.status)],
  ["Input", (run) => run.input, "input"],
  ["Tokens", (run) => String(run.usage.total_tokens), "number"],
  ["Cost", (run) => cost(run.usage.cost_usd), "number"],
  ["Started", (run) => when(run.created_at)],
  ["Took", (run) => run.finished_at ? duration(Date.parse(run.finished_at) - Date.parse(run.created_at)) : "", "number"],
];

async function runsView() {
  const agents = await api("/api/agents");
  view.append(
    element("h1", "", "Runs"),
    filters([
      { name: "agent_id", label: "Agent", options: agents.map((a) => a.id) },
      { name: "status", label: "Status", options: RUN_STATUSES },
      ...TIME_RANGE,
    ]),
    await pagedTable("/api/agents/runs", params(["agent_id", "status", "since", "until"]), "runs", RUN_COLUMNS, "No runs match."),
  );
}

// One run: its summary, the approvals it waits for, its steps, the runs it started, and its
// events in order; followed live while it is going.
let drawn = 0;  // the run page's drawings: only the latest may draw or follow
let following = null;  // the AbortController of the live stream it follows

async function runView(runId, quietRounds = 0) {
  const drawing = ++drawn;
  following?.abort();
  const [run, children] = await Promise.all([
    api(`/api/agents/runs/${encodeURIComponent(runId)}`),
    api(withQuery("/api/agents/runs", { parent_run_id: runId, limit: "200" })),
  ]);
  if (drawing !== drawn) return;  // a later drawing began meanwhile: it draws
  document.title = `Run ${run.id} · agentstream`;
  setStatus("");
  view.replaceChildren();
  const title = element("h1", "", `Run `);
  title.append(element("span", "id", run.id), " ", badge(run.status));
  view.append(title, runSummary(run));
  if (LIVE.has(run.status)) view.append(cancelButton(run));
  view.append(heading("Input"), element("p", "text", run.input));
  const answer = element("p", "text answer", run.content ?? "");
  if (run.content || LIVE.has(run.status)) view.append(heading("Answer"), answer);
  if (run.error) view.append(heading("Error"), element("p", "text error", run.error));
  if (run.reasoning) view.append(heading("Reasoning"), element("p", "text", run.reasoning));
  const pending = run.approvals.filter((a) => a.decision === "pending");
  if (pending.length) view.append(heading("Waiting for approval"), ...pending.map((a) => approvalCard(run, a)));
  const decided = run.approvals.filter((a) => a.decision !== "pending");
  if (decided.length) {
    view.append(heading("Approvals"), table([
      ["Tool", (a) => a.tool_name],
      ["Decision", (a) => badge(a.decision)],
      ["By", (a) => a.decided_by || ""],
      ["Reason", (a) => a.reason || ""],
      ["Decided", (a) => when(a.decided_at)],
    ], decided).node);
  }
  if (run.steps.length) {
    view.append(heading("Steps"), table([
      ["Step", (s) => String(s.step), "number"],
      ["Started", (s) => when(s.started_at)],
      ["Took", (s) => duration(s.duration_ms), "number"],
      ["Tool calls", (s) => run.tool_calls.filter((c) => c.step === s.step).map((c) => `${c.name} (${duration(c.duration_ms) || c.status || "running"})`).join(", ")],
    ], run.steps).node);
  }
  if (children.runs.length) view.append(heading("Runs it started"), table(RUN_COLUMNS, children.runs).node);
  const events = element("ol", "events");
  for (const frame of run.events) events.append(eventItem(frame));
  view.append(heading("Events"), events);
  if (LIVE.has(run.status)) follow(run, events, answer, drawing, quietRounds);
}

function runSummary(run) {
  const summary = element("dl", "summary");
  const row = (term, ...value) => summary.append(element("dt", "", term), withChildren(element("dd"), value));
  row("Agent", link(withQuery("/console/runs", { agent_id: run.agent_id }), `${run.agent_id} (v${run.agent_version})`));
  row("Session", link(`/console/sessions/${encodeURIComponent(run.session_id)}`, run.session_id, "id"));
  if (run.parent_run_id) row("Started by", link(runHref(run.parent_run_id), run.parent_run_id, "id"));
  row("Started", when(run.created_at));
  row("Took", duration(run.duration_ms) || "still going");
  row("Tokens", `${run.usage.input_tokens} in, ${run.usage.output_tokens} out`);
  row("Cost", cost(run.usage.cost_usd));
  return summary;
}

function withChildren(node, children) {
  node.append(...children);
  return node;
}

function cancelButton(run) {
  const button = element("button", "danger", "Cancel run");
  onClick(button, () => send("POST", `/api/agents/runs/${encodeURIComponent(run.id)}/cancel`, {}));
  return button;
}

function approvalCard(run, approval) {
  const card = element("div", "approval");
  card.append(element("strong", "", approval.tool_name), json(approval.tool_input));
  const actions = element("div", "actions");
  const reason = element("input");
  reason.placeholder = "Reason (shown to the model with a denial)";
  const approve = element("button", "", "Approve");
  const deny = element("button", "danger", "Deny");
  // One decision at a time: every card's buttons wait for it.
  const decide = (verdict) => () => attempt(view.querySelectorAll(".approval button"), async () => {
    await send("POST", `/api/agents/runs/${encodeURIComponent(run.id)}/${verdict}`, {
      tool_call_id: approval.tool_call_id, reason: reason.value.trim() || null,
    });
    await runView(run.id);  // running again once every call is decided: followed live
  });
  approve.type = deny.type = "button";
  approve.addEventListener("click", decide("approve"));
  deny.addEventListener("click", decide("deny"));
  actions.append(reason, approve, deny);
  card.append(actions);
  return card;
}

// A frame of the native stream: its name, and each field (objects in full: this page is
// authenticated, and its readers are who may see tool arguments and results).
function eventItem(frame) {
  const item = element("li");
  item.append(element("span", "seq", frame.seq ?? ""), element("span", "name", frame.event));
  const body = element("div", "body");
  for (const [name, value] of Object.entries(frame)) {
    if (name === "event" || name === "seq") continue;
    const field = element("div");
    field.append(element("span", "field", `${name}: `));
    if (name.endsWith("run_id") && typeof value === "string") field.append(link(runHref(value), value, "id"));
    else if (value !== null && typeof value === "object") field.append(json(value));
    else field.append(String(value));
    body.append(field);
  }
  item.append(body);
  return item;
}

// The run's live stream from after its last persisted event: deltas grow the answer, other
// frames join the events; at its end the page is drawn again from the record. A stream that
// gave nothing while the record says "running" (its process gone, before its runs are
// marked so) is tried again after a wait that doubles, up to 8 s.
async function follow(run, events, answer, drawing, quietRounds) {
  if (quietRounds) {
    setStatus("Reconnecting…");
    await new Promise((resolve) => setTimeout(resolve, Math.min(8000, 500 * 2 ** quietRounds)));
    if (drawing !== drawn) return;
  }
  following = new AbortController();
  const after = run.events.length ? run.events[run.events.length - 1].seq : 0;
  const url = `/api/agents/runs/${encodeURIComponent(run.id)}/stream?after=${after}`;
  answer.classList.add("live");
  let live = "";
  let heard = false;
  try {
    const response = await fetch(url, { signal: following.signal });
    if (response.status === 401) return showSignIn();
    if (!response.ok) return setStatus(await errorMessage(response), true);
    if (response.status !== 204) {
      for await (const frame of sseData(response.body)) {
        heard = true;
        if (frame.event === "content_delta") {
          live += frame.delta;
          answer.textContent = live;
        } else if (frame.event !== "reasoning_delta") {
          events.append(eventItem(frame));
        }
      }
    }
  } catch (error) {
    if (error.name === "AbortError") return;  // drawn again meanwhile
  }
  if (drawing === drawn) await runView(run.id, heard ? 0 : quietRounds + 1);
}

// --- sessions --------------------------------------------------------------------------

async function sessionsView() {
  const agents = await api("/api/agents");
  view.append(
    element("h1", "", "Sessions"),
    filters([{ name: "agent_id", label: "Agent", options: agents.map((a) => a.id) }, ...TIME_RANGE]),
    await pagedTable("/api/sessions", params(["agent_id", "since", "until"]), "sessions", [
      ["Session", (s) => link(`/console/sessions/${encodeURIComponent(s.id)}`, s.id, "id")],
      ["Agent", (s) => s.agent_id],
      ["Runs", (s) => String(s.runs), "number"],
      ["Created", (s) => when(s.created_at)],
      ["Last run", (s) => when(s.last_run_at)],
    ], "No sessions match."),
  );
}

async function sessionView(sessionId) {
  const session = await api(`/api/sessions/${encodeURIComponent(sessionId)}`);
  const title = element("h1", "", "Session ");
  title.append(element("span", "id", session.id));
  view.append(title);
  const summary = element("dl", "summary");
  summary.append(
    element("dt", "", "Agent"), element("dd", "", session.agent_id),
    element("dt", "", "Created"), element("dd", "", when(session.created_at)),
  );
  view.append(summary, heading("Runs"), table([
    ["Run", (run) => link(runHref(run.id), run.id, "id")],
    ["Status", (run) => badge(run.status)],
    ["Input", (run) => run.input, "input"],
    ["Tokens", (run) => String(run.usage.total_tokens), "number"],
    ["Started", (run) => when(run.created_at)],
  ], session.runs, "No runs.").node);
  view.append(heading("What the model remembers"), table([
    ["Role", (m) => m.role],
    ["Content", (m) => m.tool_calls.length ? json(m.tool_calls) : m.content],
  ], session.messages, "Nothing yet.").node);
}

// --- workflow executions -----------------------------------------------------------------

async function executionsView() {
  const workflows = await api("/api/workflows");
  view.append(element("h1", "", "Workflows"));
  if (workflows.length) {
    const cards = element("div", "cards");
    for (const { workflow, version } of workflows) {
      const card = element("div", "card");
      card.append(
        element("h3", "", workflow.name || workflow.id),
        element("div", "id", `${workflow.id} · v${version} · ${workflow.blocks.length} blocks`),
        link(`/console/workflows/${encodeURIComponent(workflow.id)}/run`, "Open and run"),
      );
      cards.append(card);
    }
    view.append(cards);
  }
  view.append(
    heading("Executions"),
    filters([
      { name: "workflow_id", label: "Workflow", options: workflows.map((w) => w.workflow.id) },
      { name: "status", label: "Status", options: EXECUTION_STATUSES },
      ...TIME_RANGE,
    ]),
    await pagedTable("/api/workflows/executions", params(["workflow_id", "status", "since", "until"]), "executions", [
      ["Execution", (x) => link(runHref(x.id), x.id, "id")],
      ["Workflow", (x) => x.draft ? `${x.workflow_id} (draft)` : `${x.workflow_id} v${x.workflow_version}`],
      ["Status", (x) => badge(x.status)],
      ["Started", (x) => when(x.created_at)],
      ["Took", (x) => duration(x.duration_ms), "number"],
    ], "No executions match."),
  );
}

// --- knowledge bases -----------------------------------------------------------------------

async function knowledgeView() {
  const bases = await api("/api/knowledge-bases");
  view.append(element("h1", "", "Knowledge bases"));
  const form = element("form", "inline");
  const name = element("input");
  name.placeholder = "Name";
  name.required = true;
  const description = element("input");
  description.placeholder = "Description (optional)";
  const create = element("button", "", "Create");
  form.append(name, description, create);
  onSubmit(form, async () => {
    const base = await send("POST", "/api/knowledge-bases", { name: name.value.trim(), description: description.value.trim() });
    location.assign(`/console/knowledge/${encodeURIComponent(base.id)}`);
  });
  view.append(form, table([
    ["Name", (kb) => link(`/console/knowledge/${encodeURIComponent(kb.id)}`, kb.name)],
    ["Id", (kb) => element("span", "id", kb.id)],
    ["Documents", (kb) => String(kb.documents), "number"],
    ["Chunks", (kb) => String(kb.chunks), "number"],
    ["Search", (kb) => kb.embedding_model],
    ["Created", (kb) => when(kb.created_at)],
  ], bases, "No knowledge bases yet.").node);
}

async function knowledgeBaseView(baseId) {
  const base = await api(`/api/knowledge-bases/${encodeURIComponent(baseId)}`);
  const url = `/api/knowledge-bases/${encodeURIComponent(base.id)}`;
  view.append(element("h1", "", base.name));
  if (base.description) view.append(element("p", "", base.description));

  const upload = element("form", "inline");
  const file = element("input");
  file.type = "file";
  file.accept = ".txt,.md,.pdf";
  file.required = true;
  upload.append(file, element("button", "", "Upload"));
  onSubmit(upload, async () => {
    const body = new FormData();
    body.append("file", file.files[0]);
    setStatus("Uploading…");
    await api(`${url}/documents`, { method: "POST", body });
    location.reload();
  });
  view.append(heading("Documents"), upload, table([
    ["Name", (d) => d.name],
    ["Type", (d) => d.media_type],
    ["Characters", (d) => String(d.characters), "number"],
    ["Chunks", (d) => String(d.chunk_count), "number"],
    ["Added", (d) => when(d.created_at)],
    ["", (d) => removeButton(`${url}/documents/${encodeURIComponent(d.id)}`)],
  ], base.document_list, "No documents yet: upload a .txt, .md or .pdf file.").node);

  const search = element("form", "inline");
  const words = element("input");
  words.placeholder = "Try a search";
  words.required = true;
  search.append(words, element("button", "", "Search"));
  const results = element("div");
  onSubmit(search, async () => {
    const found = await send("POST", `${url}/search`, { query: words.value.trim() });
    results.replaceChildren(table([
      ["#", (c) => `[${c.number}]`],
      ["Document", (c) => c.page ? `${c.document_name}, page ${c.page}` : c.document_name],
      ["Passage", (c) => c.text],
      ["Score", (c) => c.score.toFixed(4), "number"],
    ], found.results, "Nothing found.").node);
  });
  view.append(heading("Search"), search, results);
}

function removeButton(url) {
  const button = element("button", "secondary", "Delete");
  onClick(button, async () => {
    await api(url, { method: "DELETE" });
    location.reload();
  });
  return button;
}

// --- signing in and out ----------------------------------------------------------------------

function showSignIn() {
  view.replaceChildren();
  $("nav").hidden = $("who").hidden = $("sign-out").hidden = true;
  $("signin").hidden = false;
  $("signin-key").focus();
}

// Not through api(): a 401 here is a wrong key, to say so, not a reason to sign in.
async function signIn() {
  const response = await fetch("/api/console/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ api_key: $("signin-key").value.trim() }),
  });
  if (!response.ok) throw new Error(await errorMessage(response));
  const next = query.get("next");
  // Back where the reader was sent from: a page of this console only.
  location.assign(next && next.startsWith("/console") ? next : location.pathname);
}

async function signOut() {
  const response = await fetch("/api/console/session", { method: "DELETE" });
  if (!response.ok) throw new Error(await errorMessage(response));
  location.assign("/console");
}

// --- which view --------------------------------------------------------------------------------

const ROUTES = [
  [/^\/console(?:\/runs)?$/, "runs", runsView],
  [/^\/console\/runs\/([^/]+)$/, "runs", runView],
  [/^\/console\/sessions$/, "sessions", sessionsView],
  [/^\/console\/sessions\/([^/]+)$/, "sessions", sessionView],
  [/^\/console\/executions$/, "executions", executionsView],
  [/^\/console\/knowledge$/, "knowledge", knowledgeView],
  [/^\/console\/knowledge\/([^/]+)$/, "knowledge", knowledgeBaseView],
];

async function start() {
  onSubmit($("signin-form"), signIn);
  onClick($("sign-out"), signOut);
  try {
    const { key_name: name } = await api("/api/console/session");
    $("who").textContent = `Signed in with the key “${name}”`;
    $("nav").hidden = $("who").hidden = $("sign-out").hidden = false;
    const route = ROUTES.find(([pattern]) => pattern.test(path));
    if (!route) return setStatus("Nothing here.", true);
    const [pattern, section, show] = route;
    $("nav").querySelector(`[data-section="${section}"]`).setAttribute("aria-current", "page");
    await show(...path.match(pattern).slice(1).map(decodeURIComponent));
  } catch (error) {
    if (!(error instanceof SignedOut)) setStatus(error.message, true);
  }
}

start();
