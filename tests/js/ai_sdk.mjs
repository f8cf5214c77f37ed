// Drives the AI SDK's own chat transport against a running server, for tests/test_ai_sdk.py:
//   node ai_sdk.mjs '{"command": "send" | "reconnect", "api", "key", "chatId", ...}'
// "send" posts "messages" (DefaultChatTransport.sendMessages), optionally dropping the
// connection after "dropAfter" chunks; "reconnect" is reconnectToStream. Every chunk goes
// through the SDK's schema validation on the way in (a chunk it does not accept fails the
// read). Prints {chunks, message, error}: the chunks as read, the assistant message
// readUIMessageStream assembles from them (continuing "message" if given), the error if any.
import { DefaultChatTransport, readUIMessageStream } from "ai";

const args = JSON.parse(process.argv[2]);
const transport = new DefaultChatTransport({
  api: args.api,
  headers: { Authorization: `Bearer ${args.key}` },
});

const chunks = [];
let error = null;
const abort = new AbortController();
try {
  const stream =
    args.command === "send"
      ? await transport.sendMessages({
          chatId: args.chatId,
          messages: args.messages,
          trigger: "submit-message",
          messageId: args.messageId,
          abortSignal: abort.signal,
        })
      : await transport.reconnectToStream({ chatId: args.chatId });
  if (stream !== null) {
    const reader = stream.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      if (args.dropAfter && chunks.length === args.dropAfter) {
        abort.abort();
        await reader.cancel().catch(() => {});
        break;
      }
    }
  }
} catch (caught) {
  if (!abort.signal.aborted) error = String(caught?.message ?? caught);
}

let message = null;
if (chunks.length) {
  const replay = new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  for await (const snapshot of readUIMessageStream({
    stream: replay,
    message: args.message,
    onError: (caught) => {
      error = error ?? String(caught?.message ?? caught);
    },
  })) {
    message = snapshot;
  }
}
process.stdout.write(JSON.stringify({ chunks, message, error }));
