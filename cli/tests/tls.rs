//! `idempotency-admin` against a PostgreSQL that only accepts TLS, as managed databases do: a
//! throwaway cluster this test starts (own directory, own port, a self-signed certificate,
//! `hostssl` only in `pg_hba.conf`). With `sslmode=require` it connects; without TLS the server
//! refuses it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The PostgreSQL server binaries' directory, if installed.
fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .collect();
    found.sort();
    found.pop()
}

/// Runs `program` with `args` (as the `postgres` user when this test runs as root: initdb
/// refuses root), and panics with its output if it fails.
fn run(program: &Path, args: &[&str]) {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let mut cmd = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = cmd.args(args).output().expect("run a PostgreSQL binary");
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cluster that accepts only TLS on loopback; stopped and removed on drop.
struct TlsOnlyCluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl TlsOnlyCluster {
    fn start(bin: PathBuf) -> TlsOnlyCluster {
        let dir = std::env::temp_dir().join(format!("idem-tls-pg-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).expect("a directory");
        let status = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=localhost", "-keyout"])
            .arg(dir.join("server.key"))
            .arg("-out")
            .arg(dir.join("server.crt"))
            .output()
            .expect("run openssl");
        assert!(status.status.success(), "openssl: {status:?}");
        // The directory and the key belong to whoever runs the server.
        let _ = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .output();
        let _ = Command::new("chmod")
            .arg("600")
            .arg(dir.join("server.key"))
            .output();
        let data = dir.join("data");
        let data_s = data.to_str().expect("a UTF-8 path").to_owned();
        run(
            &bin.join("initdb"),
            &["-D", &data_s, "-A", "trust", "-U", "root"],
        );
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = free.local_addr().expect("addr").port();
        drop(free);
        let conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            dir.display(),
            dir.join("server.crt").display(),
            dir.join("server.key").display()
        );
        let mut text = std::fs::read_to_string(data.join("postgresql.conf")).expect("conf");
        text.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), text).expect("write conf");
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .expect("write pg_hba.conf");
        let log = dir.join("server.log");
        run(
            &bin.join("pg_ctl"),
            &[
                "-D",
                &data_s,
                "-l",
                log.to_str().expect("UTF-8"),
                "-w",
                "start",
            ],
        );
        TlsOnlyCluster { bin, dir, port }
    }

    fn url(&self, sslmode: &str) -> String {
        format!(
            "postgres://root@127.0.0.1:{}/postgres?sslmode={sslmode}",
            self.port
        )
    }
}

impl Drop for TlsOnlyCluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        if let Some(data) = data.to_str() {
            run(
                &self.bin.join("pg_ctl"),
                &["-D", data, "-m", "immediate", "stop"],
            );
        }
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn admin(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idempotency-admin"))
        .arg("--store")
        .arg(url)
        .args(args)
        .output()
        .expect("run idempotency-admin")
}

#[cfg_attr(
    no_pg_binaries,
    ignore = "needs PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin and openssl"
)]
#[test]
fn a_tls_only_postgres_is_reached_with_sslmode_require() {
    let bin = pg_bin().expect("initdb and pg_ctl (build.rs found them)");
    let cluster = TlsOnlyCluster::start(bin);
    // Without TLS the server refuses the connection (pg_hba has hostssl lines only).
    let plain = admin(&cluster.url("disable"), &["stats"]);
    let err = String::from_utf8_lossy(&plain.stderr);
    assert_eq!(plain.status.code(), Some(1), "{err}");
    assert!(err.contains("no pg_hba.conf entry"), "{err}");
    assert!(err.contains("no encryption"), "{err}");
    // With sslmode=require: migrate creates the store, inspect reads it (not found: exit 3, a
    // connected answer), stats counts it.
    let require = cluster.url("require");
    let migrated = admin(&require, &["migrate"]);
    assert_eq!(
        migrated.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let inspect = admin(&require, &["inspect", "3f9a0c1b2d4e5f60-1"]);
    assert_eq!(
        inspect.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("not found"));
    let stats = admin(&require, &["--json", "stats"]);
    assert_eq!(stats.status.code(), Some(0));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("JSON");
    assert_eq!(stats["records"], 0, "{stats}");
}
