//! Servers (and `idempotency-admin migrate`) starting together on a new SQLite file: every one
//! opens it. Switching a new file to WAL takes a lock SQLite's busy timeout does not wait for,
//! so without the store's retry about one start in twenty failed with "database is locked".

use std::sync::Arc;

use idempotency::store::SqliteStore;
use tokio::sync::Barrier;

/// Opens started at once, per round.
const OPENS: usize = 8;
/// Rounds of opens in this process, each on a fresh file: without the retry, 1 open in 1,200
/// failed here (2 cores), so a round count that makes a regression show.
const ROUNDS: usize = 300;
/// Rounds of `migrate` processes, each on a fresh file.
const PROCESS_ROUNDS: usize = 20;

fn fresh_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-first-{what}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("a directory");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_opens_of_a_new_file_all_succeed() {
    let dir = fresh_dir("opens");
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let path = dir.join(format!("round-{round}.db"));
        let gate = Arc::new(Barrier::new(OPENS));
        let opens: Vec<_> = (0..OPENS)
            .map(|_| {
                let (gate, path) = (gate.clone(), path.clone());
                tokio::spawn(async move {
                    gate.wait().await;
                    SqliteStore::open(&path).await
                })
            })
            .collect();
        for open in opens {
            match open.await.expect("the open's task") {
                Ok(store) => store.pool().close().await,
                Err(e) => failures.push(format!("round {round}: {e:?}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} opens failed: {failures:#?}",
        failures.len(),
        OPENS * ROUNDS
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The same across processes: `OPENS` `idempotency-admin migrate` on one new file, `PROCESS_ROUNDS` rounds.
#[test]
fn concurrent_migrate_processes_on_a_new_file_all_succeed() {
    let dir = fresh_dir("processes");
    let mut failures = Vec::new();
    for round in 0..PROCESS_ROUNDS {
        let url = format!("sqlite:{}", dir.join(format!("round-{round}.db")).display());
        let children: Vec<_> = (0..OPENS)
            .map(|_| {
                std::process::Command::new(env!("CARGO_BIN_EXE_idempotency-admin"))
                    .args(["--store", &url, "migrate"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("start idempotency-admin")
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().expect("wait");
            if !out.status.success() {
                failures.push(format!(
                    "round {round}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    std::fs::remove_dir_all(&dir).ok();
}
