// What the chat page and the run view share: making elements, and the Thinking and Tools
// sections shown above a piece of output (an answer, a block's output), made on demand.
// Text from the server is only ever set with textContent.
"use strict";

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

class Panels {
  constructor(root, content) {
    this.root = root;
    this.content = content;
    this.sections = {};
  }
  section(name, title) {
    if (!this.sections[name]) {
      const details = element("details", name);
      details.open = true;
      details.append(element("summary", "", title));
      this.root.insertBefore(details, this.content);
      this.sections[name] = details;
    }
    return this.sections[name];
  }
  thinking(text) {
    const section = this.section("thinking", "Thinking");
    let body = section.querySelector(".thinking-text");
    if (!body) {
      section.append((body = element("div", "thinking-text")));
      this.thinkingSince = performance.now();
    }
    body.textContent += text;
    delete section.dataset.settled;  // more thinking: its time is counted again
  }
  // The answer began: Thinking folds away, saying how long it took (open it to read).
  settleThinking() {
    const section = this.sections.thinking;
    if (!section || section.dataset.settled) return;
    section.dataset.settled = "true";
    section.open = false;
    const seconds = Math.max(1, Math.round((performance.now() - this.thinkingSince) / 1000));
    section.querySelector("summary").textContent = `Thought for ${seconds} s`;
  }
  // Name and status only: a tool's arguments and results never reach these pages.
  tool(frame) {
    const section = this.section("tools", "Tools");
    let list = section.querySelector("ul");
    if (!list) section.append((list = element("ul")));
    let item = list.querySelector(`[data-id="${CSS.escape(frame.id)}"]`);
    if (!item) {
      item = element("li", "tool", frame.name);
      item.dataset.id = frame.id;
      list.append(item);
    }
    item.dataset.status = frame.phase === "start" ? "running" : frame.status || "success";
  }
  // The tool call `id` (or, unnamed, every running one) waits for a person's decision.
  awaitApproval(id) {
    const selector = id === undefined ? '.tool[data-status="running"]' : `.tool[data-id="${CSS.escape(id)}"]`;
    for (const item of this.root.querySelectorAll(selector)) item.dataset.status = "awaiting_approval";
  }
}
