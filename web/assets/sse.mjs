// Server-sent events read from a fetch body (docs/api.md#sse-frames): `event`, `data` and `id` fields,
// frames ended by a blank line, `:` comments (heartbeats) skipped. Pure: no network.

/** Splits a text stream into SSE frames `{event, data, id}`; `id` is null when a frame has none. */
export class SseParser {
  constructor() {
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.event = "";
    this.data = [];
    this.hasData = false;
    this.id = null;
  }

  /** Feeds decoded text; returns the frames it completed. */
  push(text) {
    this.buffer += text;
    const frames = [];
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (match === null) break;
      // A lone "\r" at the end may be the first half of "\r\n": wait for more text.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      const frame = this.line(line);
      if (frame !== null) frames.push(frame);
    }
    return frames;
  }

  line(line) {
    if (line === "") {
      const frame = this.hasData ? { event: this.event || "message", data: this.data.join("\n"), id: this.id } : null;
      this.reset();
      return frame;
    }
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") {
      this.data.push(value);
      this.hasData = true;
    } else if (field === "id" && !value.includes("\0")) this.id = value;
    return null;
  }
}

/**
 * Reads a fetch `Response` body as SSE, calling `onFrame({event, data, id})` with `data`
 * parsed as JSON (or the raw text when it is not JSON). Resolves when the body ends;
 * rejects when the connection fails or the request is aborted.
 */
export async function readFrames(response, onFrame) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  const deliver = (frames) => {
    for (const frame of frames) {
      let data = frame.data;
      try {
        data = JSON.parse(frame.data);
      } catch {
        // Not JSON: handed on as text.
      }
      onFrame({ event: frame.event, data, id: frame.id });
    }
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    deliver(parser.push(decoder.decode(value, { stream: true })));
  }
  // An unfinished frame at the end of the body is dropped, as EventSource drops it.
  deliver(parser.push(decoder.decode()));
}
