// The workflow run view, part of the console. /console/workflows/{id}/run draws the
// workflow and starts draft runs; /console/executions/{id} replays a past execution (or
// follows a live one). Both read canvas frames ({type, timestamp, executionId, workflowId,
// eventId, data}) over a fetch body, signed in by the console's cookie.
// Text from the server is only ever set with textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const parts = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
const replayId = parts[1] === "executions" ? parts[2] : null;
const workflowId = parts[1] === "workflows" ? parts[2] : null;
const BOX = { width: 150, height: 56, columnGap: 70, rowGap: 24, margin: 16 };
const SETTLED = new Set(["completed", "error", "skipped"]);
let graph = null;  // {workflowId, boxes: Map(blockId -> element)}
let outputs = new Map();  // blockId -> BlockOutput in the terminal panel
let controller = null;
let executionId = null;  // of the execution shown

function svgElement(tag, attributes) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

// Signed out (or never in): to the console's sign-in, which brings the reader back here.
function toSignInOn401(response) {
  if (response.status !== 401) return false;
  location.assign(`/console?next=${encodeURIComponent(location.pathname)}`);
  return true;
}

// --- the graph ---------------------------------------------------------------------------

// Depth of each block: the longest path from a block with no incoming edge.
function depths(blocks, edges) {
  const incoming = new Map(blocks.map((b) => [b.id, []]));
  for (const edge of edges) incoming.get(edge.to)?.push(edge.from);
  const depth = new Map();
  const visit = (id, seen) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0;  // a cycle cannot be saved; be safe anyway
    seen.add(id);
    const sources = incoming.get(id) || [];
    const d = sources.length ? 1 + Math.max(...sources.map((s) => visit(s, seen))) : 0;
    depth.set(id, d);
    return d;
  };
  for (const block of blocks) visit(block.id, new Set());
  return depth;
}

function drawGraph(workflowId, definition) {
  const blocks = definition.blocks || [];
  const edges = (definition.edges || []).map((e) => ({
    from: e.from ?? e.source, to: e.to ?? e.target, on: e.on || "success",
  }));
  const depth = depths(blocks, edges);
  const rows = [];
  const position = new Map();
  for (const block of blocks) {
    const column = depth.get(block.id);
    const row = (rows[column] = (rows[column] || 0) + 1) - 1;
    position.set(block.id, {
      x: BOX.margin + column * (BOX.width + BOX.columnGap),
      y: BOX.margin + row * (BOX.height + BOX.rowGap),
    });
  }
  const dag = $("dag");
  const svg = $("edges");
  dag.querySelectorAll(".block").forEach((node) => node.remove());
  svg.replaceChildren();
  const boxes = new Map();
  for (const block of blocks) {
    const { x, y } = position.get(block.id);
    const box = element("div", "block");
    box.dataset.id = block.id;
    box.dataset.state = "pending";
    box.style.left = `${x}px`;
    box.style.top = `${y}px`;
    box.append(element("div", "name", block.name || block.id), element("div", "type", block.type));
    box.title = `${block.id} (${block.type})`;
    dag.append(box);
    boxes.set(block.id, box);
  }
  for (const edge of edges) {
    const from = position.get(edge.from);
    const to = position.get(edge.to);
    if (!from || !to) continue;
    svg.append(svgElement("line", {
      x1: from.x + BOX.width, y1: from.y + BOX.height / 2,
      x2: to.x, y2: to.y + BOX.height / 2,
      class: edge.on === "error" ? "on-error" : "on-success",
      "data-from": edge.from, "data-to": edge.to,
    }));
  }
  const width = BOX.margin * 2 + (Math.max(0, ...depth.values()) + 1) * (BOX.width + BOX.columnGap);
  const height = BOX.margin * 2 + Math.max(1, ...rows) * (BOX.height + BOX.rowGap);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  dag.style.height = `${height}px`;
  graph = { workflowId, boxes };
  updateSteps();
}

async function loadWorkflow(workflowId) {
  const response = await fetch(`/api/workflows/${encodeURIComponent(workflowId)}`);
  if (toSignInOn401(response)) return;
  if (!response.ok) throw new Error(await errorMessage(response));
  const body = await response.json();
  const definition = body.workflow;  // {workflow: definition as saved, version, ...}
  const title = definition.name || workflowId;
  $("title").textContent = title;
  document.title = `${title} · run`;
  drawGraph(workflowId, definition);
}

function setState(blockId, state) {
  const box = graph?.boxes.get(blockId);
  if (box) box.dataset.state = state;
  updateSteps();
}

function updateSteps() {
  if (!graph) return;
  const states = [...graph.boxes.values()].map((box) => box.dataset.state);
  const settled = states.filter((state) => SETTLED.has(state)).length;
  $("steps").textContent = `${settled}/${states.length} blocks`;
}

function resetRun() {
  graph?.boxes.forEach((box) => (box.dataset.state = "pending"));
  outputs = new Map();
  $("terminal").replaceChildren();
  updateSteps();
}

// --- the terminal output panel -------------------------------------------------------------

// One block's entry: Thinking and Tools sections above its output, made on demand.
class BlockOutput extends Panels {
  constructor(blockId, blockType) {
    const root = element("div", "output");
    root.dataset.block = blockId;
    root.append(element("h2", "", blockType ? `${blockId} · ${blockType}` : blockId));
    const text = element("div", "text");
    root.append(text);
    super(root, text);
    this.text = text;
    $("terminal").append(root);
  }
  complete(output) {
    if (output === undefined) return;
    const shown = Object.keys(output).length === 1 ? Object.values(output)[0] : output;
    this.text.textContent = typeof shown === "string" ? shown : JSON.stringify(shown, null, 2);
  }
  fail(error) { this.root.append(element("div", "error", error)); }
}

function outputOf(blockId, blockType) {
  if (!outputs.has(blockId)) outputs.set(blockId, new BlockOutput(blockId, blockType));
  return outputs.get(blockId);
}

function finish(status, detail, isError) {
  $("terminal").append(element("div", isError ? "result error" : "result", `${status}: ${detail}`));
  setStatus(`${status}.`, isError);
}

// The agent runs the execution started (its orchestration blocks' coordinators), as links
// to their pages in the console.
async function showStartedRuns(executionId) {
  const response = await fetch(`/api/agents/runs?parent_run_id=${encodeURIComponent(executionId)}&limit=200`);
  if (!response.ok) return;
  const { runs } = await response.json();
  const list = $("started-runs").querySelector("ul");
  list.replaceChildren(...runs.map((run) => {
    const link = element("a", "", `${run.agent_id}: ${run.id} (${run.status})`);
    link.href = `/console/runs/${encodeURIComponent(run.id)}`;
    const item = element("li");
    item.append(link);
    return item;
  }));
  $("started-runs").hidden = !runs.length;
}

function handle(frame) {
  const data = frame.data || {};
  switch (frame.type) {
    case "execution:started":
      executionId = frame.executionId;
      return setStatus("Running…");
    case "block:started":
      setState(data.blockId, "running");
      return outputOf(data.blockId, data.blockType);
    case "stream:chunk": outputOf(data.blockId).text.textContent += data.chunk; return;
    case "stream:chunk_reset": outputOf(data.blockId).text.textContent = ""; return;
    case "stream:thinking": return outputOf(data.blockId).thinking(data.text);
    case "stream:tool": return outputOf(data.blockId).tool(data);
    case "block:completed":
      setState(data.blockId, "completed");
      return outputOf(data.blockId).complete(data.output);
    case "block:error":
      setState(data.blockId, "error");
      return outputOf(data.blockId).fail(data.error);
    case "block:skipped": return setState(data.blockId, "skipped");
    case "execution:completed":
      return finish("Completed", JSON.stringify(data.result ?? null, null, 2), false);
    case "execution:error": return finish("Failed", data.error, true);
    case "execution:cancelled": return finish("Cancelled", data.reason || "", true);
  }
}

async function follow(url, init) {
  controller = new AbortController();
  $("run").hidden = true;
  $("stop").hidden = false;
  try {
    const response = await fetch(url, { ...init, signal: controller.signal });
    if (toSignInOn401(response)) return;
    if (!response.ok) return setStatus(await errorMessage(response), true);
    for await (const frame of sseData(response.body)) {
      if (!graph) await loadWorkflow(frame.workflowId);
      handle(frame);
    }
  } catch (error) {
    if (error.name === "AbortError") setStatus("Stopped.");
    else setStatus(`Connection lost: ${error.message}`, true);
  } finally {
    controller = null;
    $("run").hidden = false;
    $("stop").hidden = true;
    if (executionId) showStartedRuns(executionId);
  }
}

function parseInput(text) {
  if (/^\s*[[{]/.test(text)) {
    try { return JSON.parse(text); } catch { /* plain text after all */ }
  }
  return text;
}

async function run(workflowId) {
  resetRun();
  await follow(`/api/workflows/${encodeURIComponent(workflowId)}/execute`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ input: parseInput($("input").value) }),
  });
}

async function load() {
  try {
    if (replayId) {
      $("title").textContent = `Execution ${replayId}`;
      resetRun();
      // With the thinking and tool frames of what happened before (live-only by default).
      const url = `/api/workflows/executions/${encodeURIComponent(replayId)}/canvas?full_history=true`;
      return await follow(url, {});
    }
    await loadWorkflow(workflowId);
    setStatus("");
    $("runner").hidden = false;
  } catch (error) {
    setStatus(error.message, true);
  }
}

function start() {
  $("stop").addEventListener("click", () => controller?.abort());
  $("runner").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!controller && !replayId) run(workflowId);
  });
  load();
}

start();
