//! Every file and folder `docs/architecture.md` names exists, so the map stays true as files
//! move.
//!
//! A *path* is a token between single backticks on one line, outside fenced code blocks, that
//! has no whitespace, is no URL (no `://`), is not one of [`NOT_PATHS`], and contains `/` or
//! ends in `.rs`, `.md`, `.sql`, `.toml`, `.sh` or `.py`. A path resolves when it exists
//! relative to one of these folders:
//!
//! 1. the workspace root, for every path (`tests/faults.rs`, `runtime/migrations/`);
//! 2. in a row of the table under the heading "Module map": `runtime/src/`, and the folder of
//!    each path in the row's first cell (`runtime/src/store/sql/` for `store/sql/`,
//!    `runtime/src/engine/` for `engine/attempt.rs`): in the `store/sql/` row, `row.rs` is
//!    `runtime/src/store/sql/row.rs`; in the `engine/attempt.rs` row, `attempt/stopped.rs` is
//!    `runtime/src/engine/attempt/stopped.rs`;
//! 3. in a paragraph (lines between blank lines) that names `macros/`: `macros/src/`.
//!
//! A path ending in `/` must be a folder. A `*` in a path's last part stands for any run of
//! characters, and the path resolves when some entry of its folder matches (`*_tests.rs`).

use std::path::{Path, PathBuf};

/// Backticked tokens with a `/` that are MCP method names, not paths.
const NOT_PATHS: &[&str] = &[
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/cancel",
    "notifications/cancelled",
];

const EXTENSIONS: &[&str] = &[".rs", ".md", ".sql", ".toml", ".sh", ".py"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// One path the document names, with the folders it may be relative to besides the root.
struct Named {
    line: usize,
    path: String,
    bases: Vec<PathBuf>,
}

fn looks_like_a_path(token: &str) -> bool {
    !token.is_empty()
        && !token.contains(char::is_whitespace)
        && !token.contains("://")
        && !NOT_PATHS.contains(&token)
        && (token.contains('/') || EXTENSIONS.iter().any(|e| token.ends_with(e)))
}

/// The tokens between single backticks on `line`.
fn backticked(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// The folders, under `runtime/src/`, of the paths in a module-map row's first cell.
fn row_bases(row: &str, src: &Path) -> Vec<PathBuf> {
    let first = row.trim_start_matches('|').split('|').next().unwrap_or("");
    let mut bases = vec![src.to_path_buf()];
    for token in backticked(first).filter(|t| looks_like_a_path(t)) {
        let named = src.join(token);
        if token.ends_with('/') {
            bases.push(named);
        } else if let Some(parent) = named.parent() {
            bases.push(parent.to_path_buf());
        }
    }
    bases
}

/// Every path `doc` names, by the rules of the module's doc comment.
fn named_paths(doc: &str, root: &Path) -> Vec<Named> {
    let src = root.join("runtime/src");
    let macros = root.join("macros/src");
    let lines: Vec<&str> = doc.lines().collect();
    let mut found = Vec::new();
    let (mut fenced, mut module_map) = (false, false);
    let mut paragraph_names_macros = false;
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.starts_with('#') {
            module_map = line.contains("Module map");
        }
        // At a paragraph's first line, look ahead to its end for `macros/`.
        if i == 0 || lines[i - 1].trim().is_empty() {
            paragraph_names_macros = lines[i..]
                .iter()
                .take_while(|l| !l.trim().is_empty())
                .any(|l| l.contains("`macros/`"));
        }
        let mut bases = Vec::new();
        if module_map && line.starts_with('|') {
            bases.extend(row_bases(line, &src));
        }
        if paragraph_names_macros {
            bases.push(macros.clone());
        }
        for token in backticked(line).filter(|t| looks_like_a_path(t)) {
            found.push(Named {
                line: i + 1,
                path: token.to_owned(),
                bases: bases.clone(),
            });
        }
    }
    found
}

/// Whether `path` exists under `base`: a folder if it ends in `/`, and with one `*` in its last
/// part matching any run of characters.
fn exists_under(base: &Path, path: &str) -> bool {
    let full = base.join(path.trim_end_matches('/'));
    let name = full.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if let Some((prefix, suffix)) = name.split_once('*') {
        let Some(folder) = full.parent() else {
            return false;
        };
        let Ok(entries) = std::fs::read_dir(folder) else {
            return false;
        };
        return entries.filter_map(Result::ok).any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.len() >= prefix.len() + suffix.len() && n.starts_with(prefix) && n.ends_with(suffix)
        });
    }
    if path.ends_with('/') {
        full.is_dir()
    } else {
        full.exists()
    }
}

/// The named paths that resolve under none of their folders, as "line N: `path`".
fn dead(named: &[Named], root: &Path) -> Vec<String> {
    named
        .iter()
        .filter(|n| {
            !exists_under(root, &n.path) && !n.bases.iter().any(|b| exists_under(b, &n.path))
        })
        .map(|n| format!("line {}: `{}`", n.line, n.path))
        .collect()
}

#[test]
fn every_path_in_the_architecture_doc_exists() {
    let root = workspace();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("read the doc");
    let named = named_paths(&doc, &root);
    assert!(
        named.len() > 100,
        "only {} paths found in docs/architecture.md: is the extraction broken?",
        named.len()
    );
    let dead = dead(&named, &root);
    assert!(
        dead.is_empty(),
        "docs/architecture.md names {} path(s) that do not exist (see runtime/src/doc_paths.rs \
         for how a path is resolved):\n{}",
        dead.len(),
        dead.join("\n")
    );
}

#[test]
fn the_rules_resolve_rows_and_paragraphs_and_report_what_is_missing() {
    let root = workspace();
    let doc = "\
## Module map of `runtime/src`

| `engine/attempt.rs` | the attempt; `attempt/stopped.rs`; `lib.rs`; `engine/gone.rs` |
| `store/sql/` | `row.rs`, `fence.rs`; `tasks/get` is a method |

## Elsewhere

`tests/faults.rs`, `row.rs` (no row here), `runtime/migrations/`, `https://x.y/z.md`
```text
`not/checked.rs`
```

The attribute is `macros/`: `attr.rs`, `*_tests.rs`, `*_nothing.rs`.
";
    let named = named_paths(doc, &root);
    let paths: Vec<&str> = named.iter().map(|n| n.path.as_str()).collect();
    assert!(!paths.contains(&"tasks/get") && !paths.contains(&"not/checked.rs"));
    assert!(!paths.iter().any(|p| p.contains("://")));
    assert_eq!(
        dead(&named, &root),
        [
            "line 3: `engine/gone.rs`",
            "line 8: `row.rs`",
            "line 13: `*_nothing.rs`"
        ]
    );
}
