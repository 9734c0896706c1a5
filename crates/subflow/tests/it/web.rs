//! The embedded web workspace as `subflow serve` serves it (docs/configuration.md#subagents-and-tools, docs/operations.md#trace-ids).

use std::io::{Read, Write};

use crate::cli::start_serve_with_env;
use crate::client::KillOnDrop;

/// A raw HTTP/1.1 response: status, header lines (lowercased names) and body.
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Raw {
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn one(&self, name: &str) -> &str {
        let values = self.all(name);
        assert_eq!(values.len(), 1, "exactly one {name}: {:?}", self.headers);
        values[0]
    }
}

fn request(address: &str, method: &str, path: &str, extra: &str) -> Raw {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    Raw {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn get(address: &str, path: &str) -> Raw {
    request(address, "GET", path, "")
}

#[test]
fn the_workspace_is_served_at_the_root_and_for_its_own_paths_with_one_trace_id() {
    let dir = tempfile::tempdir().unwrap();
    let (child, address, _lines) = start_serve_with_env(dir.path(), &[], &[]);
    let _server = KillOnDrop(child);

    let index = get(&address, "/");
    assert_eq!(index.status, 200);
    assert_eq!(index.one("content-type"), "text/html; charset=utf-8");
    assert_eq!(index.one("x-trace-id").len(), 32);
    assert!(
        index
            .one("content-security-policy")
            .contains("script-src 'self'")
    );
    assert!(
        index
            .body
            .contains(r#"<script type="module" src="/app.mjs">"#)
    );

    // A workspace path that names no file gets the index, so a reload keeps the thread.
    let deep = get(&address, "/threads/some-thread");
    assert_eq!(deep.status, 200);
    assert_eq!(deep.body, index.body);
    assert_eq!(deep.one("x-trace-id").len(), 32);

    for (path, content_type, marker) in [
        ("/app.mjs", "text/javascript; charset=utf-8", "import"),
        (
            "/cards.mjs",
            "text/javascript; charset=utf-8",
            "export function cardView",
        ),
        (
            "/style.css",
            "text/css; charset=utf-8",
            "prefers-color-scheme",
        ),
    ] {
        let asset = get(&address, path);
        assert_eq!(asset.status, 200, "{path}");
        assert_eq!(asset.one("content-type"), content_type, "{path}");
        assert_eq!(asset.one("x-content-type-options"), "nosniff");
        assert_eq!(asset.one("x-trace-id").len(), 32, "{path}");
        assert!(asset.body.contains(marker), "{path}");
    }

    // An unchanged file revalidates to a 304, which carries its trace id too.
    let etag = get(&address, "/cards.mjs").one("etag").to_owned();
    let cached = request(
        &address,
        "GET",
        "/cards.mjs",
        &format!("If-None-Match: {etag}\r\n"),
    );
    assert_eq!(cached.status, 304);
    assert!(cached.body.is_empty());
    assert_eq!(cached.one("x-trace-id").len(), 32);

    // A client's trace id is echoed on assets as on the API.
    let traced = request(&address, "GET", "/style.css", "X-Trace-Id: asset-trace\r\n");
    assert_eq!(traced.one("x-trace-id"), "asset-trace");

    // The API, metrics and health keep their own answers.
    let api = get(&address, "/api/no-such-route");
    assert_eq!(api.status, 404);
    assert_eq!(api.one("content-type"), "application/json");
    assert_eq!(api.body, r#"{"detail":"Not Found"}"#);
    let health = get(&address, "/health");
    assert_eq!(health.body, r#"{"status":"ok"}"#);
    assert_eq!(get(&address, "/health/x").status, 404);

    // Pages are read, never written.
    assert_eq!(request(&address, "DELETE", "/", "").status, 404);
}

#[test]
fn web_enabled_false_serves_no_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let (child, address, _lines) =
        start_serve_with_env(dir.path(), &[], &[("SUBFLOW__WEB__ENABLED", "false")]);
    let _server = KillOnDrop(child);
    for path in ["/", "/app.mjs", "/threads/t"] {
        let answer = get(&address, path);
        assert_eq!(answer.status, 404, "{path}");
        assert_eq!(answer.body, r#"{"detail":"Not Found"}"#);
        assert_eq!(answer.one("x-trace-id").len(), 32);
    }
    assert_eq!(get(&address, "/health").status, 200);
}
