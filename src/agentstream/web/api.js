// What the pages share to talk to the API: its error messages, and Server-Sent Events read
// from a fetch body (a fetch, unlike EventSource, can POST and can be aborted).
"use strict";

// The message of an error response ({"error": {"message"}}), or its status.
async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

// The JSON data of each frame: frames end at a blank line; comment lines are skipped.
async function* sseData(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const frames = buffer.split(/\r\n\r\n|\n\n|\r\r/);
    buffer = frames.pop();
    for (const frame of frames) {
      const data = frame.split(/\r\n|\n|\r/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5));
      if (data.length) yield JSON.parse(data.join("\n"));
    }
  }
}
