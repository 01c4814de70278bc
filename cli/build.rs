//! Without `DATABASE_URL` at build time, the PostgreSQL tests are marked ignored (cfg
//! `no_database`), so the test runner's own summary reports them as ignored, never as passed.
//! CI (`.ci/run`) sets it, so there they always run.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_database)");
    // The TLS test starts a throwaway PostgreSQL cluster: without the server binaries or openssl
    // it is marked ignored, with that reason.
    println!("cargo::rustc-check-cfg=cfg(no_pg_binaries)");
    println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    let servers = std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|versions| {
        versions.flatten().any(|v| {
            let bin = v.path().join("bin");
            bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()
        })
    });
    let openssl = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("openssl").is_file()));
    if !(servers && openssl) {
        println!("cargo::rustc-cfg=no_pg_binaries");
    }
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    let set = std::env::var("DATABASE_URL").is_ok_and(|u| !u.trim().is_empty());
    if !set {
        println!("cargo::rustc-cfg=no_database");
    }
}
