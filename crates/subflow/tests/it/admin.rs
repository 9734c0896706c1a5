//! `subflow users` and `subflow tokens` over a real SQLite file, and their tokens
//! against a real `subflow serve` in token mode (docs/api.md#auth-and-ownership).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use subflow_contracts::auth::{is_well_formed_token, token_digest};

use crate::cli::start_serve_with_env;

fn subflow(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_subflow"))
        .args(args)
        .current_dir(dir)
        .env_remove("SUBFLOW__DATABASE__URL")
        .env_remove("SUBFLOW_CONFIG")
        .env_remove("SUBFLOW__AUTH__MODE")
        .output()
        .expect("the subflow binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs a command that must succeed; returns its stdout.
fn ok(args: &[&str], dir: &Path) -> String {
    let output = subflow(args, dir);
    assert!(
        output.status.success(),
        "{args:?}: {}{}",
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// Runs a command that must fail with exit code 2 and say `message` on stderr.
fn usage_error(args: &[&str], dir: &Path, message: &str) {
    let output = subflow(args, dir);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{args:?}: {}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains(message),
        "{args:?}: expected {message:?} in {}",
        stderr(&output)
    );
    assert!(output.stdout.is_empty(), "{args:?}: {}", stdout(&output));
}

/// A directory whose default database `subflow migrate` has created.
fn migrated_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    ok(&["migrate"], dir.path());
    dir
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Every byte the database keeps: the file and its write-ahead log.
fn database_bytes(dir: &Path) -> Vec<u8> {
    ["subflow.db", "subflow.db-wal", "subflow.db-shm"]
        .iter()
        .filter_map(|name| std::fs::read(dir.join(name)).ok())
        .flatten()
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// A raw HTTP/1.1 request over loopback with an optional bearer token; returns the
/// status and the body.
fn request(
    address: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn users_are_added_listed_and_disabled_by_name_or_id() {
    let dir = migrated_dir();
    let ana_id = ok(&["users", "add", "ana"], dir.path()).trim().to_owned();
    assert_eq!(ana_id.len(), 36, "the new user's id: {ana_id}");
    let bo = json(&ok(
        &["users", "add", "bo@example.com", "--json"],
        dir.path(),
    ));
    assert_eq!(bo["name"], "bo@example.com");
    assert_eq!(bo["disabled"], false);
    usage_error(
        &["users", "add", "ana"],
        dir.path(),
        "user 'ana' already exists",
    );
    usage_error(
        &["users", "add", "two words"],
        dir.path(),
        "invalid user name 'two words'",
    );

    let listed = ok(&["users", "list"], dir.path());
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("NAME"));
    assert!(lines[1].starts_with(&ana_id) && lines[1].contains(" ana "));
    assert!(lines[1].contains("active"));
    assert!(lines[2].contains("bo@example.com"));

    ok(&["users", "disable", "bo@example.com"], dir.path());
    ok(&["users", "disable", &ana_id], dir.path());
    usage_error(
        &["users", "disable", "nobody"],
        dir.path(),
        "no user is named or has the id 'nobody'",
    );
    let users = json(&ok(&["users", "list", "--json"], dir.path()));
    let disabled: Vec<&Value> = users
        .as_array()
        .unwrap()
        .iter()
        .map(|u| &u["disabled"])
        .collect();
    assert_eq!(disabled, [&Value::Bool(true), &Value::Bool(true)]);
}

#[test]
fn bad_token_flags_say_what_to_fix_exit_2_and_create_nothing() {
    let dir = migrated_dir();
    ok(&["users", "add", "ana"], dir.path());
    ok(&["users", "add", "gone"], dir.path());
    ok(&["users", "disable", "gone"], dir.path());
    let create = |extra: &[&str]| {
        let mut args = vec!["tokens", "create"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    for (args, message) in [
        (
            create(&["--user", "ana", "--perm", "runs:read,runs:delete"]),
            "--perm: unknown permission 'runs:delete'; give a comma-separated list of threads:read, threads:write, runs:read, runs:write, admin",
        ),
        (
            create(&["--user", "ana", "--perm", "runs:read", "--expires", "30x"]),
            "--expires: expected a positive number followed by s, m, h, d or w",
        ),
        (
            create(&["--user", "ana", "--perm", "runs:read", "--expires", "0d"]),
            "--expires: expected a positive number",
        ),
        (
            create(&["--user", "nobody", "--perm", "runs:read"]),
            "no user is named or has the id 'nobody'",
        ),
        (
            create(&["--user", "gone", "--perm", "runs:read"]),
            "user gone is disabled",
        ),
        (
            create(&[
                "--user",
                "ana",
                "--perm",
                "admin",
                "--name",
                &"n".repeat(129),
            ]),
            "a token name has at most 128 characters",
        ),
        (
            vec!["tokens".into(), "revoke".into(), "no-such-id".into()],
            "no token has the id 'no-such-id'",
        ),
        (
            vec![
                "tokens".into(),
                "list".into(),
                "--user".into(),
                "nobody".into(),
            ],
            "no user is named or has the id 'nobody'",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        usage_error(&args, dir.path(), message);
    }
    let missing = subflow(&["tokens", "create", "--user", "ana"], dir.path());
    assert_eq!(missing.status.code(), Some(2), "--perm is required");
    assert!(stderr(&missing).contains("--perm"));
    assert_eq!(
        json(&ok(&["tokens", "list", "--json"], dir.path())),
        serde_json::json!([])
    );
}

#[test]
fn a_created_token_is_shown_once_hashed_at_rest_and_authenticates_until_revoked() {
    let dir = migrated_dir();
    ok(&["users", "add", "ana"], dir.path());
    let created = subflow(
        &[
            "tokens",
            "create",
            "--user",
            "ana",
            "--perm",
            "runs:read,threads:read",
            "--expires",
            "30d",
            "--name",
            "ci",
        ],
        dir.path(),
    );
    assert!(created.status.success(), "{}", stderr(&created));
    let token = stdout(&created).trim().to_owned();
    assert_eq!(
        stdout(&created),
        format!("{token}\n"),
        "stdout is the token alone"
    );
    assert!(is_well_formed_token(&token), "{token}");
    assert!(
        stderr(&created).contains("shown only now"),
        "{}",
        stderr(&created)
    );
    assert!(!stderr(&created).contains(&token));

    // Stored only as its digest.
    let bytes = database_bytes(dir.path());
    assert!(
        contains(&bytes, &token_digest(&token)),
        "the digest is in the database"
    );
    assert!(
        !contains(&bytes, &token),
        "the token is not stored in plain text"
    );
    assert!(!contains(&bytes, &token[3..]), "nor its secret part");

    // Listing shows metadata, never the token.
    let listed = ok(&["tokens", "list"], dir.path());
    assert!(!listed.contains(&token[3..]), "{listed}");
    assert!(listed.contains("threads:read,runs:read"), "{listed}");
    assert!(
        listed.contains(" ci ") && listed.contains(" ana "),
        "{listed}"
    );
    let listed = json(&ok(
        &["tokens", "list", "--user", "ana", "--json"],
        dir.path(),
    ));
    let record = &listed[0];
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert!(record.get("token").is_none());
    assert!(!record.to_string().contains(&token[3..]));
    assert_eq!(record["status"], "active");
    assert_eq!(
        record["permissions"],
        serde_json::json!(["threads:read", "runs:read"])
    );
    assert!(record["expires_at"].as_str().unwrap() > record["created_at"].as_str().unwrap());
    let token_id = record["id"].as_str().unwrap().to_owned();
    let other = ok(
        &["tokens", "create", "--user", "ana", "--perm", "admin"],
        dir.path(),
    )
    .trim()
    .to_owned();

    // The token authenticates against a real gateway in token mode.
    let (mut child, address, _lines) =
        start_serve_with_env(dir.path(), &[], &[("SUBFLOW__AUTH__MODE", "token")]);
    let (status, body) = request(&address, "GET", "/api/models", None, "");
    assert_eq!(status, 401, "{body}");
    assert_eq!(body, r#"{"detail":"Authentication required"}"#);
    let (status, body) = request(&address, "GET", "/api/threads/t1/runs", Some(&token), "");
    assert_eq!((status, body.as_str()), (200, "[]"));
    let (status, body) = request(&address, "POST", "/api/threads", Some(&token), "{}");
    assert_eq!(status, 403);
    assert_eq!(body, r#"{"detail":"Permission denied: threads:write"}"#);

    // Revoking it makes it 401 at once; the user's other token still works.
    let revoked = subflow(&["tokens", "revoke", &token_id], dir.path());
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    assert!(stderr(&revoked).contains("revoked token"));
    let (status, _) = request(&address, "GET", "/api/threads/t1/runs", Some(&token), "");
    assert_eq!(status, 401);
    let (status, _) = request(&address, "GET", "/api/threads/t1/runs", Some(&other), "");
    assert_eq!(status, 200);

    // Disabling the user refuses its remaining token too.
    ok(&["users", "disable", "ana"], dir.path());
    let (status, _) = request(&address, "GET", "/api/threads/t1/runs", Some(&other), "");
    assert_eq!(status, 401);
    let statuses: Vec<String> = json(&ok(&["tokens", "list", "--json"], dir.path()))
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses, ["revoked", "user disabled"]);

    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn users_and_tokens_use_the_database_of_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("custom.toml"),
        "[database]\nurl = 'sqlite://elsewhere.db'\n",
    )
    .unwrap();
    ok(&["migrate", "--config", "custom.toml"], dir.path());
    ok(
        &["users", "add", "ana", "--config", "custom.toml"],
        dir.path(),
    );
    assert!(dir.path().join("elsewhere.db").exists());
    assert!(!dir.path().join("subflow.db").exists());
    let listed = ok(&["users", "list", "--config", "custom.toml"], dir.path());
    assert!(listed.contains(" ana "), "{listed}");
    ok(
        &["migrate", "--database-url", "sqlite://flag.db"],
        dir.path(),
    );
    let flag = ok(
        &["users", "list", "--database-url", "sqlite://flag.db"],
        dir.path(),
    );
    assert_eq!(flag.lines().count(), 1, "an empty database lists no user");
    usage_error(
        &["users", "list", "--config", "missing.toml"],
        dir.path(),
        "missing.toml",
    );
}

#[test]
fn admin_commands_where_no_database_exists_create_none_and_say_to_run_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let default = dir.path().canonicalize().unwrap().join("subflow.db");
    for args in [
        &["users", "list"][..],
        &["users", "add", "ana"],
        &["users", "disable", "ana"],
        &["tokens", "list"],
        &["tokens", "create", "--user", "ana", "--perm", "admin"],
        &["tokens", "revoke", "some-id"],
    ] {
        let output = subflow(args, dir.path());
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
        assert!(
            message.contains(&format!("no database at {}", default.display()))
                && message.contains("subflow migrate"),
            "{args:?}: {message}"
        );
        assert!(output.stdout.is_empty(), "{args:?}: {}", stdout(&output));
    }
    std::fs::write(
        dir.path().join("subflow.toml"),
        "[database]\nurl = 'sqlite://data/admin.db'\n",
    )
    .unwrap();
    usage_error(
        &["users", "list"],
        dir.path(),
        &format!(
            "no database at {}",
            dir.path()
                .canonicalize()
                .unwrap()
                .join("data/admin.db")
                .display()
        ),
    );
    let created: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(created, ["subflow.toml"], "nothing but the configuration");

    // Once migrated, the same command works.
    std::fs::create_dir(dir.path().join("data")).unwrap();
    ok(&["migrate"], dir.path());
    assert_eq!(ok(&["users", "list"], dir.path()).lines().count(), 1);
}
