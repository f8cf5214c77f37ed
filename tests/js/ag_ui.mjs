// Drives AG-UI's official client (@ag-ui/client's HttpAgent) against a running server, for
// tests/test_ag_ui.py:
//   node ag_ui.mjs '{"url", "key", "threadId", "runs": [{"message"} | {"resume": "resolved" | "cancelled"}, ...]}'
// One HttpAgent (one thread) makes the runs in turn: a user message, or an answer to every
// pending interrupt. runAgent verifies the events as they come (a stream that breaks the
// protocol fails the run). Prints {runs: [{events, error, interrupts}], messages}.
import { HttpAgent } from "@ag-ui/client";

const args = JSON.parse(process.argv[2]);
const agent = new HttpAgent({
  url: args.url,
  headers: { Authorization: `Bearer ${args.key}` },
  threadId: args.threadId,
});

const runs = [];
for (const step of args.runs) {
  const events = [];
  let error = null;
  const options = {};
  if (step.message !== undefined) {
    agent.addMessage({ id: `user_${runs.length}`, role: "user", content: step.message });
  } else {
    options.resume = agent.pendingInterrupts.map((interrupt) => ({
      interruptId: interrupt.id,
      status: step.resume,
    }));
  }
  if (step.runId !== undefined) options.runId = step.runId;
  try {
    await agent.runAgent(options, {
      onEvent: ({ event }) => {
        events.push(event);
      },
    });
  } catch (caught) {
    error = String(caught?.message ?? caught);
  }
  runs.push({ events, error, interrupts: structuredClone(agent.pendingInterrupts) });
}
process.stdout.write(JSON.stringify({ runs, messages: agent.messages }));
