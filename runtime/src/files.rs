//! The house rules for files, checked by reading the library crates' sources (runtime, macros,
//! options, CLI): no file over 500 lines, and no two files that use each other, even inside one
//! folder (a child's use of its folder's `mod.rs` does not count: that is where it is declared).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 500;

/// Files still over the limit, with the size they may not grow past. Split one, remove its line.
const OVER: &[(&str, usize)] = &[];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// Every `.rs` file under `dir`, at any depth, pushed to `out` (in no set order), less the test
/// modules: a folder named `tests` and a file named `tests.rs` are left out; a `*_tests.rs`
/// file is kept (the rules here leave it out themselves, see [`is_test_file`]). The one walker
/// of the tests that read the sources (`layering.rs` too).
pub(crate) fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// Whether `path` is a file of tests kept beside the code (`*_tests.rs`), which the size and
/// import rules leave out.
fn is_test_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with("_tests.rs"))
}

fn library_files() -> Vec<(String, String)> {
    let root = workspace();
    let mut files = Vec::new();
    for krate in ["runtime", "macros", "options", "cli"] {
        sources(&root.join(krate).join("src"), &mut files);
    }
    files
        .into_iter()
        .filter(|f| !is_test_file(f))
        .map(|f| {
            let rel = f.strip_prefix(&root).expect("in the workspace");
            let rel = rel.to_string_lossy().replace('\\', "/");
            (rel, std::fs::read_to_string(&f).expect("read"))
        })
        .collect()
}

#[test]
fn no_library_file_is_over_500_lines() {
    let files = library_files();
    assert!(files.len() > 100, "only {} files read", files.len());
    let mut over = Vec::new();
    for (rel, text) in &files {
        let lines = text.lines().count();
        let limit = OVER
            .iter()
            .find(|(f, _)| f == rel)
            .map_or(MAX_LINES, |(_, n)| *n);
        if lines > limit {
            over.push(format!("{rel}: {lines} lines (limit {limit})"));
        }
    }
    assert!(over.is_empty(), "split these files: {over:#?}");
    for (f, _) in OVER {
        assert!(
            files.iter().any(|(rel, _)| rel == f),
            "{f} is listed as over the limit but does not exist: remove it from OVER"
        );
    }
}

/// The module path of a file: `runtime/src/store/redis/conn.rs` → `runtime::store::redis::conn`;
/// a `mod.rs`, `lib.rs` or `main.rs` is its folder's module.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    parts.remove(1); // `src`
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The paths `code` names after `super::`, `crate::` and `self::`, each as written
/// (`super::{a, b::c}` gives `super::a` and `super::b::c`).
fn named_paths(code: &str) -> Vec<Vec<String>> {
    fn expand(prefix: &[String], text: &str, out: &mut Vec<Vec<String>>) {
        let (mut depth, mut start) = (0, 0);
        let mut parts = Vec::new();
        for (i, c) in text.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&text[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&text[start..]);
        for part in parts {
            let part = part.trim();
            if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                expand(prefix, inner, out);
                continue;
            }
            let mut path = prefix.to_vec();
            let mut rest = part;
            loop {
                let ident: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if ident.is_empty() {
                    break;
                }
                path.push(ident.clone());
                rest = &rest[ident.len()..];
                match rest.strip_prefix("::") {
                    Some(r) if r.starts_with('{') => {
                        if let Some(end) = matching(r) {
                            expand(&path, &r[1..end], out);
                        }
                        path.clear();
                        break;
                    }
                    Some(r) => rest = r,
                    None => break,
                }
            }
            if !path.is_empty() {
                out.push(path);
            }
        }
    }
    /// Where the path at the start of `s` ends: identifiers joined by `::`, and a final group.
    fn path_end(s: &str) -> usize {
        let mut i = 0;
        loop {
            if s[i..].starts_with('{') {
                return matching(&s[i..]).map_or(i, |m| i + m + 1);
            }
            let ident = s[i..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(s.len() - i);
            i += ident;
            if ident > 0 && s[i..].starts_with("::") {
                i += 2;
            } else {
                return i;
            }
        }
    }
    fn matching(s: &str) -> Option<usize> {
        let mut depth = 0;
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        None
    }
    let mut out = Vec::new();
    for anchor in ["super::", "crate::", "self::"] {
        for (at, _) in code.match_indices(anchor) {
            let before = code[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let head = anchor.trim_end_matches("::").to_owned();
            let rest = &code[at + anchor.len()..];
            expand(&[head], &rest[..path_end(rest)], &mut out);
        }
    }
    out
}

/// The code of a file: comments and its `#[cfg(test)]` tail left out.
fn code_of(text: &str) -> String {
    let code = text.find("#[cfg(test)]").map_or(text, |at| &text[..at]);
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Which files each file uses, by the modules its paths resolve to (the longest prefix that is
/// a file's module). Uses of an ancestor (where the file is declared) are left out.
fn graph(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|(rel, _)| (module_of(rel), rel.clone()))
        .collect();
    let mut edges = BTreeMap::new();
    for (rel, text) in files {
        let own = module_of(rel);
        let mut used = BTreeSet::new();
        for path in named_paths(&code_of(text)) {
            let mut target: Vec<String> = match path[0].as_str() {
                "crate" => vec![own[0].clone()],
                "self" => own.clone(),
                _ => {
                    // `super` of a folder module is its parent's parent.
                    let mut m = own.clone();
                    m.pop();
                    let mut rest = &path[..];
                    while rest.first().is_some_and(|s| s == "super") {
                        rest = &rest[1..];
                        if rest.first().is_some_and(|s| s == "super") {
                            m.pop();
                        }
                    }
                    m.extend(rest.iter().cloned());
                    let target = m;
                    if let Some(file) = longest(&modules, &target) {
                        used.insert(file);
                    }
                    continue;
                }
            };
            target.extend(path[1..].iter().cloned());
            if let Some(file) = longest(&modules, &target) {
                used.insert(file);
            }
        }
        let ancestors: BTreeSet<String> = (1..=own.len())
            .filter_map(|n| modules.get(&own[..n]).cloned())
            .collect();
        used.retain(|f| f != rel && !ancestors.contains(f));
        edges.insert(rel.clone(), used);
    }
    edges
}

fn longest(modules: &BTreeMap<Vec<String>, String>, path: &[String]) -> Option<String> {
    (1..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n]).cloned())
}

#[test]
fn no_two_files_use_each_other() {
    let files = library_files();
    let edges = graph(&files);
    // Depth-first search for a cycle; report the first one met, as a chain of files.
    fn visit(
        f: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(f.to_owned(), 1);
        stack.push(f.to_owned());
        for g in edges.get(f).into_iter().flatten() {
            match state.get(g.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == g).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(g.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(g, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(f.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for f in edges.keys() {
        if state.get(f.as_str()).copied().unwrap_or(0) == 0 {
            let cycle = visit(f, &edges, &mut state, &mut Vec::new());
            assert!(cycle.is_none(), "these files use each other: {cycle:#?}");
        }
    }

    // The reader itself: the two circles this test was written against.
    let sample = [
        (
            "runtime/src/a/mod.rs".to_owned(),
            "mod b; mod c;".to_owned(),
        ),
        (
            "runtime/src/a/b.rs".to_owned(),
            "use super::c::X;".to_owned(),
        ),
        (
            "runtime/src/a/c.rs".to_owned(),
            "use super::{b::Y, Z};".to_owned(),
        ),
    ];
    let g = graph(&sample);
    assert_eq!(
        g["runtime/src/a/b.rs"],
        ["runtime/src/a/c.rs".to_owned()].into()
    );
    assert_eq!(
        g["runtime/src/a/c.rs"],
        ["runtime/src/a/b.rs".to_owned()].into()
    );
    let sample = [
        ("runtime/src/lib.rs".to_owned(), "mod x;".to_owned()),
        (
            "runtime/src/x/mod.rs".to_owned(),
            "use self::y::Q;".to_owned(),
        ),
        (
            "runtime/src/x/y.rs".to_owned(),
            "use crate::x::z::W;".to_owned(),
        ),
        (
            "runtime/src/x/z.rs".to_owned(),
            "use crate::x::{y::V};".to_owned(),
        ),
    ];
    let g = graph(&sample);
    assert_eq!(
        g["runtime/src/x/y.rs"],
        ["runtime/src/x/z.rs".to_owned()].into()
    );
    assert_eq!(
        g["runtime/src/x/z.rs"],
        ["runtime/src/x/y.rs".to_owned()].into()
    );
    assert_eq!(
        g["runtime/src/x/mod.rs"],
        ["runtime/src/x/y.rs".to_owned()].into()
    );
}
