//! The runtime's house rules, checked by reading its sources (as the macro crate checks its own).
//! Its modules are in layers, lowest first: a module uses only modules of layers below its own,
//! so the import graph has no circle (the crate root and `__private`, which re-export, and test
//! code are left out). And no function takes more than four parameters besides `self`.

use std::collections::BTreeSet;
use std::path::Path;

use crate::files::sources;

/// Each layer's modules. Names the crate root re-exports count as their module's.
const LAYERS: &[&[&str]] = &[
    &["canonical", "clock", "periodic", "origin"],
    &["key"],
    &["record", "progress"],
    &["store", "door"],
    &["error"],
    &["outcome"],
    &["tool"],
    &["metrics"],
    &["engine"],
    &["context"],
    &["outbox", "tasks"],
    &["mcp", "http"],
];

/// The crate root's re-exports, by the module that defines them.
const ROOT: &[(&str, &str)] = &[
    ("Call", "engine"),
    ("EnqueueError", "engine"),
    ("Idempotency", "engine"),
    ("IdempotencyBuilder", "engine"),
    ("IdempotencyContext", "context"),
    ("Caller", "key"),
    ("Reference", "key"),
    ("Error", "error"),
    ("Classify", "outcome"),
    ("Disposition", "outcome"),
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The modules `src` names as `crate::m` or `crate::{m, ..}`, outside comments and tests.
fn uses(src: &str) -> BTreeSet<String> {
    let code = src
        .find("#[cfg(test)]\nmod tests")
        .map_or(src, |at| &src[..at]);
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let names: Vec<String> = match rest.strip_prefix('{') {
            Some(group) => group[..group.find('}').unwrap_or(group.len())]
                .split(',')
                .map(ident)
                .collect(),
            None => vec![ident(rest)],
        };
        for n in names.into_iter().filter(|n| !n.is_empty()) {
            let module = ROOT
                .iter()
                .find(|(name, _)| *name == n)
                .map_or(n, |(_, m)| (*m).to_owned());
            found.insert(module);
        }
    }
    found
}

#[test]
fn modules_only_use_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut checked = 0;
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_owned())
            .expect("a module");
        if ["lib", "__private", "layering", "files", "doc_paths"].contains(&top.as_str()) {
            continue;
        }
        let own = layer(&top).unwrap_or_else(|| panic!("module `{top}` is in no layer"));
        for used in uses(&std::fs::read_to_string(&file).expect("read")) {
            if used == top {
                continue;
            }
            let at = layer(&used)
                .unwrap_or_else(|| panic!("{} uses `crate::{used}`, in no layer", rel.display()));
            assert!(
                at < own,
                "{} (layer {own}) uses `{used}` (layer {at}), which is not below it",
                rel.display()
            );
        }
        checked += 1;
    }
    assert!(checked > 40, "only {checked} files read");
    assert_eq!(
        uses("use crate::key::X; use crate::{store, Call};\n// crate::mcp\n"),
        ["engine", "key", "store"].map(String::from).into()
    );
}

/// The parameters of each `fn` in `src` besides `self`: (name, count). Parameters are split at
/// the top level of the parentheses (generic `<…>` and nested brackets kept whole).
fn parameter_counts(src: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find("fn ") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 3..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // Generics between the name and the parenthesis may hold `(` only inside `Fn(..)` bounds;
        // skip them by angle depth.
        let mut depth_angle = 0i32;
        let mut start = None;
        for (i, c) in rest.char_indices() {
            match c {
                '<' => depth_angle += 1,
                '>' => depth_angle -= 1,
                '(' if depth_angle <= 0 => {
                    start = Some(i);
                    break;
                }
                '{' | ';' => break,
                _ => {}
            }
        }
        let Some(start) = start else {
            continue;
        };
        let (mut depth, mut parts, mut current) = (0i32, Vec::new(), String::new());
        for c in rest[start + 1..].chars() {
            match c {
                '(' | '[' | '{' | '<' => depth += 1,
                ')' | ']' | '}' | '>' if depth > 0 => depth -= 1,
                ')' => break,
                _ => {}
            }
            if c == ',' && depth == 0 {
                parts.push(std::mem::take(&mut current));
            } else {
                current.push(c);
            }
        }
        parts.push(current);
        let count = parts
            .iter()
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
            .filter(|p| {
                let p = p.trim_start_matches('&').trim_start();
                let p = p.strip_prefix("'_ ").unwrap_or(p);
                let p = p.strip_prefix("'a ").unwrap_or(p);
                let p = p.strip_prefix("mut ").unwrap_or(p);
                !(p == "self" || p.starts_with("self:") || p.starts_with("self "))
            })
            .map(bindings)
            .sum();
        found.push((name, count));
    }
    found
}

/// How many parameters one parameter `p` is: a tuple pattern (`(key, token): (Key, Token)`)
/// counts each name it binds, nested ones too; anything else is one.
fn bindings(p: &str) -> usize {
    if !p.starts_with('(') {
        return 1;
    }
    let mut depth = 0i32;
    for (i, c) in p.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return p[..i]
                        .split(['(', ')', ','])
                        .filter(|name| !name.trim().is_empty())
                        .count();
                }
            }
            _ => {}
        }
    }
    1
}

/// No function in the runtime takes more than four parameters besides `self`: what travels
/// together is one value (`Prepared`, a request struct: a named type, never a tuple pattern,
/// whose names count one by one).
#[test]
fn no_function_takes_more_than_four_parameters() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    for file in files {
        if file.ends_with("layering.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read");
        for (name, count) in parameter_counts(&text) {
            assert!(
                count <= 4,
                "{}: fn {name} takes {count} parameters",
                file.display()
            );
        }
    }
    assert_eq!(
        parameter_counts("fn a(&self, x: u8, y: Vec<(u8, u8)>) {} fn b<F: Fn(u8)>(f: F, g: u8, h: u8, i: u8, j: u8) {}"),
        [("a".to_owned(), 2), ("b".to_owned(), 5)]
    );
    assert_eq!(
        parameter_counts("fn c(&self, (a, b): (u8, u8), ((c, d), e): ((u8, u8), u8)) {}"),
        [("c".to_owned(), 5)]
    );
}
