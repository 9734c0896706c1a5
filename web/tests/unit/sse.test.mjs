// The SSE parser the workspace reads run streams with.

import assert from "node:assert/strict";
import { test } from "node:test";

import { SseParser, readFrames } from "../../assets/sse.mjs";

test("frames carry event, data and id in the gateway's field order", () => {
  const parser = new SseParser();
  const frames = parser.push('event: metadata\ndata: {"run_id":"r"}\nid: 1\n\n');
  assert.deepEqual(frames, [{ event: "metadata", data: '{"run_id":"r"}', id: "1" }]);
});

test("a frame split across chunks, CRLF endings and heartbeats", () => {
  const parser = new SseParser();
  assert.deepEqual(parser.push("event: cus"), []);
  assert.deepEqual(parser.push("tom\r\ndata: {\"a\":"), []);
  assert.deepEqual(parser.push("1}\r"), []);
  assert.deepEqual(parser.push("\nid: 7\r\n\r\n: heartbeat\n\n"), [{ event: "custom", data: '{"a":1}', id: "7" }]);
});

test("a gap frame has no id and multi-line data joins with newlines", () => {
  const parser = new SseParser();
  const frames = parser.push("event: gap\ndata: {\"code\":\ndata: \"stream_replay_gap\"}\n\nevent: end\ndata: null\nid: 9\n\n");
  assert.deepEqual(frames, [
    { event: "gap", data: '{"code":\n"stream_replay_gap"}', id: null },
    { event: "end", data: "null", id: "9" },
  ]);
});

test("a frame without data is not dispatched", () => {
  const parser = new SseParser();
  assert.deepEqual(parser.push("event: ping\n\nid: 3\n\n"), []);
});

test("readFrames parses JSON, keeps split UTF-8 intact and drops an unfinished frame", async () => {
  const bytes = new TextEncoder().encode('event: custom\ndata: {"t":"é"}\nid: 1\n\nevent: end\ndata: nu');
  const cut = bytes.indexOf(0xa9); // inside "é"
  const body = new ReadableStream({
    start(controller) {
      controller.enqueue(bytes.slice(0, cut));
      controller.enqueue(bytes.slice(cut));
      controller.close();
    },
  });
  const frames = [];
  await readFrames(new Response(body), (frame) => frames.push(frame));
  assert.deepEqual(frames, [{ event: "custom", data: { t: "é" }, id: "1" }]);
});
