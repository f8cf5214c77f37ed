// The hosted chat page. It always sends the protocol header, so it gets answer text live
// (appending `chunk`, honouring `chunk_reset`) and, where the deployment allows, thinking
// and tool frames. Answers are Markdown, rendered and sanitized by the server
// (`POST /api/chat/{slug}/markdown`); any other text from the server is only ever set
// with textContent. The page follows
// the stream while the reader is at the bottom, and keeps the conversation's messages in
// the tab's session storage, so a reload shows them again.
"use strict";

const PROTOCOL = { "X-Sim-Stream-Protocol": "agent-events-v1" };
const slug = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const api = `/api/chat/${encodeURIComponent(slug)}`;
const $ = (id) => document.getElementById(id);
const conversationKey = `agentstream:conversation:${slug}`;
let conversationId = sessionStorage.getItem(conversationKey) || crypto.randomUUID();
let controller = null;
let greeting = null;
let prompts = [];  // the deployment's suggested prompts, offered while nothing is said
let citations = false;  // the deployment shows the passages an answer cites
let following = true;  // the reader is at the bottom: new text scrolls into view

addEventListener("scroll", () => {
  following = innerHeight + scrollY >= document.documentElement.scrollHeight - 48;
}, { passive: true });

function keepInView() {
  if (following) scrollTo(0, document.documentElement.scrollHeight);
}

// The conversation's settled messages, for a reload: [{role, text, note}].
const transcriptKey = () => `agentstream:transcript:${slug}:${conversationId}`;
function transcript(key = transcriptKey()) {
  try {
    return JSON.parse(sessionStorage.getItem(key)) || [];
  } catch {
    return [];
  }
}
function remember(key, ...entries) {
  sessionStorage.setItem(key, JSON.stringify([...transcript(key), ...entries]));
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

// The server's Markdown rendering of a text (sanitized there: safe to set as HTML), or null.
async function markdown(text) {
  const response = await fetch(`${api}/markdown`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ text }),
    credentials: "same-origin",
  });
  return response.ok ? (await response.json()).html : null;
}

const RENDER_MS = 250;  // how often a streaming answer is rendered again

// One block of answer text: rendered as Markdown as it grows; what came since the last
// rendering waits after it as plain text, so every token shows at once.
class RenderedText {
  constructor(parent) {
    this.root = element("div", "block");
    this.html = element("div", "rendered");
    this.pending = element("span", "pending");
    this.root.append(this.html, this.pending);
    parent.append(this.root);
    this.raw = "";
    this.shown = "";
    this.ticket = 0;
  }
  append(text) {
    this.raw += text;
    this.pending.textContent += text;
  }
  reset() {
    this.raw = this.shown = "";
    this.ticket++;
    this.html.replaceChildren();
    this.pending.textContent = "";
  }
  async render() {
    const raw = this.raw;
    if (raw === this.shown) return;
    const ticket = ++this.ticket;
    const html = await markdown(raw);
    if (html === null || ticket !== this.ticket) return;  // a later one, or a reset, won
    this.html.innerHTML = html;
    for (const pre of this.html.querySelectorAll("pre")) {
      const copy = element("button", "copy", "Copy");
      copy.type = "button";
      copy.addEventListener("click", () => navigator.clipboard?.writeText(pre.textContent));
      pre.before(copy);
    }
    this.shown = raw;
    this.pending.textContent = this.raw.slice(raw.length);
  }
}

// One assistant message: Thinking and Tools sections above the answer, made on demand.
class AssistantMessage extends Panels {
  constructor() {
    const root = element("div", "message assistant");
    const answer = element("div", "answer");
    root.append(answer);
    super(root, answer);
    this.answer = answer;
    $("conversation").append(root);
  }
  // Text is kept per block: a reset takes back only its own block's streamed text.
  append(block, text) {
    this.settleThinking();
    this.block(block).append(text);
    this.renderTimer ??= setTimeout(() => this.render(), RENDER_MS);
  }
  reset(block) { this.block(block).reset(); }
  block(id) {
    this.blocks ??= new Map();
    if (!this.blocks.has(id)) this.blocks.set(id, new RenderedText(this.answer));
    return this.blocks.get(id);
  }
  render() {
    clearTimeout(this.renderTimer);
    this.renderTimer = undefined;
    return Promise.all([...(this.blocks?.values() ?? [])].map((block) => block.render()));
  }
  get text() { return [...(this.blocks?.values() ?? [])].map((block) => block.raw).join(""); }
  fail(text) {
    this.note = text;
    this.root.append(element("p", "error", text));
  }
  // The passages the answer cites, as numbered cards under it.
  sources(list) {
    this.cited = list;
    showSources(this.root, list);
  }
  stopped() {
    this.note = "Stopped";
    this.root.classList.add("stopped");
    this.root.append(element("p", "stopped-note", "Stopped"));
  }
  // No answer yet: a person has to approve a tool call first. Nothing spins meanwhile.
  waiting(text) {
    this.note = text;
    this.awaitApproval();
    this.root.append(element("p", "waiting", text));
  }
}

function handle(frame, message) {
  if (frame === "[DONE]") return;
  if ("chunk" in frame) return message.append(frame.blockId, frame.chunk);
  switch (frame.event) {
    case "chunk_reset": return message.reset(frame.blockId);
    case "thinking": return message.thinking(frame.data);
    case "tool": return message.tool(frame);
    case "approval_required": return message.awaitApproval(frame.id);
    case "error": return message.fail(frame.error);
    case "final":
      if (frame.data.conversationId) {
        conversationId = frame.data.conversationId;
        sessionStorage.setItem(conversationKey, conversationId);
      }
      if (frame.data.awaitingApproval) return message.waiting(frame.data.error);
      if (!frame.data.success && frame.data.error) return message.fail(frame.data.error);
      return;
  }
}

function showSources(parent, list) {
  if (!list?.length) return;
  const cards = element("ol", "sources");
  for (const source of list) {
    const card = element("li", "source");
    card.value = source.number;
    const where = source.page ? `${source.document}, page ${source.page}` : source.document;
    card.append(element("span", "source-title", `[${source.number}] ${where}`));
    card.append(element("p", "source-excerpt", source.excerpt));
    cards.append(card);
  }
  parent.append(cards);
}

async function loadSources(runId) {
  const query = new URLSearchParams({ conversationId });
  const response = await fetch(`${api}/runs/${encodeURIComponent(runId)}/sources?${query}`, {
    credentials: "same-origin",
  });
  return response.ok ? response.json() : [];
}

function showSaved({ role, text, note, sources }) {
  let message;
  if (role === "assistant") {
    message = element("div", "message assistant");
    const block = new RenderedText(message.appendChild(element("div", "answer")));
    block.append(text);
    block.render();
  } else {
    message = element("div", `message ${role}`, text);
  }
  if (note) message.append(element("p", note === "Stopped" ? "stopped-note" : "waiting", note));
  showSources(message, sources);
  $("conversation").append(message);
}

function offerPrompts() {
  const box = $("prompts");
  box.replaceChildren(...prompts.map((prompt) => {
    const button = element("button", "prompt", prompt);
    button.type = "button";
    button.addEventListener("click", () => controller || send(prompt));
    return button;
  }));
  box.hidden = !prompts.length || !!document.querySelector(".message.user") || $("composer").hidden;
}

async function send(text) {
  $("prompts").hidden = true;
  $("conversation").append(element("div", "message user", text));
  following = true;
  keepInView();
  const conversation = transcriptKey();  // New chat may start another meanwhile
  const message = new AssistantMessage();
  controller = new AbortController();
  $("send").hidden = true;
  $("stop").hidden = false;
  setStatus("");
  try {
    const response = await fetch(api, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...PROTOCOL },
      body: JSON.stringify({ input: text, conversationId }),
      signal: controller.signal,
      credentials: "same-origin",
    });
    if (response.status === 401) {
      message.fail(await errorMessage(response));
      return showSignIn(await loadInfo());
    }
    if (!response.ok) return message.fail(await errorMessage(response));
    for await (const frame of sseData(response.body)) {
      handle(frame, message);
      keepInView();
    }
    const runId = response.headers.get("X-Run-Id");
    if (citations && runId) message.sources(await loadSources(runId));
  } catch (error) {
    if (error.name === "AbortError") message.stopped();
    else message.fail(`Connection lost: ${error.message}`);
  } finally {
    controller = null;
    $("send").hidden = false;
    $("stop").hidden = true;
    const answer = { role: "assistant", text: message.text, note: message.note, sources: message.cited };
    remember(conversation, { role: "user", text }, answer);
    await message.render();
    keepInView();
  }
}

function newChat() {
  controller?.abort();
  sessionStorage.removeItem(transcriptKey());
  conversationId = crypto.randomUUID();
  sessionStorage.setItem(conversationKey, conversationId);
  $("conversation").replaceChildren();
  if (greeting) showSaved({ role: "assistant", text: greeting });
  offerPrompts();
  setStatus("");
  $("input").focus();
}

async function loadInfo() {
  const response = await fetch(api, { credentials: "same-origin" });
  if (!response.ok) throw new Error(await errorMessage(response));
  return response.json();
}

function showSignIn(info) {
  $("signin").hidden = false;
  $("composer").hidden = true;
  const byEmail = info.access === "email";
  $("signin-email").hidden = !byEmail;
  $("signin-secret").hidden = false;
  $("signin-secret").placeholder = byEmail ? "Code from the email (leave empty to get one)" : "Password";
  $("signin-secret").required = !byEmail;
  $("signin-prompt").textContent = byEmail
    ? "This chat is for invited people: enter your email, then the code we send you."
    : info.access === "api_key" ? "This chat needs an API key." : "This chat is password protected.";
}

async function signIn(event) {
  event.preventDefault();
  const secret = $("signin-secret").value;
  const body = $("signin-email").hidden
    ? { password: secret }
    : { email: $("signin-email").value, ...(secret ? { otp: secret } : {}) };
  const response = await fetch(api, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
  if (!response.ok) return setStatus(await errorMessage(response), response.status !== 401 || !!secret);
  $("signin").hidden = true;
  $("composer").hidden = false;
  setStatus("");
  const info = await loadInfo();  // the greeting and prompts are for signed-in visitors
  greeting = info.greeting;
  prompts = info.suggestedPrompts;
  citations = info.includeCitations;
  if (greeting) showSaved({ role: "assistant", text: greeting });
  offerPrompts();
}

async function start() {
  sessionStorage.setItem(conversationKey, conversationId);
  let info;
  try {
    info = await loadInfo();
  } catch (error) {
    return setStatus(error.message, true);
  }
  document.title = info.title;
  $("title").textContent = info.title;
  if (info.logoUrl) {
    $("logo").src = info.logoUrl;
    $("logo").hidden = false;
  }
  document.documentElement.style.setProperty("--accent", info.accentColor);
  prompts = info.suggestedPrompts;
  citations = info.includeCitations;
  greeting = info.greeting;
  if (greeting) showSaved({ role: "assistant", text: greeting });
  for (const entry of transcript()) showSaved(entry);
  keepInView();
  if (info.authenticated) $("composer").hidden = false;
  else showSignIn(info);
  offerPrompts();
  $("signin-form").addEventListener("submit", signIn);
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("input").value.trim();
    if (!text || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("new-chat").addEventListener("click", newChat);
}

start();
