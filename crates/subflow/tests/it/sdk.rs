//! The official `langgraph-sdk` Python client against a real `subflow serve`. The client
//! is installed from PyPI into a virtualenv under the target directory, once.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::cli::start_serve;

/// The virtualenv's python, created and filled on first use.
fn sdk_python() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("langgraph-sdk-venv");
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import langgraph_sdk"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        let created = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 runs");
        assert!(
            created.success(),
            "python3 -m venv failed: install Python 3 with the venv module"
        );
        let installed = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "langgraph-sdk"])
            .status()
            .expect("pip runs");
        assert!(
            installed.success(),
            "pip install langgraph-sdk failed: the test needs the PyPI registry"
        );
    }
    python
}

#[test]
fn the_langgraph_sdk_streams_the_demo_run_reads_state_and_joins() {
    let python = sdk_python();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, address, _lines) = start_serve(dir.path(), &[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/sdk/check_demo.py");
    let output = Command::new(python)
        .arg(script)
        .arg(format!("http://{address}/api"))
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .output()
        .unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["frames"]["metadata"], 1);
    assert_eq!(seen["frames"]["end"], 1);
    assert!(seen["frames"]["values"].as_u64().unwrap() >= 2);
    let events = seen["task_events"].as_array().unwrap();
    let count = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!((count("task_started"), count("task_completed")), (3, 3));
    assert!(count("task_running") >= 9);
    assert_eq!(seen["run_status"], "success");
    let messages = seen["state_messages"].as_array().unwrap();
    assert!(
        messages.iter().filter(|m| m["name"] == "task").count() == 3,
        "three task results in the state"
    );
    assert_eq!(
        seen["joined_messages"].as_u64().unwrap() as usize,
        messages.len()
    );
    // `runs.cancel(wait=True)` and `wait=False` are accepted (the SDK raises on a 422)
    // and each cancelled run ends interrupted.
    for wait in ["true", "false"] {
        assert_eq!(
            seen["cancelled"][wait], "interrupted",
            "cancel(wait={wait})"
        );
    }
    // `threads.search(sort_by=, sort_order=, select=)`.
    assert_eq!(
        seen["searched"],
        serde_json::json!([
            ["sdk-a", ["metadata", "thread_id"]],
            ["sdk-b", ["metadata", "thread_id"]],
            ["sdk-c", ["metadata", "thread_id"]],
        ])
    );
}
