// subflow behind a compressing reverse proxy, the way the reference's web app reaches it
// through its Next.js rewrites: the proxy keeps the browser's Origin, and gzips every
// response unless it says `Cache-Control: no-transform` (as the `compression` middleware
// Next uses does). A gzip stream holds its output until its buffer fills or the response
// ends, so an event stream without no-transform would arrive in one piece at the end.

import assert from "node:assert/strict";
import http from "node:http";
import { after, before, test } from "node:test";
import zlib from "node:zlib";

import { scriptedModel, startServer } from "../browser/harness.mjs";

let server;
let proxy;

/** A proxy to `target` on a free loopback port that gzips what it may transform. */
async function compressingProxy(target) {
  const gzipped = [];
  const listener = http.createServer((request, response) => {
    const url = new URL(request.url, target);
    const upstream = http.request(
      url,
      { method: request.method, headers: { ...request.headers, host: url.host } },
      (answer) => {
        const headers = { ...answer.headers };
        const accepts = /\bgzip\b/.test(String(request.headers["accept-encoding"] ?? ""));
        const noTransform = /\bno-transform\b/.test(String(headers["cache-control"] ?? ""));
        if (!accepts || noTransform) {
          response.writeHead(answer.statusCode, headers);
          answer.pipe(response);
          return;
        }
        gzipped.push(request.url);
        delete headers["content-length"];
        headers["content-encoding"] = "gzip";
        response.writeHead(answer.statusCode, headers);
        answer.pipe(zlib.createGzip()).pipe(response);
      },
    );
    request.pipe(upstream);
  });
  await new Promise((resolve) => listener.listen(0, "127.0.0.1", resolve));
  return {
    base: `http://127.0.0.1:${listener.address().port}`,
    gzipped,
    close: () => new Promise((resolve) => listener.close(resolve)),
  };
}

before(async () => {
  server = await startServer({ config: scriptedModel({ delayMs: 20 }) });
  proxy = await compressingProxy(server.base);
});

after(async () => {
  await proxy?.close();
  await server?.stop();
});

/** A JSON POST through the proxy, as the browser sends it from the app's origin. */
function postThroughProxy(path, body) {
  return fetch(`${proxy.base}${path}`, {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      "Accept-Encoding": "gzip",
      Origin: "http://localhost:3000",
    },
    body: JSON.stringify(body),
  });
}

test("the proxy compresses ordinary answers, so it is a compressing proxy", async () => {
  const response = await postThroughProxy("/api/threads/search", {});
  assert.equal(response.status, 200);
  assert.equal(response.headers.get("content-encoding"), "gzip");
  assert.ok(Array.isArray(await response.json()));
  assert.ok(proxy.gzipped.includes("/api/threads/search"));
});

test("an event stream passes the proxy frame by frame while the run goes on", async () => {
  const response = await postThroughProxy("/api/threads/proxied/runs/stream", {
    input: { messages: [{ type: "human", content: "Compare Rust and Go for a CLI" }] },
    stream_mode: ["messages-tuple", "updates", "custom"],
  });
  assert.equal(response.status, 200, "a loopback origin passes in local mode");
  assert.match(response.headers.get("cache-control"), /no-transform/);
  assert.equal(response.headers.get("content-encoding"), null);
  const runId = /\/runs\/([^/]+)$/.exec(response.headers.get("content-location"))[1];

  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let statusAtFirstFrame;
  let reads = 0;
  while (true) {
    const { value, done } = await reader.read();
    if (done) break;
    reads += 1;
    text += decoder.decode(value, { stream: true });
    if (statusAtFirstFrame === undefined && text.includes("event: metadata")) {
      const run = await (await fetch(`${server.base}/api/threads/proxied/runs/${runId}`)).json();
      statusAtFirstFrame = run.status;
    }
  }
  assert.ok(
    ["pending", "running"].includes(statusAtFirstFrame),
    `the first frame arrived while the run was ${statusAtFirstFrame}`,
  );
  assert.ok(reads > 1, "the stream came in more than one piece");
  assert.ok(text.includes("event: end"));
  assert.ok(!proxy.gzipped.some((url) => url.includes("/runs/stream")));
});
