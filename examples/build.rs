//! Without `DATABASE_URL` at build time, the PostgreSQL tests are marked ignored (cfg
//! `no_database`), so the test runner's own summary reports them as ignored, never as passed.
//! CI (`.ci/run`) sets it, so there they always run.
//!
//! Likewise the MCP Inspector tests without the two Inspector CLIs the guide's instructions use
//! (cfg `no_inspector`): `$INSPECTOR_DIR/0.15` and `$INSPECTOR_DIR/2` (default
//! `/work/inspector`), each an `npm install --prefix` of `@modelcontextprotocol/inspector` at that
//! version, as `.ci/run` makes them. The directory found reaches the tests as `INSPECTOR_DIR`.
//!
//! And the skewed-clock tests without libfaketime (cfg `no_faketime`; Debian's `faketime`
//! package, which `.ci/run` installs): its multi-threaded library reaches them as
//! `FAKETIME_LIB`.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_database)");
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    let set = std::env::var("DATABASE_URL").is_ok_and(|u| !u.trim().is_empty());
    if !set {
        println!("cargo::rustc-cfg=no_database");
    }

    // Likewise the Redis tests without a Redis (cfg `no_redis`): they use `REDIS_URL`, or else
    // start a `redis-server` of their own from the `PATH`.
    println!("cargo::rustc-check-cfg=cfg(no_redis)");
    println!("cargo::rerun-if-env-changed=REDIS_URL");
    println!("cargo::rerun-if-env-changed=PATH");
    let url = std::env::var("REDIS_URL").is_ok_and(|u| !u.trim().is_empty());
    let server = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("redis-server").is_file()));
    if !url && !server {
        println!("cargo::rustc-cfg=no_redis");
    }

    println!("cargo::rustc-check-cfg=cfg(no_inspector)");
    println!("cargo::rerun-if-env-changed=INSPECTOR_DIR");
    let dir = std::env::var_os("INSPECTOR_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/inspector"));
    let cli = |version: &str| dir.join(version).join("node_modules/.bin/mcp-inspector");
    for version in ["0.15", "2"] {
        println!("cargo::rerun-if-changed={}", cli(version).display());
    }
    if ["0.15", "2"].iter().all(|v| Path::new(&cli(v)).exists()) {
        println!("cargo::rustc-env=INSPECTOR_DIR={}", dir.display());
    } else {
        println!("cargo::rustc-cfg=no_inspector");
    }

    println!("cargo::rustc-check-cfg=cfg(no_faketime)");
    println!("cargo::rerun-if-env-changed=FAKETIME_LIB");
    let lib = std::env::var_os("FAKETIME_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"));
    println!("cargo::rerun-if-changed={}", lib.display());
    if lib.exists() {
        println!("cargo::rustc-env=FAKETIME_LIB={}", lib.display());
    } else {
        println!("cargo::rustc-cfg=no_faketime");
    }
}
