//! The built-in workspace tools (docs/configuration.md#subagents-and-tools): `ls`, `read_file`, `write_file` and
//! `str_replace`, acting inside one thread's workspace directory. A path that escapes
//! the workspace, or a missing file, is a [`ToolError`] returned to the model as an
//! error ToolMessage, never a crash.

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, LazyLock};

use serde_json::{Value, json};
use subflow_contracts::messages::{ToolCall, ToolMessage, ToolStatus};
use subflow_models::ToolSpec;

/// A tool failure, shown to the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

/// The ToolMessage answering `call` with a tool's outcome: its text, or `Error: …`.
pub(crate) fn answer(call: &ToolCall, outcome: Result<String, ToolError>) -> ToolMessage {
    match outcome {
        Ok(text) => ToolMessage::answering(call, text, ToolStatus::Success),
        Err(error) => ToolMessage::answering(call, format!("Error: {error}"), ToolStatus::Error),
    }
}

/// The names of the built-in workspace tools.
pub const BUILTIN_TOOLS: [&str; 4] = ["ls", "read_file", "write_file", "str_replace"];

/// One thread's workspace directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// The workspace of `thread_id` under `base` (`<base>/<thread_id>`).
    pub fn for_thread(base: &Path, thread_id: &str) -> Self {
        Workspace {
            root: base.join(thread_id),
        }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a model-supplied relative path inside the workspace, lexically, so that
    /// `..` can never climb out; a symlink on the way that points outside is refused
    /// too. Only the components below the root are looked at (one `lstat` each); the
    /// canonical paths are worked out only when one of them is a symlink.
    fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        let mut resolved = PathBuf::new();
        for component in Path::new(path.trim()).components() {
            match component {
                Component::Normal(part) => resolved.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !resolved.pop() {
                        return Err(escape(path));
                    }
                }
                Component::RootDir | Component::Prefix(_) => return Err(escape(path)),
            }
        }
        let mut full = self.root.clone();
        let mut parts = resolved.iter();
        for part in parts.by_ref() {
            full.push(part);
            let Ok(meta) = std::fs::symlink_metadata(&full) else {
                // Nothing exists from here on, so nothing further can be a symlink.
                break;
            };
            if meta.file_type().is_symlink() {
                let root = self.root.canonicalize().map_err(io_error)?;
                if !full
                    .canonicalize()
                    .is_ok_and(|real| real.starts_with(&root))
                {
                    return Err(escape(path));
                }
            }
        }
        full.extend(parts);
        Ok(full)
    }

    /// Runs a built-in tool by name; `Err` for unknown tools, bad arguments and failures.
    /// The file system work of a call runs as one blocking task.
    pub async fn run(&self, name: &str, args: &Value) -> Result<String, ToolError> {
        let (workspace, name, args) = (self.clone(), name.to_owned(), args.clone());
        tokio::task::spawn_blocking(move || workspace.run_blocking(&name, &args))
            .await
            .map_err(|error| ToolError(format!("the tool stopped: {error}")))?
    }

    fn run_blocking(&self, name: &str, args: &Value) -> Result<String, ToolError> {
        std::fs::create_dir_all(&self.root)
            .map_err(|e| ToolError(format!("cannot create the workspace: {e}")))?;
        match name {
            "ls" => self.ls(optional_str(args, "path")?.unwrap_or(".")),
            "read_file" => {
                let start = optional_line(args, "start_line")?;
                let end = optional_line(args, "end_line")?;
                self.read_file(required_str(args, "path")?, start, end)
            }
            "write_file" => {
                self.write_file(required_str(args, "path")?, required_str(args, "content")?)
            }
            "str_replace" => self.str_replace(
                required_str(args, "path")?,
                required_str(args, "old")?,
                required_str(args, "new")?,
            ),
            other => Err(ToolError(format!("Unknown tool '{other}'"))),
        }
    }

    fn ls(&self, path: &str) -> Result<String, ToolError> {
        let dir = self.resolve(path)?;
        let entries = std::fs::read_dir(&dir)
            .map_err(|_| ToolError(format!("Directory not found: {path}")))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_error)?;
            let mut name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type().map_err(io_error)?.is_dir() {
                name.push('/');
            }
            names.push(name);
        }
        names.sort();
        Ok(if names.is_empty() {
            "(empty directory)".to_owned()
        } else {
            names.join("\n")
        })
    }

    fn read_file(
        &self,
        path: &str,
        start: Option<usize>,
        end: Option<usize>,
    ) -> Result<String, ToolError> {
        let file = self.resolve(path)?;
        let text = std::fs::read_to_string(&file)
            .map_err(|_| ToolError(format!("File not found: {path}")))?;
        if start.is_none() && end.is_none() {
            return Ok(text);
        }
        let first = start.unwrap_or(1).max(1);
        let last = end.unwrap_or(usize::MAX);
        if last < first {
            return Err(ToolError(format!(
                "end_line {last} is before start_line {first}"
            )));
        }
        Ok(text
            .lines()
            .skip(first - 1)
            .take(last - first + 1)
            .collect::<Vec<_>>()
            .join("\n"))
    }

    fn write_file(&self, path: &str, content: &str) -> Result<String, ToolError> {
        let file = self.resolve(path)?;
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(io_error)?;
        }
        std::fs::write(&file, content).map_err(io_error)?;
        Ok(format!(
            "Wrote {} characters to {path}",
            content.chars().count()
        ))
    }

    fn str_replace(&self, path: &str, old: &str, new: &str) -> Result<String, ToolError> {
        let file = self.resolve(path)?;
        let text = std::fs::read_to_string(&file)
            .map_err(|_| ToolError(format!("File not found: {path}")))?;
        match text.matches(old).count() {
            0 => Err(ToolError(format!(
                "The text to replace was not found in {path}"
            ))),
            1 => {
                std::fs::write(&file, text.replacen(old, new, 1)).map_err(io_error)?;
                Ok(format!("Replaced 1 occurrence in {path}"))
            }
            n => Err(ToolError(format!(
                "The text to replace appears {n} times in {path}; include more context so it is unique"
            ))),
        }
    }
}

fn escape(path: &str) -> ToolError {
    ToolError(format!("Path '{path}' is outside the workspace"))
}

fn io_error(error: std::io::Error) -> ToolError {
    ToolError(error.to_string())
}

fn required_str<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError(format!("Missing string argument '{key}'")))
}

fn optional_str<'a>(args: &'a Value, key: &str) -> Result<Option<&'a str>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(ToolError(format!("Argument '{key}' must be a string"))),
    }
}

fn optional_line(args: &Value, key: &str) -> Result<Option<usize>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .filter(|line| *line >= 1)
            .map(|line| Some(line as usize))
            .ok_or_else(|| ToolError(format!("Argument '{key}' must be a line number ≥ 1"))),
    }
}

/// The specs of the built-in tools, as offered to models: built once, shared by every
/// agent that is offered them all.
pub fn builtin_specs() -> Arc<[ToolSpec]> {
    static SPECS: LazyLock<Arc<[ToolSpec]>> = LazyLock::new(|| build_builtin_specs().into());
    SPECS.clone()
}

fn build_builtin_specs() -> Vec<ToolSpec> {
    let path = json!({"type": "string", "description": "Path relative to the workspace"});
    vec![
        ToolSpec {
            name: "ls".into(),
            description: "List a directory of the workspace.".into(),
            parameters: json!({"type": "object", "properties": {"path": path}}),
        },
        ToolSpec {
            name: "read_file".into(),
            description:
                "Read a file of the workspace, optionally a line range (1-based, inclusive).".into(),
            parameters: json!({"type": "object", "properties": {"path": path, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}, "required": ["path"]}),
        },
        ToolSpec {
            name: "write_file".into(),
            description: "Create or overwrite a file of the workspace.".into(),
            parameters: json!({"type": "object", "properties": {"path": path, "content": {"type": "string"}}, "required": ["path", "content"]}),
        },
        ToolSpec {
            name: "str_replace".into(),
            description:
                "Replace the one occurrence of `old` with `new` in a file of the workspace.".into(),
            parameters: json!({"type": "object", "properties": {"path": path, "old": {"type": "string"}, "new": {"type": "string"}}, "required": ["path", "old", "new"]}),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::for_thread(dir.path(), "t1");
        (dir, workspace)
    }

    #[tokio::test]
    async fn files_are_written_read_listed_and_edited_inside_the_workspace() {
        let (_dir, ws) = workspace();
        let wrote = ws
            .run(
                "write_file",
                &json!({"path": "notes/a.md", "content": "one\ntwo\nthree"}),
            )
            .await
            .unwrap();
        assert_eq!(wrote, "Wrote 13 characters to notes/a.md");
        assert_eq!(
            ws.run("read_file", &json!({"path": "notes/a.md"}))
                .await
                .unwrap(),
            "one\ntwo\nthree"
        );
        assert_eq!(
            ws.run(
                "read_file",
                &json!({"path": "notes/a.md", "start_line": 2, "end_line": 3})
            )
            .await
            .unwrap(),
            "two\nthree"
        );
        assert_eq!(ws.run("ls", &json!({})).await.unwrap(), "notes/");
        ws.run(
            "str_replace",
            &json!({"path": "notes/a.md", "old": "two", "new": "2"}),
        )
        .await
        .unwrap();
        assert_eq!(
            ws.run("read_file", &json!({"path": "./notes/../notes/a.md"}))
                .await
                .unwrap(),
            "one\n2\nthree"
        );
    }

    #[tokio::test]
    async fn escapes_missing_files_and_bad_arguments_are_tool_errors() {
        let (_dir, ws) = workspace();
        for (name, args, expected) in [
            (
                "read_file",
                json!({"path": "../other/secret"}),
                "Path '../other/secret' is outside the workspace",
            ),
            (
                "write_file",
                json!({"path": "/etc/passwd", "content": "x"}),
                "Path '/etc/passwd' is outside the workspace",
            ),
            (
                "read_file",
                json!({"path": "missing.md"}),
                "File not found: missing.md",
            ),
            ("read_file", json!({}), "Missing string argument 'path'"),
            (
                "read_file",
                json!({"path": "a", "start_line": 0}),
                "Argument 'start_line' must be a line number ≥ 1",
            ),
            (
                "str_replace",
                json!({"path": "missing.md", "old": "a", "new": "b"}),
                "File not found: missing.md",
            ),
            ("rm", json!({}), "Unknown tool 'rm'"),
        ] {
            assert_eq!(
                ws.run(name, &args).await.unwrap_err(),
                ToolError(expected.into()),
                "{name} {args}"
            );
        }
    }

    #[tokio::test]
    async fn a_symlink_out_of_the_workspace_is_refused() {
        let (dir, ws) = workspace();
        std::fs::create_dir_all(ws.root()).unwrap();
        std::fs::write(dir.path().join("outside.txt"), "secret").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside.txt"), ws.root().join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), ws.root().join("up")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("gone"), ws.root().join("dangling")).unwrap();
        for (tool, args) in [
            ("read_file", json!({"path": "link"})),
            // A symlinked directory leading out refuses new files beneath it too.
            (
                "write_file",
                json!({"path": "up/new/planted.txt", "content": "x"}),
            ),
            // A dangling symlink as well: where it would lead is unknown.
            ("write_file", json!({"path": "dangling", "content": "x"})),
        ] {
            let error = ws.run(tool, &args).await.unwrap_err();
            let path = args["path"].as_str().unwrap();
            assert_eq!(error.0, format!("Path '{path}' is outside the workspace"));
        }
        assert!(!dir.path().join("new").exists());
        assert!(!dir.path().join("gone").exists());
        // A symlink that stays inside the workspace is followed.
        std::fs::create_dir_all(ws.root().join("notes")).unwrap();
        std::os::unix::fs::symlink(ws.root().join("notes"), ws.root().join("alias")).unwrap();
        ws.run(
            "write_file",
            &json!({"path": "alias/a.md", "content": "kept"}),
        )
        .await
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.root().join("notes/a.md")).unwrap(),
            "kept"
        );
    }

    #[tokio::test]
    async fn ambiguous_replacements_ask_for_more_context() {
        let (_dir, ws) = workspace();
        ws.run("write_file", &json!({"path": "a", "content": "x x"}))
            .await
            .unwrap();
        let error = ws
            .run("str_replace", &json!({"path": "a", "old": "x", "new": "y"}))
            .await
            .unwrap_err();
        assert!(error.0.contains("appears 2 times"));
    }
}
