// The gateway's public API as the workspace uses it: every call carries the session's
// bearer token when there is one, and a 401 asks for a token and retries (docs/api.md#auth-and-ownership).

const TOKEN_KEY = "subflow.token";

/** A failed API call: its status and the gateway's `detail`. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail || `HTTP ${status}`);
    this.status = status;
  }
}

let askToken = async () => null;
let tokenAccepted = () => {};
let pendingAsk = null;

/** Installs what runs when a token the user just entered is accepted by the gateway. */
export function onTokenAccepted(callback) {
  tokenAccepted = callback;
}

/** Installs the prompt that asks for a token; it resolves to the token, or null when dismissed. */
export function onTokenNeeded(prompt) {
  askToken = prompt;
}

export function storedToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

function storeToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage may be disabled; the token then lasts for this page only.
  }
}

/** One prompt at a time: concurrent 401s share it. */
function tokenFromUser(rejected) {
  pendingAsk ??= askToken(rejected).finally(() => {
    pendingAsk = null;
  });
  return pendingAsk;
}

/**
 * `fetch` with the token. On 401 the stored token is dropped, the user is asked for
 * another and the request is sent again; dismissing the prompt gives the 401 response.
 */
export async function apiFetch(path, init = {}) {
  let entered = false;
  for (;;) {
    const token = storedToken();
    const headers = new Headers(init.headers);
    if (token) headers.set("Authorization", `Bearer ${token}`);
    const response = await fetch(path, { ...init, headers });
    if (response.status !== 401) {
      if (entered) tokenAccepted();
      return response;
    }
    storeToken(null);
    const next = await tokenFromUser(token !== null);
    if (!next) return response;
    storeToken(next.trim());
    entered = true;
  }
}

async function detailOf(response) {
  try {
    const body = await response.json();
    return typeof body?.detail === "string" ? body.detail : "";
  } catch {
    return "";
  }
}

/** A JSON call; non-2xx responses throw `ApiError` with the gateway's detail. */
export async function apiJson(path, { method = "GET", body, signal } = {}) {
  const init = { method, signal };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { "Content-Type": "application/json" };
  }
  const response = await apiFetch(path, init);
  if (!response.ok) throw new ApiError(response.status, await detailOf(response));
  if (response.status === 202 || response.status === 204) return null;
  const text = await response.text();
  return text === "" ? null : JSON.parse(text);
}

export { detailOf };

const enc = encodeURIComponent;
export const paths = {
  models: () => "/api/models",
  threads: () => "/api/threads",
  searchThreads: () => "/api/threads/search",
  thread: (t) => `/api/threads/${enc(t)}`,
  state: (t) => `/api/threads/${enc(t)}/state`,
  runs: (t, query = "") => `/api/threads/${enc(t)}/runs${query}`,
  run: (t, r) => `/api/threads/${enc(t)}/runs/${enc(r)}`,
  stream: (t) => `/api/threads/${enc(t)}/runs/stream`,
  rejoin: (t, r, modes) =>
    `/api/threads/${enc(t)}/runs/${enc(r)}/stream?${modes.map((m) => `stream_mode=${enc(m)}`).join("&")}`,
  cancel: (t, r) => `/api/threads/${enc(t)}/runs/${enc(r)}/cancel?action=interrupt`,
  events: (t, r, query) => `/api/threads/${enc(t)}/runs/${enc(r)}/events?${query}`,
  tasks: (t, r) => `/api/threads/${enc(t)}/runs/${enc(r)}/tasks`,
  cancelTask: (t, r, task) => `/api/threads/${enc(t)}/runs/${enc(r)}/tasks/${enc(task)}/cancel`,
  tokenUsage: (t) => `/api/threads/${enc(t)}/token-usage`,
};
