//! Repository rules that are checked, not just written down (ARCHITECTURE.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Each workspace crate's normal (non-dev, non-build) dependencies, from `cargo metadata`.
fn workspace_dependencies() -> BTreeMap<String, Vec<String>> {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let dependencies = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .collect();
            (package["name"].as_str().unwrap().to_owned(), dependencies)
        })
        .collect()
}

const ASYNC_DATABASE_OR_HTTP: &[&str] = &[
    "tokio",
    "async-trait",
    "futures",
    "sqlx",
    "rusqlite",
    "axum",
    "hyper",
    "http",
    "tower",
    "tower-http",
    "reqwest",
];
const SQL: &[&str] = &["sqlx", "rusqlite", "tokio-postgres"];
const HTTP_SERVER: &[&str] = &["axum", "hyper", "http", "tower-http"];

#[test]
fn contracts_depend_on_no_internal_async_database_or_http_crate() {
    let deps = &workspace_dependencies()["subflow-contracts"];
    for dep in deps {
        assert!(
            !dep.starts_with("subflow"),
            "subflow-contracts depends on {dep}"
        );
        assert!(
            !ASYNC_DATABASE_OR_HTTP.contains(&dep.as_str()),
            "subflow-contracts depends on {dep}"
        );
    }
}

#[test]
fn only_store_backends_know_sql_and_only_the_binary_picks_one() {
    for (krate, deps) in workspace_dependencies() {
        let is_backend = krate.starts_with("subflow-store-");
        for dep in &deps {
            if SQL.contains(&dep.as_str()) {
                assert!(
                    is_backend,
                    "{krate} depends on {dep}: only subflow-store-* crates know SQL"
                );
            }
            if dep.starts_with("subflow-store-") {
                assert_eq!(
                    krate, "subflow",
                    "{krate} depends on {dep}: only the binary picks a backend"
                );
            }
        }
    }
}

#[test]
fn only_the_gateway_knows_http_serving() {
    for (krate, deps) in workspace_dependencies() {
        for dep in &deps {
            if HTTP_SERVER.contains(&dep.as_str()) {
                assert_eq!(krate, "subflow-gateway", "{krate} depends on {dep}");
            }
        }
    }
}

#[test]
fn runtime_and_batches_reach_storage_only_through_the_store_traits() {
    for (krate, deps) in workspace_dependencies() {
        if krate == "subflow-runtime" || krate == "subflow-batches" {
            for dep in &deps {
                assert!(
                    !dep.starts_with("subflow-store-") && !SQL.contains(&dep.as_str()),
                    "{krate} depends on {dep}"
                );
            }
        }
    }
}

#[test]
fn every_crate_states_its_purpose_and_uses_the_workspace_lints() {
    let crates = root().join("crates");
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains("[lints]\nworkspace = true"),
            "{} does not use the workspace lints",
            dir.display()
        );
        let entry_file = ["src/lib.rs", "src/main.rs"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.exists())
            .unwrap();
        let source = std::fs::read_to_string(&entry_file).unwrap();
        assert!(
            source.starts_with("//!"),
            "{} must open with a //! doc",
            entry_file.display()
        );
    }
}

/// ARCHITECTURE.md stays a map a newcomer reads in minutes; crate detail lives in the
/// crates' own docs.
#[test]
fn the_architecture_map_stays_short() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let length = map.chars().count();
    assert!(length < 16_000, "ARCHITECTURE.md is {length} characters");
    for section in [
        "## Bird's-eye view",
        "## Code map",
        "## Invariants",
        "## Where to start",
    ] {
        assert!(map.contains(section), "ARCHITECTURE.md has {section}");
    }
}

#[test]
fn every_manifest_under_crates_is_a_workspace_member() {
    fn manifests(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                manifests(&path, found);
            } else if path.file_name().is_some_and(|name| name == "Cargo.toml") {
                found.push(path);
            }
        }
    }
    let crates = root().join("crates");
    let mut found = Vec::new();
    manifests(&crates, &mut found);
    for manifest in found {
        let member = manifest.parent().unwrap();
        assert_eq!(
            member.parent(),
            Some(crates.as_path()),
            "{} is not a crate's manifest (crates/<name>/Cargo.toml)",
            manifest.display()
        );
    }
}

#[test]
fn the_readme_test_command_is_what_ci_runs() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let first_screen: String = readme.lines().take(40).collect::<Vec<_>>().join("\n");
    assert!(
        first_screen.contains("cargo run --release -- serve"),
        "README's first screen gives the run command"
    );
    assert!(
        first_screen.contains("scripts/verify"),
        "README's first screen gives the test command"
    );
    for (needle, what) in [
        (
            "cargo install --path crates/subflow --locked",
            "how to put subflow on the PATH",
        ),
        ("assistant_id = \"lead_agent\"", "the SDKs' assistant id"),
        ("[[models]]", "a real model's configuration"),
        ("](docs/workspace.png)", "the workspace's screenshot"),
    ] {
        assert!(
            first_screen.contains(needle),
            "README's first screen gives {what}"
        );
    }
    assert!(
        root().join("docs/workspace.png").is_file(),
        "the screenshot the browser tests write is committed"
    );
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(
        ci.contains("scripts/verify"),
        ".ci/run calls the README's test command"
    );
    for setup in ["apt-get", "npm", "pg_ctlcluster"] {
        assert!(
            !ci.contains(setup),
            ".ci/run only calls scripts/verify, which sets up ({setup}) itself"
        );
    }
}

#[test]
fn gateway_handlers_take_paths_and_queries_through_the_json_extractors() {
    // axum's own `Path` and `Query` reject with plain-text 400s; `extract.rs` wraps them
    // so every rejection is a `{"detail": ...}` 422.
    fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    let src = root().join("crates/subflow-gateway/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 10);
    for file in files.iter().filter(|f| !f.ends_with("extract.rs")) {
        let text = std::fs::read_to_string(file).unwrap();
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("use axum::extract"))
        {
            let names = line.split(['{', '}', ',', ':', ';', ' ']);
            assert!(
                !names
                    .into_iter()
                    .any(|name| name == "Path" || name == "Query"),
                "{}: {line} (use crate::extract::{{Path, Query}})",
                file.display()
            );
        }
    }
}

/// The repository's tracked files by path relative to the root, with their text (None
/// for binary files).
fn tracked_files() -> BTreeMap<String, Option<String>> {
    let output = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("git ls-files runs");
    assert!(output.status.success());
    String::from_utf8(output.stdout)
        .unwrap()
        .split('\0')
        .filter(|path| !path.is_empty())
        .map(|path| {
            let text = std::fs::read(root().join(path))
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok());
            (path.to_owned(), text)
        })
        .collect()
}

/// The anchors GitHub gives a Markdown file's headings: lowercased, spaces to `-`, every
/// character but letters, digits, `-` and `_` dropped.
fn heading_anchors(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut anchors = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        anchors.push(
            title
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect(),
        );
    }
    anchors
}

/// Every cited `docs/….md#anchor`, repository path and relative Markdown link names a
/// file (and heading) the repository holds, and nothing cites a numbered section of a
/// document outside it.
#[test]
fn every_reference_points_at_something_in_the_repository() {
    let files = tracked_files();
    let path_pattern = regex::Regex::new(
        r"\b((?:crates|web|scripts|contracts|docs|\.ci)/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.(?:rs|mjs|md|json|sql|toml|css|html|png|py|txt|sh))(#[a-z0-9_-]+)?",
    )
    .unwrap();
    let link_pattern = regex::Regex::new(r"\]\(([^)\s:#]*)(#[a-z0-9_-]+)?\)").unwrap();
    let section_pattern = regex::Regex::new(r"§\s*\d|\.\./shared/").unwrap();
    let check = |from: &str, target: &str, anchor: Option<&str>| -> Option<String> {
        if target.contains("node_modules/") {
            return None; // installed by scripts/setup, not tracked
        }
        let Some(text) = files.get(target) else {
            return (!root().join(target).is_dir())
                .then(|| format!("{from}: {target} is not in the repository"));
        };
        let anchor = anchor.filter(|_| target.ends_with(".md"))?;
        let text = text.as_deref().unwrap_or_default();
        (!heading_anchors(text).iter().any(|a| *a == anchor[1..]))
            .then(|| format!("{from}: {target} has no heading {anchor}"))
    };
    let mut broken = Vec::new();
    for (path, text) in &files {
        let Some(text) = text else { continue };
        for (number, line) in text.lines().enumerate() {
            let at = format!("{path}:{}", number + 1);
            if section_pattern.is_match(line) {
                broken.push(format!("{at}: cites a section outside the repository"));
            }
            for found in path_pattern.captures_iter(line) {
                broken.extend(check(&at, &found[1], found.get(2).map(|m| m.as_str())));
            }
            if path.ends_with(".md") {
                for found in link_pattern.captures_iter(line) {
                    let target = if found[1].is_empty() {
                        path.clone()
                    } else {
                        normalise(&Path::new(path).parent().unwrap().join(&found[1]))
                    };
                    broken.extend(check(&at, &target, found.get(2).map(|m| m.as_str())));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken references:\n{}",
        broken.join("\n")
    );
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalise(path: &Path) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.to_str().unwrap().split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}
