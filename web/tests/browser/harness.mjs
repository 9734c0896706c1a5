// What the browser tests share: a real `subflow serve` (the debug binary) on a free
// loopback port, Debian's chromium driven by playwright-core, a cuttable TCP proxy, the
// artifacts directory for screenshots and the README's picture of the workspace.

import { spawn, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

export const REPO = fileURLToPath(new URL("../../../", import.meta.url));
// Resolved now: the server runs in its own directory.
export const BINARY = resolve(process.env.SUBFLOW_BIN ?? join(REPO, "target/debug/subflow"));
export const CHROMIUM = process.env.SUBFLOW_CHROMIUM ?? "/usr/bin/chromium";
export const ARTIFACTS = process.env.SUBFLOW_WEB_ARTIFACTS ?? join(REPO, "test-artifacts/web");

const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** The scripted model's section of a config file, pacing the demo plan by `delayMs`. */
export function scriptedModel({ delayMs = 40, script = null } = {}) {
  const lines = ["[[models]]", 'name = "scripted"', 'provider = "scripted"', 'model = "scripted-1"', `demo_delay_ms = ${delayMs}`];
  if (script !== null) lines.push(`script = ${JSON.stringify(script)}`);
  return `${lines.join("\n")}\n`;
}

/** Runs the binary to completion in `dir` (for `users` and `tokens`); returns stdout. */
export function subflowCli(dir, args) {
  const result = spawnSync(BINARY, args, { cwd: dir, encoding: "utf8", env: cleanEnv() });
  if (result.status !== 0) throw new Error(`subflow ${args.join(" ")} failed: ${result.stderr}`);
  return result.stdout;
}

function cleanEnv(extra = {}) {
  const env = { ...process.env, ...extra };
  for (const key of Object.keys(env)) {
    if (key.startsWith("SUBFLOW__") && !(key in extra)) delete env[key];
  }
  delete env.SUBFLOW_CONFIG;
  return env;
}

/**
 * Starts `subflow serve` on 127.0.0.1:0 in a fresh directory with `config` as its
 * subflow.toml and `args` after it (e.g. `--no-worker`); resolves once it listens.
 * `prepare(dir)` runs first (e.g. to add tokens).
 */
export async function startServer({ config = scriptedModel(), env = {}, prepare = null, args = [] } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "subflow-web-"));
  writeFileSync(join(dir, "subflow.toml"), config);
  if (prepare !== null) prepare(dir);
  const child = spawn(BINARY, ["serve", "--listen", "127.0.0.1:0", "--config", join(dir, "subflow.toml"), ...args], {
    cwd: dir,
    env: cleanEnv(env),
    stdio: ["ignore", "ignore", "pipe"],
  });
  let log = "";
  const address = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start:\n${log}`)), 30000);
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (text) => {
      log += text;
      // Only a whole line: stderr may arrive in pieces that end inside the address.
      const match = /listening on http:\/\/(\S+)[ \n]/.exec(log);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`serve exited with ${code}:\n${log}`));
    });
    child.on("error", (error) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${BINARY}: ${error.message}`));
    });
  });
  const [host, port] = [address.slice(0, address.lastIndexOf(":")), Number(address.slice(address.lastIndexOf(":") + 1))];
  return {
    dir,
    host,
    port,
    base: `http://${address}`,
    log: () => log,
    async stop() {
      child.kill("SIGTERM");
      await new Promise((resolve) => (child.exitCode !== null ? resolve() : child.once("exit", resolve)));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** JSON over HTTP to the server, outside the browser. */
export async function api(server, path, { method = "GET", body, token } = {}) {
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(`${server.base}${path}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text === "" ? null : JSON.parse(text);
}

/** A fresh headless chromium with its own profile; `options` go to the browser context. */
export async function openBrowser(options = {}) {
  const profile = mkdtempSync(join(tmpdir(), "subflow-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1280, height: 800 },
    ...options,
  });
  const page = context.pages()[0] ?? (await context.newPage());
  const errors = [];
  page.on("pageerror", (error) => errors.push(error.message));
  return {
    context,
    page,
    errors,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** Saves a full-page screenshot under the artifacts directory. */
export async function screenshot(page, name) {
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

/**
 * Saves the visible window as `<name>.png`, a picture the README shows: into `docs/` when
 * SUBFLOW_UPDATE_DOCS=1, so an ordinary test run leaves the tree as it was, and under the
 * artifacts directory otherwise.
 */
export async function docsScreenshot(page, name) {
  const dir = process.env.SUBFLOW_UPDATE_DOCS === "1" ? join(REPO, "docs") : join(ARTIFACTS, "docs");
  mkdirSync(dir, { recursive: true });
  await page.screenshot({ path: join(dir, `${name}.png`) });
}

/**
 * A TCP proxy to the server whose open connections can be cut at once, to make a
 * browser's stream break mid-run. `requests` lists the request heads it saw.
 */
export async function startProxy(server) {
  const sockets = new Set();
  const requests = [];
  const proxy = net.createServer((client) => {
    const upstream = net.connect(server.port, server.host);
    sockets.add(client);
    sockets.add(upstream);
    client.on("data", (chunk) => {
      const text = chunk.toString("latin1");
      if (/^[A-Z]+ \S+ HTTP\/1\.1\r\n/.test(text)) requests.push(text.slice(0, text.indexOf("\r\n\r\n")));
    });
    client.pipe(upstream).pipe(client);
    const forget = () => {
      sockets.delete(client);
      sockets.delete(upstream);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", forget);
    upstream.on("error", forget);
    client.on("close", forget);
    upstream.on("close", forget);
  });
  await new Promise((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  return {
    base: `http://127.0.0.1:${proxy.address().port}`,
    requests,
    cut() {
      for (const socket of sockets) socket.destroy();
      sockets.clear();
    },
    close: () => new Promise((resolve) => proxy.close(resolve)),
  };
}

/** Types a prompt into the composer and sends it with Enter. */
export async function send(page, text) {
  await page.fill("#composer-input", text);
  await page.press("#composer-input", "Enter");
}

/** Waits for the workspace to have loaded its thread. */
export async function ready(page) {
  try {
    await page.waitForSelector("html[data-ready=true]", { state: "attached" });
  } catch (error) {
    const seen = await page
      .evaluate(() => ({
        readyState: document.readyState,
        resources: performance.getEntriesByType("resource").map((e) => `${e.name} ${e.responseStatus} ${Math.round(e.duration)}ms`),
        text: document.body?.innerText.slice(0, 400),
      }))
      .catch((e) => String(e));
    throw new Error(`the workspace did not load: ${error.message}\n${JSON.stringify(seen, null, 1)}`);
  }
}

/** Each card's `{id, status, header, steps, tokens}` as shown. */
export function cards(page) {
  return page.$$eval(".task-card", (elements) =>
    elements.map((card) => ({
      id: card.dataset.taskId,
      status: card.dataset.status,
      header: card.querySelector(".card-header-text").textContent,
      steps: card.querySelector(".step-count").textContent,
      tokens: card.querySelector(".token-label").hidden ? null : card.querySelector(".token-label").textContent,
    })),
  );
}

/** Waits until no run is followed: the Stop button is hidden again. */
export async function runEnded(page, timeout = 60000) {
  await page.waitForFunction(() => document.getElementById("stop").hidden, null, { timeout });
}
