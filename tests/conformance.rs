//! One conformance suite, run against every store: `MemoryStore` (the reference), `SqliteStore`
//! (a temporary file), `PostgresStore` (a schema of its own per test; skipped with a printed
//! line without `DATABASE_URL`) and `RedisStore`, on one Redis and on a 3-master + 3-replica
//! Redis Cluster (servers of this test process's own, a namespace per test). Every case passes explicit times, so window edges are exact.
//!
//! After the suite: what only the SQL stores have (migrations, undecodable rows, plans).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::PostgresStore;
use idempotency::store::RedisStore;
use idempotency::store::SqliteStore;
use idempotency::{
    clock::Timestamp,
    key::{Fingerprint, Key},
    store::{
        Claim, ClaimRequest, Completion, Maintenance, MemoryStore, OutboxMessage, Receipt,
        RecordState, RecordStatus, RecordStore, Settlement, Store, StoreError, StoredResponse,
        Token, Unsettled,
    },
    Caller,
};
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::redis_servers::{shared_cluster, shared_server};

const T0: i64 = 1_796_000_000_000;
const S: i64 = 1_000;
const M: i64 = 60 * S;
const LEASE: i64 = 30 * S;
const WINDOW: i64 = 15 * M;
const TENANT: &str = "acme";
const TOOL: &str = "charge_card";

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

/// The token a claim at `ms` proposes in these tests (the engine proposes its claim time in ms ×
/// 2^20 plus random bits): a record created or taken over by that claim holds it.
fn first_token(ms: i64) -> Token {
    Token(at(ms).as_millis())
}

fn dur(ms: i64) -> Duration {
    Duration::from_millis(ms as u64)
}

fn key(name: &str) -> Key {
    Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new(TENANT, "alice"),
        TOOL,
        name,
    )
    .expect("key")
}

fn fp(args: &str) -> Option<Fingerprint> {
    Some(Fingerprint::of(&idempotency::key::Secret::demo(), args).expect("fingerprint"))
}

fn answer(body: &str) -> StoredResponse {
    StoredResponse {
        ok: true,
        body: body.to_owned(),
    }
}

fn req(key: Key, fingerprint: Option<Fingerprint>, now: i64) -> ClaimRequest<'static> {
    req_window(key, fingerprint, now, WINDOW)
}

/// [`req`] for a tool whose window is `window` ms.
fn req_window(
    key: Key,
    fingerprint: Option<Fingerprint>,
    now: i64,
    window: i64,
) -> ClaimRequest<'static> {
    ClaimRequest {
        key,
        tenant: TENANT,
        subject: None,
        tool: TOOL,
        fingerprint,
        now: at(now),
        lease: dur(LEASE),
        window: dur(window),
        token: first_token(now),
    }
}

fn message(topic: &str, payload: &str) -> OutboxMessage {
    OutboxMessage {
        topic: topic.to_owned(),
        payload: payload.to_owned(),
    }
}

#[track_caller]
fn assert_fenced(r: Result<(), StoreError>, reference: idempotency::Reference) {
    assert!(
        matches!(&r, Err(StoreError::Fenced { reference: got }) if *got == reference),
        "expected Fenced({reference}), got {r:?}"
    );
}

#[track_caller]
fn assert_wrong_state(r: Result<(), StoreError>, reference: idempotency::Reference, state: &str) {
    assert!(
        matches!(&r, Err(StoreError::WrongState { reference: got, state: s }) if *got == reference && *s == state),
        "expected WrongState({reference}, {state}), got {r:?}"
    );
}

#[track_caller]
fn assert_not_found(r: Result<(), StoreError>) {
    assert!(
        matches!(r, Err(StoreError::NotFound)),
        "expected NotFound, got {r:?}"
    );
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Memory,
    Sqlite,
    Postgres,
    Redis,
}

/// The store under test.
struct Backend {
    store: Arc<dyn Store>,
    kind: Kind,
}

impl Backend {
    /// How many concurrent claims of one key the contention cases make.
    fn crowd(&self) -> usize {
        match self.kind {
            Kind::Sqlite => 200,
            Kind::Memory | Kind::Postgres | Kind::Redis => 1_000,
        }
    }

    async fn claim(&self, key: Key, fingerprint: Option<Fingerprint>, now: i64) -> Claim {
        self.store
            .claim(&req(key, fingerprint, now))
            .await
            .expect("claim")
    }

    async fn new_claim(&self, key: Key, fingerprint: Option<Fingerprint>, now: i64) -> Token {
        self.new_claim_window(key, fingerprint, now, WINDOW).await
    }

    /// [`Backend::new_claim`] for a tool whose window is `window` ms.
    async fn new_claim_window(
        &self,
        key: Key,
        fingerprint: Option<Fingerprint>,
        now: i64,
        window: i64,
    ) -> Token {
        let claim = self
            .store
            .claim(&req_window(key, fingerprint, now, window))
            .await
            .expect("claim");
        match claim {
            Claim::New { token, .. } => token,
            other => panic!("expected a new claim, got {other:?}"),
        }
    }

    async fn complete_with(
        &self,
        key: Key,
        token: Token,
        now: i64,
        response: &StoredResponse,
        outbox: &[OutboxMessage],
    ) -> Result<(), StoreError> {
        let c = Completion {
            key,
            token,
            response,
            now: at(now),
            outbox,
        };
        self.store.complete(&c).await
    }

    async fn complete(
        &self,
        key: Key,
        token: Token,
        now: i64,
        body: &str,
    ) -> Result<(), StoreError> {
        self.complete_with(key, token, now, &answer(body), &[])
            .await
    }

    async fn status(
        &self,
        tenant: &str,
        reference: idempotency::Reference,
    ) -> Option<RecordStatus> {
        self.store
            .status(tenant, "alice", reference)
            .await
            .expect("status")
    }

    async fn unsettled(&self, now: i64, limit: u32) -> Vec<Unsettled> {
        self.store
            .unsettled(at(now), limit)
            .await
            .expect("unsettled")
    }

    async fn settle(
        &self,
        key: Key,
        token: Token,
        s: &Settlement,
        now: i64,
    ) -> Result<(), StoreError> {
        self.store.settle(key, token, s, at(now)).await
    }
}

/// A SQLite file in the temp directory, deleted (with its WAL files) afterwards.
struct SqliteFile(PathBuf);

impl SqliteFile {
    fn new(what: &str) -> Self {
        SqliteFile(std::env::temp_dir().join(format!("{}.db", unique_name(what))))
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            std::fs::remove_file(p).ok();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The claim table
// ---------------------------------------------------------------------------------------------

async fn no_row_is_new_then_in_flight(b: &Backend) {
    let k = key("a");
    assert_eq!(
        b.claim(k, None, 0).await,
        Claim::New {
            reference: k.reference(1),
            token: first_token(0)
        }
    );
    assert_eq!(
        b.claim(k, None, S).await,
        Claim::InFlight {
            reference: k.reference(1),
            claimed_at: at(0),
            lease_expires_at: at(LEASE)
        }
    );
}

async fn in_flight_stays_in_flight_after_its_lease(b: &Backend) {
    let k = key("a");
    b.new_claim(k, None, 0).await;
    let in_flight = Claim::InFlight {
        reference: k.reference(1),
        claimed_at: at(0),
        lease_expires_at: at(LEASE),
    };
    assert_eq!(b.claim(k, None, LEASE).await, in_flight);
    assert_eq!(b.claim(k, None, 10 * WINDOW).await, in_flight);
}

async fn completed_replays_within_its_window(b: &Backend) {
    let k = key("a");
    let t = b.new_claim(k, None, 0).await;
    b.complete(k, t, S, r#"{"charge":1}"#)
        .await
        .expect("complete");
    assert_eq!(
        b.claim(k, None, 2 * S).await,
        Claim::Completed {
            reference: k.reference(1),
            response: answer(r#"{"charge":1}"#),
            completed_at: at(S)
        }
    );
    // A definitive error is stored and replayed like a success.
    let k2 = key("declined");
    let t2 = b.new_claim(k2, None, 0).await;
    let declined = StoredResponse {
        ok: false,
        body: r#""declined""#.into(),
    };
    b.complete_with(k2, t2, S, &declined, &[])
        .await
        .expect("complete");
    assert_eq!(
        b.claim(k2, None, 2 * S).await,
        Claim::Completed {
            reference: k2.reference(1),
            response: declined,
            completed_at: at(S)
        }
    );
}

async fn window_edges(b: &Backend) {
    // Completed at t with window w.
    let t = S;
    let k = key("edge");
    let token = b.new_claim(k, None, 0).await;
    b.complete(k, token, t, "first").await.expect("complete");
    assert!(
        matches!(
            b.claim(k, None, t + WINDOW - S).await,
            Claim::Completed { .. }
        ),
        "t+w-1s replays"
    );
    // now >= expires_at: a new operation.
    assert_eq!(
        b.claim(k, None, t + WINDOW).await,
        Claim::New {
            reference: k.reference(2),
            token: first_token(t + WINDOW)
        }
    );

    let k = key("after");
    let token = b.new_claim(k, None, 0).await;
    b.complete(k, token, t, "first").await.expect("complete");
    let fresh = b.claim(k, None, t + WINDOW + S).await;
    assert_eq!(
        fresh,
        Claim::New {
            reference: k.reference(2),
            token: first_token(t + WINDOW + S)
        }
    );
    assert_ne!(k.reference(2), k.reference(1));
    assert_eq!(
        b.status(TENANT, k.reference(1)).await.map(|s| s.reference),
        Some(k.reference(2)),
        "the old reference is superseded: the key's current record answers, naming its own ref"
    );
    let now = b
        .status(TENANT, k.reference(2))
        .await
        .expect("the new reference");
    assert_eq!(
        (now.state, now.claimed_at, now.response),
        (RecordState::InFlight, at(t + WINDOW + S), None)
    );
}

async fn slow_completion_counts_the_window_from_completion(b: &Backend) {
    let k = key("slow");
    let t = b.new_claim(k, None, 0).await;
    b.complete(k, t, 20 * M, "slow").await.expect("complete");
    assert_eq!(
        b.claim(k, None, 30 * M).await,
        Claim::Completed {
            reference: k.reference(1),
            response: answer("slow"),
            completed_at: at(20 * M)
        }
    );
    assert!(matches!(
        b.claim(k, None, 35 * M - 1).await,
        Claim::Completed { .. }
    ));
    assert!(matches!(b.claim(k, None, 35 * M).await, Claim::New { .. }));
}

async fn fingerprint_mismatch(b: &Backend) {
    let (args, other) = (fp(r#"{"order":7,"qty":1}"#), fp(r#"{"order":7,"qty":2}"#));
    let k = key("order-7");
    let t = b.new_claim(k, args, 0).await;
    assert_eq!(
        b.claim(k, other, S).await,
        Claim::Mismatch {
            reference: k.reference(1)
        },
        "in flight"
    );
    assert!(
        matches!(b.claim(k, None, S).await, Claim::InFlight { .. }),
        "no fingerprint never mismatches"
    );
    assert!(matches!(b.claim(k, args, S).await, Claim::InFlight { .. }));
    b.complete(k, t, 2 * S, "shipped").await.expect("complete");
    assert_eq!(
        b.claim(k, other, 3 * S).await,
        Claim::Mismatch {
            reference: k.reference(1)
        },
        "completed"
    );
    assert!(matches!(
        b.claim(k, args, 3 * S).await,
        Claim::Completed { .. }
    ));
    // Past the window, any arguments start a new operation.
    assert_eq!(
        b.claim(k, other, 2 * S + WINDOW).await,
        Claim::New {
            reference: k.reference(2),
            token: first_token(2 * S + WINDOW)
        }
    );

    let k = key("order-8");
    let t = b.new_claim(k, args, 0).await;
    b.store.mark_unknown(k, t).await.expect("mark unknown");
    assert_eq!(
        b.claim(k, other, 2 * S).await,
        Claim::Mismatch {
            reference: k.reference(1)
        },
        "unknown"
    );
    assert_eq!(
        b.claim(k, args, 2 * S).await,
        Claim::Unknown {
            reference: k.reference(1),
            since: at(0)
        }
    );

    // Released: taken over whatever the arguments; the new arguments are the record's now.
    let k = key("order-9");
    let t = b.new_claim(k, args, 0).await;
    b.store.release(k, t, at(S)).await.expect("release");
    assert_eq!(
        b.claim(k, other, 2 * S).await,
        Claim::New {
            reference: k.reference(1),
            token: first_token(2 * S)
        }
    );
    assert_eq!(
        b.claim(k, args, 3 * S).await,
        Claim::Mismatch {
            reference: k.reference(1)
        }
    );
}

async fn released_is_taken_over_under_the_same_reference(b: &Backend) {
    let k = key("retry");
    let t1 = b.new_claim(k, None, 0).await;
    b.store.release(k, t1, at(S)).await.expect("release");
    let released = b.status(TENANT, k.reference(1)).await.expect("status");
    assert_eq!(
        (
            released.state,
            released.completed_at,
            released.expires_at,
            released.response
        ),
        (RecordState::Released, Some(at(S)), Some(at(S)), None)
    );
    assert_eq!(
        b.claim(k, None, 2 * S).await,
        Claim::New {
            reference: k.reference(1),
            token: first_token(2 * S)
        }
    );
    let taken = b.status(TENANT, k.reference(1)).await.expect("status");
    assert_eq!(
        (taken.state, taken.claimed_at, taken.completed_at),
        (RecordState::InFlight, at(2 * S), None)
    );
    assert_fenced(b.complete(k, t1, 3 * S, "stale").await, k.reference(1));
    b.complete(k, first_token(2 * S), 3 * S, "done")
        .await
        .expect("complete");
    assert!(
        matches!(b.claim(k, None, 4 * S).await, Claim::Completed { response, .. } if response == answer("done"))
    );
}

async fn unknown_answers_unknown_until_settled(b: &Backend) {
    let k = key("lost");
    let t = b.new_claim(k, None, 0).await;
    b.store.mark_unknown(k, t).await.expect("mark unknown");
    let unknown = Claim::Unknown {
        reference: k.reference(1),
        since: at(0),
    };
    assert_eq!(b.claim(k, None, 2 * S).await, unknown);
    assert_eq!(
        b.claim(k, None, 10 * WINDOW).await,
        unknown,
        "never by window"
    );
    assert_eq!(
        b.status(TENANT, k.reference(1)).await.map(|s| s.state),
        Some(RecordState::Unknown)
    );
    assert_wrong_state(b.store.mark_unknown(k, t).await, k.reference(1), "unknown");
}

// ---------------------------------------------------------------------------------------------
// Fencing
// ---------------------------------------------------------------------------------------------

/// A worker of a record that was settled by the reconciler and then purged (48 h later) wakes
/// up after the key was claimed again: its token is not the new record's, so it is fenced.
async fn tokens_are_not_reused_after_a_purge(b: &Backend) {
    let k = key("purged");
    let old = b.new_claim(k, None, 0).await;
    b.settle(k, old, &Settlement::Released, S)
        .await
        .expect("settle");
    let later = 50 * 60 * M; // 50 h
    assert_eq!(
        b.store
            .purge(at(later), at(later), 10)
            .await
            .expect("purge"),
        1
    );
    let new = b.new_claim(k, None, later).await;
    assert_eq!(new, first_token(later));
    assert_ne!(new, old);
    assert_fenced(b.complete(k, old, later + S, "stale").await, k.reference(1));
    assert!(
        matches!(b.claim(k, None, later + S).await, Claim::InFlight { .. }),
        "the new claim is untouched"
    );
}

async fn stale_tokens_are_fenced(b: &Backend) {
    let k = key("fenced");
    let t1 = b.new_claim(k, None, 0).await;
    b.store.release(k, t1, at(S)).await.expect("release");
    let t2 = b.new_claim(k, None, 2 * S).await;
    assert_eq!(t2, first_token(2 * S), "the taking-over claim's own token");
    let r = k.reference(1);
    assert_fenced(b.complete(k, t1, 3 * S, "stale").await, r);
    assert_fenced(b.store.release(k, t1, at(3 * S)).await, r);
    assert_fenced(b.store.renew(k, t1, at(0), dur(3 * LEASE)).await, r);
    assert_fenced(b.store.mark_unknown(k, t1).await, r);
    assert_fenced(b.settle(k, t1, &Settlement::Released, 3 * S).await, r);
    assert!(
        matches!(b.claim(k, None, 3 * S).await, Claim::InFlight { .. }),
        "nothing changed"
    );

    b.complete(k, t2, 3 * S, "done").await.expect("complete");
    assert_wrong_state(b.store.release(k, t2, at(4 * S)).await, r, "completed");
    assert_wrong_state(
        b.store.renew(k, t2, at(0), dur(3 * LEASE)).await,
        r,
        "completed",
    );
    assert_wrong_state(b.store.mark_unknown(k, t2).await, r, "completed");
    assert_wrong_state(b.complete(k, t2, 4 * S, "again").await, r, "completed");
    assert_wrong_state(
        b.settle(k, t2, &Settlement::Unknown, 4 * S).await,
        r,
        "completed",
    );
    assert!(
        matches!(b.claim(k, None, 5 * S).await, Claim::Completed { response, .. } if response == answer("done"))
    );

    // A definitive error answer is a completed record too (PostgreSQL stores it under its own
    // state code): the holder's later calls are told so, never that the row is damaged.
    let e = key("fenced-error");
    let te = b.new_claim(e, None, 0).await;
    let declined = StoredResponse {
        ok: false,
        body: "declined".to_owned(),
    };
    b.complete_with(e, te, S, &declined, &[])
        .await
        .expect("complete with an error answer");
    let re = e.reference(1);
    assert_wrong_state(b.store.release(e, te, at(2 * S)).await, re, "completed");
    assert_wrong_state(
        b.store.renew(e, te, at(0), dur(3 * LEASE)).await,
        re,
        "completed",
    );
    assert_wrong_state(b.store.mark_unknown(e, te).await, re, "completed");
    assert_wrong_state(b.complete(e, te, 2 * S, "again").await, re, "completed");
    assert_wrong_state(
        b.settle(e, te, &Settlement::Unknown, 2 * S).await,
        re,
        "completed",
    );
    assert!(
        matches!(b.claim(e, None, 3 * S).await, Claim::Completed { response, .. } if response == declined)
    );

    let missing = key("missing");
    assert_not_found(b.complete(missing, t1, 0, "x").await);
    assert_not_found(b.store.release(missing, t1, at(0)).await);
    assert_not_found(b.store.renew(missing, t1, at(0), dur(0)).await);
    assert_not_found(b.store.mark_unknown(missing, t1).await);
    assert_not_found(b.settle(missing, t1, &Settlement::Released, 0).await);
}

async fn late_completion_after_settle_is_fenced(b: &Backend) {
    let k = key("late");
    let t = b.new_claim(k, None, 0).await;
    let due = b.unsettled(LEASE, 10).await;
    assert_eq!(
        due.iter().map(|u| (u.key, u.token)).collect::<Vec<_>>(),
        vec![(k, t)]
    );
    b.settle(k, t, &Settlement::Completed(answer("settled")), LEASE + S)
        .await
        .expect("settle");
    assert_fenced(
        b.complete(k, t, LEASE + 2 * S, "late").await,
        k.reference(1),
    );
    assert_eq!(
        b.claim(k, None, LEASE + 3 * S).await,
        Claim::Completed {
            reference: k.reference(1),
            response: answer("settled"),
            completed_at: at(LEASE + S)
        }
    );
    assert_eq!(
        b.status(TENANT, k.reference(1))
            .await
            .and_then(|s| s.response),
        Some(answer("settled"))
    );
}

async fn renew_extends_the_lease(b: &Backend) {
    let k = key("long");
    let t = b.new_claim(k, None, 0).await;
    b.store
        .renew(k, t, at(0), dur(3 * LEASE))
        .await
        .expect("renew");
    assert_eq!(
        b.status(TENANT, k.reference(1))
            .await
            .map(|s| s.lease_expires_at),
        Some(at(3 * LEASE))
    );
    assert!(
        b.unsettled(2 * LEASE, 10).await.is_empty(),
        "a renewed lease is live"
    );
    assert_eq!(
        b.unsettled(3 * LEASE, 10).await.len(),
        1,
        "lease_expires_at <= now is due"
    );
    assert_eq!(
        b.claim(k, None, S).await,
        Claim::InFlight {
            reference: k.reference(1),
            claimed_at: at(0),
            lease_expires_at: at(3 * LEASE)
        }
    );
    b.complete(k, t, 2 * S, "done")
        .await
        .expect("a renewal keeps the token");
}

// ---------------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------------

async fn status_is_tenant_scoped_and_generation_exact(b: &Backend) {
    let k = key("status");
    let t = b.new_claim(k, None, 0).await;
    b.complete(k, t, S, "done").await.expect("complete");
    assert_eq!(
        b.status(TENANT, k.reference(1)).await,
        Some(RecordStatus {
            reference: k.reference(1),
            tool: TOOL.into(),
            state: RecordState::Completed,
            claimed_at: at(0),
            lease_expires_at: at(S), // the lease ended when it completed
            completed_at: Some(at(S)),
            expires_at: Some(at(S + WINDOW)),
            response: Some(answer("done")),
        })
    );
    assert_eq!(
        b.status("globex", k.reference(1)).await,
        None,
        "another tenant's reference"
    );
    assert_eq!(
        b.status(TENANT, k.reference(2)).await,
        None,
        "a generation that does not exist"
    );
    assert_eq!(b.status(TENANT, key("never").reference(1)).await, None);
    b.new_claim(k, None, S + WINDOW).await;
    assert_eq!(
        b.status(TENANT, k.reference(1)).await.map(|s| s.reference),
        Some(k.reference(2)),
        "a superseded generation: the current record, under its own ref"
    );
    assert_eq!(
        b.status(TENANT, k.reference(2)).await.map(|s| s.state),
        Some(RecordState::InFlight)
    );

    // Two keys sharing the 8-byte prefix (so one reference): the reference names one record,
    // so the second key is refused, whatever the first record's state or tenant, until purged.
    let mut bytes = [0x5au8; 32];
    let ka = Key::from_bytes(bytes);
    bytes[31] = 0x5b;
    let kb = Key::from_bytes(bytes);
    assert_eq!(ka.reference(1), kb.reference(1));
    let claim = |key, tenant, tool, now| ClaimRequest {
        key,
        tenant,
        subject: None,
        tool,
        fingerprint: None,
        now: at(now),
        lease: dur(LEASE),
        window: std::time::Duration::from_millis(WINDOW as u64),
        token: first_token(now),
    };
    let ta = match b.store.claim(&claim(ka, "acme", "charge_card", 0)).await {
        Ok(Claim::New { token, .. }) => token,
        other => panic!("{other:?}"),
    };
    let taken = |r: Result<Claim, StoreError>| match r {
        Err(StoreError::ReferenceTaken { reference }) => reference,
        other => panic!("expected ReferenceTaken, got {other:?}"),
    };
    let in_flight = taken(
        b.store
            .claim(&claim(kb, "globex", "create_shipment", S))
            .await,
    );
    assert_eq!(in_flight, ka.reference(1));
    b.complete(ka, ta, S, "done").await.expect("complete");
    taken(
        b.store
            .claim(&claim(kb, "acme", "charge_card", 2 * S))
            .await,
    );
    let expired = taken(
        b.store
            .claim(&claim(kb, "acme", "charge_card", S + WINDOW))
            .await,
    );
    assert_eq!(
        expired,
        ka.reference(1),
        "an expired record still holds its reference"
    );
    assert_eq!(
        b.status("acme", ka.reference(1)).await.map(|s| s.tool),
        Some("charge_card".into())
    );
    assert_eq!(b.status("globex", ka.reference(1)).await, None);
    assert_eq!(
        b.store
            .purge(at(2 * (S + WINDOW)), at(2 * (S + WINDOW)), 10)
            .await
            .expect("purge"),
        1
    );
    assert!(
        matches!(
            b.store
                .claim(&claim(kb, "globex", "create_shipment", 2 * (S + WINDOW)))
                .await,
            Ok(Claim::New { .. })
        ),
        "a purged record frees its reference"
    );
    assert_eq!(
        b.status("globex", kb.reference(1)).await.map(|s| s.tool),
        Some("create_shipment".into())
    );
}

// ---------------------------------------------------------------------------------------------
// Purge and reconciliation
// ---------------------------------------------------------------------------------------------

async fn purge_deletes_only_settled_records_past_the_cutoff(b: &Backend) {
    let cutoff = 30 * M;
    let completed = |name: &'static str, window: i64| async move {
        let k = key(name);
        let t = b.new_claim_window(k, None, 0, window).await;
        b.complete(k, t, 0, name).await.expect("complete");
        k
    };
    let gone = completed("expired", WINDOW).await;
    let live = completed("live", 60 * M).await;
    let edge = completed("edge", cutoff).await; // expires_at == cutoff: not before it
    let released = key("released");
    let t = b.new_claim(released, None, 0).await;
    b.store.release(released, t, at(S)).await.expect("release");
    let in_flight = key("in-flight");
    b.new_claim(in_flight, None, 0).await;
    let unknown = key("unknown");
    let t = b.new_claim(unknown, None, 0).await;
    b.store
        .mark_unknown(unknown, t)
        .await
        .expect("mark unknown");

    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 100)
            .await
            .expect("purge"),
        2
    );
    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 100)
            .await
            .expect("purge"),
        0
    );
    assert!(matches!(
        b.claim(in_flight, None, 31 * M).await,
        Claim::InFlight { .. }
    ));
    assert!(matches!(
        b.claim(unknown, None, 31 * M).await,
        Claim::Unknown { .. }
    ));
    assert!(matches!(
        b.claim(live, None, 31 * M).await,
        Claim::Completed { .. }
    ));
    assert!(matches!(
        b.claim(edge, None, 29 * M).await,
        Claim::Completed { .. }
    ));
    assert_eq!(b.status(TENANT, released.reference(1)).await, None);
    assert_eq!(
        b.claim(gone, None, 31 * M).await,
        Claim::New {
            reference: gone.reference(1),
            token: first_token(31 * M)
        }
    );

    // Bounded by the limit.
    for name in ["p1", "p2", "p3", "p4", "p5"] {
        completed(name, S).await;
    }
    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 3)
            .await
            .expect("purge"),
        3
    );
    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 3)
            .await
            .expect("purge"),
        2
    );
    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 3)
            .await
            .expect("purge"),
        0
    );
}

async fn unsettled_lists_expired_leases_and_unknowns(b: &Backend) {
    let (k1, k2, k3, k4, k5) = (key("k1"), key("k2"), key("k3"), key("k4"), key("k5"));
    b.new_claim(k1, None, 0).await;
    b.new_claim(k2, None, 10 * S).await;
    let t3 = b.new_claim(k3, None, 5 * S).await;
    b.store.mark_unknown(k3, t3).await.expect("mark unknown");
    let t4 = b.new_claim(k4, None, S).await;
    b.complete(k4, t4, 2 * S, "done").await.expect("complete");
    let t5 = b.new_claim(k5, None, 2 * S).await;
    b.store.release(k5, t5, at(3 * S)).await.expect("release");

    let due = b.unsettled(LEASE, 10).await;
    assert_eq!(
        due,
        vec![
            Unsettled {
                key: k1,
                reference: k1.reference(1),
                tenant: TENANT.into(),
                subject: None,
                tool: TOOL.into(),
                state: RecordState::InFlight,
                token: first_token(0),
                claimed_at: at(0),
                window: dur(WINDOW),
            },
            Unsettled {
                key: k3,
                reference: k3.reference(1),
                tenant: TENANT.into(),
                subject: None,
                tool: TOOL.into(),
                state: RecordState::Unknown,
                token: t3,
                claimed_at: at(5 * S),
                window: dur(WINDOW),
            },
        ]
    );
    assert_eq!(
        b.unsettled(LEASE, 1)
            .await
            .iter()
            .map(|u| u.key)
            .collect::<Vec<_>>(),
        vec![k1]
    );
    let later = b.unsettled(10 * S + LEASE, 10).await;
    assert_eq!(
        later.iter().map(|u| u.key).collect::<Vec<_>>(),
        vec![k1, k3, k2],
        "oldest claim first"
    );
}

async fn settle_completed_answers_repeats_for_the_window(b: &Backend) {
    let k = key("found");
    let t = b.new_claim(k, None, 0).await;
    b.settle(k, t, &Settlement::Completed(answer("found")), M)
        .await
        .expect("settle");
    assert_eq!(
        b.claim(k, None, 2 * M).await,
        Claim::Completed {
            reference: k.reference(1),
            response: answer("found"),
            completed_at: at(M)
        }
    );
    assert_eq!(
        b.status(TENANT, k.reference(1))
            .await
            .and_then(|s| s.expires_at),
        Some(at(M + WINDOW))
    );
    assert_fenced(
        b.settle(k, t, &Settlement::Released, 2 * M).await,
        k.reference(1),
    );
    assert_eq!(
        b.claim(k, None, M + WINDOW).await,
        Claim::New {
            reference: k.reference(2),
            token: first_token(M + WINDOW)
        }
    );
}

async fn settle_released_lets_a_repeat_run_under_the_same_reference(b: &Backend) {
    let k = key("not-charged");
    let t = b.new_claim(k, None, 0).await;
    b.store.mark_unknown(k, t).await.expect("mark unknown");
    b.settle(k, t, &Settlement::Released, M)
        .await
        .expect("settle");
    assert_eq!(
        b.status(TENANT, k.reference(1)).await.map(|s| s.state),
        Some(RecordState::Released)
    );
    assert_eq!(
        b.claim(k, None, 2 * M).await,
        Claim::New {
            reference: k.reference(1),
            token: first_token(2 * M)
        }
    );
}

async fn settle_unknown_keeps_it_unknown_and_fences_the_worker(b: &Backend) {
    let k = key("unclear");
    let t = b.new_claim(k, None, 0).await;
    b.settle(k, t, &Settlement::Unknown, LEASE)
        .await
        .expect("settle");
    assert_eq!(
        b.claim(k, None, LEASE + S).await,
        Claim::Unknown {
            reference: k.reference(1),
            since: at(0)
        }
    );
    assert_fenced(b.complete(k, t, LEASE + S, "late").await, k.reference(1));
    let due = b.unsettled(LEASE + S, 10).await;
    assert_eq!(
        due.iter().map(|u| (u.state, u.token)).collect::<Vec<_>>(),
        vec![(RecordState::Unknown, Token(t.0 + 1))]
    );
    b.settle(
        k,
        Token(t.0 + 1),
        &Settlement::Completed(answer("found")),
        LEASE + 2 * S,
    )
    .await
    .expect("settle");
    assert!(
        matches!(b.claim(k, None, LEASE + 3 * S).await, Claim::Completed { response, .. } if response == answer("found"))
    );
}

// ---------------------------------------------------------------------------------------------
// Outbox
// ---------------------------------------------------------------------------------------------

async fn outbox_is_written_with_the_completion(b: &Backend) {
    let redeliver = dur(60 * S);
    let fetch = |now: i64, limit: u32| async move {
        b.store
            .fetch(at(now), at(now) + redeliver, limit)
            .await
            .expect("fetch")
    };
    let k = key("with-receipt");
    let t = b.new_claim(k, None, 0).await;
    let msgs = [
        message("receipt_email", r#"{"to":"alice@example.com"}"#),
        message("ledger", "{}"),
    ];
    b.complete_with(k, t, S, &answer("charged"), &msgs)
        .await
        .expect("complete");

    let first = fetch(S, 10).await;
    assert_eq!(
        first
            .iter()
            .map(|e| (
                e.reference,
                e.topic.as_str(),
                e.payload.as_str(),
                e.attempts
            ))
            .collect::<Vec<_>>(),
        vec![
            (
                k.reference(1),
                "receipt_email",
                r#"{"to":"alice@example.com"}"#,
                0
            ),
            (k.reference(1), "ledger", "{}", 0)
        ]
    );
    assert_ne!(first[0].receipt, first[1].receipt);
    assert!(fetch(S, 10).await.is_empty(), "hidden after a fetch");
    assert!(fetch(S + 59 * S, 10).await.is_empty());
    let again = fetch(S + 60 * S, 10).await;
    assert_eq!(
        again
            .iter()
            .map(|e| (e.receipt.clone(), e.attempts))
            .collect::<Vec<_>>(),
        vec![(first[0].receipt.clone(), 1), (first[1].receipt.clone(), 1)]
    );
    b.store.ack(&first[0].receipt).await.expect("ack");
    let rest = fetch(S + 120 * S, 10).await;
    assert_eq!(
        rest.iter()
            .map(|e| (e.receipt.clone(), e.attempts))
            .collect::<Vec<_>>(),
        vec![(first[1].receipt.clone(), 2)]
    );
    b.store.ack(&first[1].receipt).await.expect("ack");
    b.store
        .ack(&first[1].receipt)
        .await
        .expect("a second ack is harmless");
    assert!(
        matches!(
            b.store.ack(&Receipt::new("not-a-receipt")).await,
            Err(StoreError::ForeignReceipt { .. })
        ),
        "a receipt this store did not issue is refused"
    );
    assert!(fetch(10 * M, 10).await.is_empty());

    // Nothing for a completion without messages, nor for a fenced one.
    let k2 = key("no-receipt");
    let t2 = b.new_claim(k2, None, 0).await;
    b.complete(k2, t2, S, "plain").await.expect("complete");
    let k3 = key("fenced-receipt");
    let t3 = b.new_claim(k3, None, 0).await;
    b.store.release(k3, t3, at(S)).await.expect("release");
    b.new_claim(k3, None, 2 * S).await;
    assert_fenced(
        b.complete_with(k3, t3, 3 * S, &answer("late"), &msgs).await,
        k3.reference(1),
    );
    assert!(fetch(20 * M, 10).await.is_empty());

    // Oldest first, bounded by the limit.
    let k4 = key("three");
    let t4 = b.new_claim(k4, None, 0).await;
    let three = [message("a", "1"), message("b", "2"), message("c", "3")];
    b.complete_with(k4, t4, 30 * M, &answer("ok"), &three)
        .await
        .expect("complete");
    let two = fetch(30 * M, 2).await;
    assert_eq!(
        two.iter().map(|e| e.topic.as_str()).collect::<Vec<_>>(),
        vec!["a", "b"]
    );
    let one = fetch(30 * M, 2).await;
    assert_eq!(
        one.iter().map(|e| e.topic.as_str()).collect::<Vec<_>>(),
        vec!["c"]
    );
}

// ---------------------------------------------------------------------------------------------
// Contention
// ---------------------------------------------------------------------------------------------

async fn crowd(b: &Backend, k: Key, now: i64) -> Vec<Claim> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..b.crowd() {
        let store = b.store.clone();
        tasks.spawn(async move { store.claim(&req(k, None, now)).await.expect("claim") });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r.expect("task"));
    }
    out
}

#[track_caller]
fn one_winner(claims: &[Claim], expected: Claim) {
    let new: Vec<&Claim> = claims
        .iter()
        .filter(|c| matches!(c, Claim::New { .. }))
        .collect();
    assert_eq!(new, vec![&expected], "exactly one claim wins");
    let others = claims
        .iter()
        .filter(|c| !matches!(c, Claim::New { .. } | Claim::InFlight { .. }))
        .count();
    assert_eq!(others, 0, "the others are told it is in flight");
}

async fn concurrent_claims_have_one_winner(b: &Backend) {
    let k = key("crowd");
    one_winner(
        &crowd(b, k, 0).await,
        Claim::New {
            reference: k.reference(1),
            token: first_token(0),
        },
    );
}

async fn concurrent_takeovers_have_one_winner(b: &Backend) {
    let k = key("released-crowd");
    let t = b.new_claim(k, None, 0).await;
    b.store.release(k, t, at(S)).await.expect("release");
    one_winner(
        &crowd(b, k, 2 * S).await,
        Claim::New {
            reference: k.reference(1),
            token: first_token(2 * S),
        },
    );

    let k = key("expired-crowd");
    let t = b.new_claim_window(k, None, 0, S).await;
    b.complete(k, t, 0, "old").await.expect("complete");
    one_winner(
        &crowd(b, k, 2 * S).await,
        Claim::New {
            reference: k.reference(2),
            token: first_token(2 * S),
        },
    );
}

/// `take_over` (recover = "rerun"): only a call whose worker is gone (in flight with its lease
/// ended, or unknown) is taken over, under the same reference and a new token that fences the
/// old worker; of a crowd of takeovers exactly one wins.
async fn a_gone_call_is_taken_over_once_under_its_reference(b: &Backend) {
    let k = key("gone");
    let t1 = b.new_claim(k, None, 0).await;
    let r = k.reference(1);
    let t2 = Token(first_token(0).0 + 7);
    assert_wrong_state(
        b.store
            .take_over(k, t2, at(S), dur(LEASE))
            .await
            .map(|_| ()),
        r,
        "in_flight",
    );
    // The lease ended at LEASE: from then on its worker is taken for gone.
    assert_eq!(
        b.store
            .take_over(k, t2, at(LEASE), dur(LEASE))
            .await
            .expect("taken over"),
        r
    );
    assert_wrong_state(
        b.store
            .take_over(k, Token(t2.0 + 1), at(LEASE), dur(LEASE))
            .await
            .map(|_| ()),
        r,
        "in_flight",
    );
    assert_fenced(b.complete(k, t1, LEASE + S, "late").await, r);
    match b.claim(k, None, LEASE + S).await {
        Claim::InFlight {
            reference,
            lease_expires_at,
            ..
        } => {
            assert_eq!(reference, r);
            assert_eq!(lease_expires_at, at(2 * LEASE));
        }
        other => panic!("{other:?}"),
    }
    b.complete(k, t2, LEASE + 2 * S, "done")
        .await
        .expect("the new runner completes");
    assert!(matches!(
        b.claim(k, None, LEASE + 3 * S).await,
        Claim::Completed { reference, .. } if reference == r
    ));
    assert_wrong_state(
        b.store
            .take_over(k, Token(t2.0 + 2), at(3 * LEASE), dur(LEASE))
            .await
            .map(|_| ()),
        r,
        "completed",
    );

    // Unknown: taken over at once (nothing renews an unknown record).
    let u = key("gone-unknown");
    let tu = b.new_claim(u, None, 0).await;
    b.store.mark_unknown(u, tu).await.expect("mark unknown");
    let tv = Token(tu.0 + 1);
    assert_eq!(
        b.store
            .take_over(u, tv, at(S), dur(LEASE))
            .await
            .expect("taken over"),
        u.reference(1)
    );
    assert_fenced(b.store.mark_unknown(u, tu).await, u.reference(1));
    b.complete(u, tv, 2 * S, "done").await.expect("complete");

    assert_not_found(
        b.store
            .take_over(key("never claimed"), tv, at(S), dur(LEASE))
            .await
            .map(|_| ()),
    );

    // A crowd of repeats finding the same gone call: one runner.
    let c = key("gone-crowd");
    b.new_claim(c, None, 0).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..b.crowd() as i64 {
        let store = b.store.clone();
        tasks.spawn(async move {
            store
                .take_over(c, Token(1_000 + i), at(LEASE + S), dur(LEASE))
                .await
        });
    }
    let mut won = 0;
    while let Some(r) = tasks.join_next().await {
        match r.expect("task") {
            Ok(_) => won += 1,
            Err(StoreError::WrongState { state, .. }) => assert_eq!(state, "in_flight"),
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(won, 1, "exactly one takeover wins");
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let b = super::Backend { store: std::sync::Arc::new(super::MemoryStore::new()), kind: super::Kind::Memory };
                    super::$case(&b).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let file = super::SqliteFile::new(stringify!($case));
                    let store = super::SqliteStore::open(&file.0).await.expect("open the SQLite store");
                    let b = super::Backend { store: std::sync::Arc::new(store.clone()), kind: super::Kind::Sqlite };
                    super::$case(&b).await;
                    store.pool().close().await;
                }
            )*
        }
        mod postgres {
            $(
                #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(schema) = super::TestSchema::create("conf").await else { return };
                    let store = schema.store().await;
                    let b = super::Backend { store: std::sync::Arc::new(store.clone()), kind: super::Kind::Postgres };
                    super::$case(&b).await;
                    store.pool().close().await;
                    schema.drop_schema().await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let url = super::shared_server().url();
                    let store = super::redis_store().connect(&url).await.expect("connect to Redis");
                    let b = super::Backend { store: std::sync::Arc::new(store), kind: super::Kind::Redis };
                    super::$case(&b).await;
                }
            )*
        }
        mod redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let seeds = super::shared_cluster().seeds();
                    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
                    let store = super::redis_store().connect_cluster(&seeds).await.expect("connect to the cluster");
                    let b = super::Backend { store: std::sync::Arc::new(store), kind: super::Kind::Redis };
                    super::$case(&b).await;
                }
            )*
        }
    };
}

/// A Redis store of a namespace of its own (tests share one server), deciding by the times the
/// cases pass (`trust_engine_clock`), as the other stores do.
fn redis_store() -> idempotency::store::RedisStoreBuilder {
    RedisStore::builder()
        .namespace(unique_name("conf"))
        .trust_engine_clock()
}

suite!(
    no_row_is_new_then_in_flight,
    in_flight_stays_in_flight_after_its_lease,
    completed_replays_within_its_window,
    window_edges,
    slow_completion_counts_the_window_from_completion,
    fingerprint_mismatch,
    released_is_taken_over_under_the_same_reference,
    unknown_answers_unknown_until_settled,
    stale_tokens_are_fenced,
    tokens_are_not_reused_after_a_purge,
    late_completion_after_settle_is_fenced,
    renew_extends_the_lease,
    status_is_tenant_scoped_and_generation_exact,
    purge_deletes_only_settled_records_past_the_cutoff,
    unsettled_lists_expired_leases_and_unknowns,
    settle_completed_answers_repeats_for_the_window,
    settle_released_lets_a_repeat_run_under_the_same_reference,
    settle_unknown_keeps_it_unknown_and_fences_the_worker,
    outbox_is_written_with_the_completion,
    concurrent_claims_have_one_winner,
    concurrent_takeovers_have_one_winner,
    a_gone_call_is_taken_over_once_under_its_reference,
);

// ---------------------------------------------------------------------------------------------
// SQL stores only
// ---------------------------------------------------------------------------------------------

mod sql {
    use super::*;
    use sqlx::postgres::PgPoolOptions;
    use sqlx::Row;

    #[tokio::test]
    async fn sqlite_in_memory_databases_are_refused() {
        for path in [":memory:", ""] {
            let err = SqliteStore::open(path)
                .await
                .expect_err("an in-memory database forgets its records");
            assert!(
                matches!(&err, StoreError::Config { problem, .. } if problem.contains("needs a database file")),
                "{path:?}: {err}"
            );
        }
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect("sqlite::memory:")
            .await
            .expect("pool");
        let err = SqliteStore::from_pool(pool)
            .await
            .expect_err("refused on a pool too");
        assert!(err.to_string().contains("MemoryStore"), "{err}");

        // A file, even one opened without WAL, is accepted (with a warning in the log).
        let file = SqliteFile::new("no-wal");
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect_with(
                sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&file.0)
                    .create_if_missing(true),
            )
            .await
            .expect("pool");
        let store = SqliteStore::from_pool(pool)
            .await
            .expect("a file is accepted");
        store.pool().close().await;
    }

    #[tokio::test]
    async fn sqlite_migrations_are_recorded_once_in_their_own_table() {
        let file = SqliteFile::new("migrate");
        let store = SqliteStore::open(&file.0).await.expect("open");
        store.migrate().await.expect("a second run changes nothing");
        let again = SqliteStore::open(&file.0).await.expect("reopen");
        let versions: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM idempotency_migrations ORDER BY version")
                .fetch_all(again.pool())
                .await
                .expect("versions");
        assert_eq!(versions, vec![1]);
        let sqlx_table: Option<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE name = '_sqlx_migrations'")
                .fetch_optional(again.pool())
                .await
                .expect("sqlite_master");
        assert_eq!(sqlx_table, None, "never the application's _sqlx_migrations");

        sqlx::query("INSERT INTO idempotency_migrations (version, description, checksum) VALUES (99, 'future', x'00')")
            .execute(again.pool())
            .await
            .expect("insert");
        store.pool().close().await;
        again.pool().close().await;
        let err = SqliteStore::open(&file.0)
            .await
            .expect_err("a newer file is refused");
        assert!(
            matches!(&err, StoreError::Migration { problem: m, .. } if m.contains("99") && m.contains("newer build")),
            "{err}"
        );
    }

    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_migrations_run_once_under_a_lock() {
        let Some(schema) = TestSchema::create("migrate").await else {
            return;
        };
        // Eight replicas starting at once on an empty schema.
        let mut starts = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let options = PostgresStore::tune(schema.options());
            starts.spawn(async move {
                let pool = PgPoolOptions::new()
                    .max_connections(2)
                    .connect_with(options)
                    .await
                    .expect("pool");
                PostgresStore::from_pool(pool).await
            });
        }
        let mut stores = Vec::new();
        while let Some(r) = starts.join_next().await {
            stores.push(r.expect("task").expect("every replica starts"));
        }
        let pool = stores[0].pool().clone();
        let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM idempotency_migrations")
            .fetch_all(&pool)
            .await
            .expect("versions");
        assert_eq!(versions, vec![1]);
        let sqlx_table: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::TEXT")
                .fetch_one(&pool)
                .await
                .expect("regclass");
        assert_eq!(sqlx_table, None);

        sqlx::query("INSERT INTO idempotency_migrations (version, description, checksum) VALUES (99, 'future', '\\x00')")
            .execute(&pool)
            .await
            .expect("insert");
        let err = PostgresStore::from_pool(pool.clone())
            .await
            .expect_err("a newer schema is refused");
        assert!(
            matches!(&err, StoreError::Migration { problem: m, .. } if m.contains("99") && m.contains("newer build")),
            "{err}"
        );
        for s in stores {
            s.pool().close().await;
        }
        schema.drop_schema().await;
    }

    #[tokio::test]
    async fn sqlite_undecodable_rows_are_corrupt() {
        let file = SqliteFile::new("corrupt");
        let store = SqliteStore::open(&file.0).await.expect("open");
        let k = key("odd");
        // State 9 on the key's own row; a key_rest of 2 bytes on an unknown one.
        sqlx::query(
            "INSERT INTO idempotency_records (ref, key_rest, tenant, subject, tool, generation, state, token, claimed_at, ends_at, window_ms, fingerprint) \
             VALUES ($1, $2, 'acme', '', 'charge_card', 1, 9, 1, 0, 0, 0, x''), (7, x'0102', 'acme', '', 'charge_card', 1, 2, 1, 0, 0, 0, x'')",
        )
        .bind(i64::from_be_bytes(k.reference(1).prefix().to_owned()))
        .bind(&k.as_bytes()[8..])
        .execute(store.pool())
        .await
        .expect("insert");
        let claim = store.claim(&req(k, None, 0)).await;
        assert!(
            matches!(claim, Err(StoreError::Corrupt { .. })),
            "{claim:?}"
        );
        let unsettled = store.unsettled(at(0), 10).await;
        assert!(
            matches!(unsettled, Err(StoreError::Corrupt { .. })),
            "{unsettled:?}"
        );
        store.pool().close().await;
    }

    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test]
    async fn postgres_undecodable_rows_are_corrupt() {
        let Some(schema) = TestSchema::create("corrupt").await else {
            return;
        };
        let store = schema.store().await;
        let k = key("odd");
        // State 9 on the key's own row; a key_rest of 2 bytes on an unknown one.
        sqlx::query(
            "INSERT INTO idempotency_records (ref, key_rest, tenant, subject, tool, generation, state, token, claimed_at, window_s, lease_or_settled_at, fingerprint) \
             VALUES ($1, $2, 'acme', '', 'charge_card', 1, 9, 1, 0, 0, 0, ''), (7, '\\x0102', 'acme', '', 'charge_card', 1, 2, 1, 0, 0, 0, '')",
        )
        .bind(i64::from_be_bytes(k.reference(1).prefix().to_owned()))
        .bind(&k.as_bytes()[8..])
        .execute(store.pool())
        .await
        .expect("insert");
        let claim = store.claim(&req(k, None, 0)).await;
        assert!(
            matches!(claim, Err(StoreError::Corrupt { .. })),
            "{claim:?}"
        );
        let unsettled = store.unsettled(at(0), 10).await;
        assert!(
            matches!(unsettled, Err(StoreError::Corrupt { .. })),
            "{unsettled:?}"
        );
        store.pool().close().await;
        schema.drop_schema().await;
    }

    fn literal(ty: &str) -> &'static str {
        match ty {
            "bytea" => "'\\x00'::bytea",
            "text" => "'x'::text",
            "bigint" => "0::bigint",
            "integer" => "0::integer",
            "smallint" => "0::smallint",
            "boolean" => "true",
            "text[]" => "'{}'::text[]",
            other => panic!("no literal for parameter type {other}"),
        }
    }

    /// Every statement the store runs on its records, prepared on an analysed EMPTY table with
    /// generic plans forced from the first execution, still uses the primary key once the table
    /// is full (purge and the reconciler's query: `postgres_background_work_reads_its_indexes`).
    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test]
    async fn postgres_generic_plans_use_the_primary_key() {
        let Some(schema) = TestSchema::create("plans").await else {
            return;
        };
        // One connection, so every statement the store prepares is on it.
        let options = PostgresStore::tune(schema.options())
            .options([("plan_cache_mode", "force_generic_plan")]);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .expect("pool");
        let store = PostgresStore::from_pool(pool.clone()).await.expect("store");
        sqlx::raw_sql("ANALYZE idempotency_records")
            .execute(&pool)
            .await
            .expect("analyze");

        // Exercise every lookup.
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let ta = match store.claim(&req(a, None, 0)).await.expect("claim") {
            Claim::New { token, .. } => token,
            other => panic!("{other:?}"),
        };
        store
            .claim(&req(a, None, S))
            .await
            .expect("claim in flight");
        store.renew(a, ta, at(0), dur(LEASE)).await.expect("renew");
        let done = answer("done");
        let outbox = [message("receipt_email", "{}")];
        let with_outbox = Completion {
            key: a,
            token: ta,
            response: &done,
            now: at(S),
            outbox: &outbox,
        };
        store
            .complete(&with_outbox)
            .await
            .expect("complete with outbox");
        store.claim(&req(a, None, 2 * S)).await.expect("replay");
        store
            .status(TENANT, "alice", a.reference(1))
            .await
            .expect("status");
        let tb = match store.claim(&req(b, None, 0)).await.expect("claim") {
            Claim::New { token, .. } => token,
            other => panic!("{other:?}"),
        };
        let plain = Completion {
            key: b,
            token: tb,
            response: &done,
            now: at(S),
            outbox: &[],
        };
        store.complete(&plain).await.expect("complete");
        assert!(
            store.release(b, tb, at(S)).await.is_err(),
            "a refused update reads the row"
        );
        let tc = match store.claim(&req(c, None, 0)).await.expect("claim") {
            Claim::New { token, .. } => token,
            other => panic!("{other:?}"),
        };
        store.mark_unknown(c, tc).await.expect("mark unknown");
        store
            .settle(c, tc, &Settlement::Released, at(S))
            .await
            .expect("settle");
        assert!(
            matches!(
                store.claim(&req(c, None, 2 * S)).await,
                Ok(Claim::New { .. })
            ),
            "a released record is taken over"
        );

        // Fill the table behind the cached plans' back.
        sqlx::raw_sql(
            "INSERT INTO idempotency_records (ref, token, claimed_at, window_s, lease_or_settled_at, generation, \
             state, key_rest, tenant, subject, tool, fingerprint, response) \
             SELECT i, 1, 0, 0, 0, 1, 1, substring(sha256(i::text::bytea) FROM 9), 'acme', '', 'charge_card', '', \
             repeat('x', 70) FROM generate_series(1, 20000) i",
        )
        .execute(&pool)
        .await
        .expect("fill");

        let statements = sqlx::query(
            "SELECT name, statement, array_to_string(parameter_types::text[], ','), generic_plans \
             FROM pg_prepared_statements WHERE statement LIKE '%idempotency_records%'",
        )
        .fetch_all(&pool)
        .await
        .expect("prepared statements");
        let mut checked = 0;
        for row in statements {
            let (name, sql, types, generic): (String, String, String, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let scan = sql.starts_with("WITH RECURSIVE");
            if scan || !sql.contains("ref = $1") {
                continue;
            }
            assert!(generic >= 1, "ran with a generic plan: {sql}");
            let args: Vec<&str> = types
                .split(',')
                .filter(|t| !t.is_empty())
                .map(literal)
                .collect();
            let explain = format!("EXPLAIN EXECUTE {name}({})", args.join(", "));
            let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
                .fetch_all(&pool)
                .await
                .expect("explain");
            let plan = plan.join("\n");
            assert!(
                !plan.contains("Seq Scan on idempotency_records"),
                "{sql}\n{plan}"
            );
            assert!(plan.contains("idempotency_records_pkey"), "{sql}\n{plan}");
            checked += 1;
        }
        assert!(checked >= 8, "checked {checked} statements");
        pool.close().await;
        schema.drop_schema().await;
    }

    /// A steady-state table in miniature: `rows` completed records claimed over the last 48 h
    /// with a 15-minute window, one in 500 expired (past the retention), 100 unsettled (in
    /// flight with the lease ended, or unknown) and 20 in flight with a live lease. Times are
    /// `T0`-relative, as `at()`; the same rows on both backends (`$1` rows, `$2` T0).
    const STEADY_STATE: &str = "\
        INSERT INTO idempotency_records (ref, token, claimed_at, ends_at, window_ms, completed_at, generation, \
            state, key_rest, tenant, subject, tool, fingerprint, response) \
        SELECT i * 7919, 1, c, CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c + 900000 END, 900000, \
            CASE WHEN st IN (0, 2) THEN NULL ELSE c END, 1, st, zeroblob24, 'acme', '', 'charge_card', \
            zeroblob0, CASE WHEN st IN (0, 2) THEN NULL ELSE 'x' END \
        FROM (SELECT i, \
                CASE WHEN i % 500 = 0 THEN $2 - 260000000 + i \
                     WHEN i % 997 = 1 AND i < 99700 THEN $2 - 600000 + i \
                     WHEN i % 991 = 3 AND i < 19820 THEN $2 - 1000 + i \
                     ELSE $2 - 172000000 + (i * 1000) % 171000000 END AS c, \
                CASE WHEN i % 500 = 0 THEN 1 \
                     WHEN i % 997 = 1 AND i < 99700 THEN (i % 2) * 2 \
                     WHEN i % 991 = 3 AND i < 19820 THEN 0 \
                     ELSE 1 END AS st \
              FROM SERIES) s";

    /// PostgreSQL's row keeps the window's length and one time, the lease's end while unsettled
    /// or the completion's (see its migration): the same records in its columns.
    fn pg_steady_state(series: &str, zeroblob24: &str, zeroblob0: &str) -> String {
        steady_state(series, zeroblob24, zeroblob0)
            .replace(
                "ends_at, window_ms, completed_at",
                "window_s, lease_or_settled_at",
            )
            .replace(
                "CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c + 900000 END, 900000, \
            CASE WHEN st IN (0, 2) THEN NULL ELSE c END",
                "900, CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c END",
            )
    }

    fn steady_state(series: &str, zeroblob24: &str, zeroblob0: &str) -> String {
        STEADY_STATE
            .replace("SERIES", series)
            .replace("zeroblob24", zeroblob24)
            .replace("zeroblob0", zeroblob0)
    }

    /// Purge and the reconciler's query read their partial indexes, never the whole table: with
    /// the store's own sessions (generic plans forced from the first execution on an analysed
    /// EMPTY table, as the per-call statements above), and with PostgreSQL's default settings
    /// (`enable_seqscan` on, plans chosen with the values) on a full analysed table.
    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test]
    async fn postgres_background_work_reads_its_indexes() {
        let Some(schema) = TestSchema::create("bgplans").await else {
            return;
        };
        let options = PostgresStore::tune(schema.options())
            .options([("plan_cache_mode", "force_generic_plan")]);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .expect("pool");
        let store = PostgresStore::from_pool(pool.clone()).await.expect("store");
        sqlx::raw_sql("ANALYZE idempotency_records")
            .execute(&pool)
            .await
            .expect("analyze");
        store.purge(at(0), at(0), 1_000).await.expect("purge");
        store.unsettled(at(0), 100).await.expect("unsettled");

        let fill = pg_steady_state(
            "generate_series(1, $1::BIGINT) i",
            "'\\x000000000000000000000000000000000000000000000000'::BYTEA",
            "''::BYTEA",
        );
        sqlx::query(sqlx::AssertSqlSafe(fill))
            .bind(100_000i64)
            .bind(T0)
            .execute(&pool)
            .await
            .expect("fill");
        sqlx::raw_sql("ANALYZE idempotency_records")
            .execute(&pool)
            .await
            .expect("analyze");

        let background = |sql: &str| {
            if sql.starts_with("WITH RECURSIVE") && sql.contains("DELETE FROM idempotency_records")
            {
                Some("purge")
            } else if sql.starts_with("WITH RECURSIVE") {
                Some("unsettled")
            } else {
                None
            }
        };
        let index = "idempotency_records_window";
        let statements = sqlx::query(
            "SELECT name, statement, array_to_string(parameter_types::text[], ','), generic_plans \
             FROM pg_prepared_statements WHERE statement LIKE '%idempotency_records%'",
        )
        .fetch_all(&pool)
        .await
        .expect("prepared statements");
        let mut texts = Vec::new();
        for row in statements {
            let (name, sql, types, generic): (String, String, String, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let Some(which) = background(&sql) else {
                continue;
            };
            assert!(generic >= 1, "ran with a generic plan: {sql}");
            let args: Vec<&str> = types.split(',').map(literal).collect();
            let explain = format!("EXPLAIN EXECUTE {name}({})", args.join(", "));
            let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
                .fetch_all(&pool)
                .await
                .expect("explain");
            let plan = plan.join("\n");
            assert!(
                !plan.contains("Seq Scan on idempotency_records"),
                "{sql}\n{plan}"
            );
            assert!(plan.contains(index), "{sql}\n{plan}");
            texts.push((sql, which));
        }
        assert_eq!(texts.len(), 2, "purge and unsettled were prepared");

        // PostgreSQL's defaults, the values known: the planner picks the indexes on its own.
        let plain = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(schema.options())
            .await
            .expect("pool");
        for (i, (sql, which)) in texts.iter().enumerate() {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PREPARE bg{i} AS {sql}")))
                .execute(&plain)
                .await
                .expect("prepare");
            // $1 now, $2 limit, then the cutoff (purge) or the clock offset (unsettled); a NULL
            // offset takes the engine's `now` as given.
            let args = if *which == "purge" {
                format!("{T0}, 1000, {}, NULL", T0 - 48 * 60 * M)
            } else {
                format!("{T0}, 100, NULL")
            };
            let explain = format!("EXPLAIN ANALYZE EXECUTE bg{i}({args})");
            let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
                .fetch_all(&plain)
                .await
                .expect("explain");
            let plan = plan.join("\n");
            assert!(
                !plan.contains("Seq Scan on idempotency_records"),
                "{sql}\n{plan}"
            );
            assert!(plan.contains(index), "{sql}\n{plan}");
        }
        plain.close().await;
        pool.close().await;
        schema.drop_schema().await;
    }

    /// A claim as the PostgreSQL store writes it (claim time: the statement's clock), in flight
    /// with its lease ended at once.
    const CLAIMED_NOW_LEASE_ENDED: &str = "\
        INSERT INTO idempotency_records (ref, token, claimed_at, window_s, lease_or_settled_at, \
            generation, state, key_rest, tenant, subject, tool, fingerprint) \
        SELECT 42, 1, t, 900, t, 1, 0, '\\x000000000000000000000000000000000000000000000000', \
            'acme', '', 'charge_card', '' \
        FROM (SELECT (date_part('epoch', statement_timestamp()) * 1000)::BIGINT AS t) s";

    /// The database's clock stepping back past the reconciler's mark does not hide the claims
    /// made after the step: the round that finds its clock behind the mark moves the mark back,
    /// and the next round reads them.
    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test]
    async fn postgres_reconciler_survives_the_clock_stepping_back() {
        let Some(schema) = TestSchema::create("stepback").await else {
            return;
        };
        let store = schema.server_clock_store().await;
        let pool = store.pool().clone();
        // A round while the clock read 10 minutes later than it will after the step.
        let before_the_step = store.clone().with_server_clock_offset(600_000);
        assert!(before_the_step
            .unsettled(at(0), 10)
            .await
            .expect("unsettled")
            .is_empty());
        // After the step: a claim.
        sqlx::query(CLAIMED_NOW_LEASE_ENDED)
            .execute(&pool)
            .await
            .expect("insert");
        let mut found = 0;
        for _ in 0..2 {
            found = found.max(store.unsettled(at(0), 10).await.expect("unsettled").len());
        }
        assert_eq!(found, 1, "the claim made after the step is reconciled");
        pool.close().await;
        schema.drop_schema().await;
    }

    /// PostgreSQL keeps a window to the second, rounded up (`window_s`): a 1.5 s window answers
    /// repeats for 2 s. (Every other store keeps it to the millisecond.)
    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test]
    async fn postgres_windows_are_whole_seconds_rounded_up() {
        let Some(schema) = TestSchema::create("seconds").await else {
            return;
        };
        let store = schema.store().await;
        let k = key("sub-second window");
        let claim = req_window(k, None, 0, 1_500);
        let Claim::New { token, .. } = store.claim(&claim).await.expect("claim") else {
            panic!("not new")
        };
        let done = answer("done");
        store
            .complete(&Completion {
                key: k,
                token,
                response: &done,
                now: at(0),
                outbox: &[],
            })
            .await
            .expect("complete");
        let within = store.claim(&req(k, None, 1_900)).await.expect("claim");
        assert!(matches!(within, Claim::Completed { .. }), "{within:?}");
        let after = store.claim(&req(k, None, 2_000)).await.expect("claim");
        assert!(matches!(after, Claim::New { .. }), "{after:?}");
        store.pool().close().await;
        schema.drop_schema().await;
    }

    /// A store as users get it runs its claim and completion on the server's clock alone (two
    /// parameters fewer than the statements with a clock offset): the lease's length and the
    /// completion's window still land in the row as given. Read back by stores whose clocks are
    /// ahead: by 10 s (20 s of a 30 s lease left), then 1 s and 2.5 s after a completion with a
    /// 2 s window (answered, then a new operation).
    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test]
    async fn postgres_server_clock_statements_keep_the_lease_and_the_window() {
        let Some(schema) = TestSchema::create("serverclock").await else {
            return;
        };
        let store = schema.server_clock_store().await;
        let ahead = |ms| store.clone().with_server_clock_offset(ms);
        let k = key("on the server's clock");
        let claim = ClaimRequest {
            lease: dur(30_000),
            window: dur(2_000),
            ..req(k, None, 0)
        };
        let Claim::New { token, .. } = store.claim(&claim).await.expect("claim") else {
            panic!("not new")
        };
        match ahead(10_000).claim(&claim).await.expect("claim") {
            Claim::InFlight {
                lease_expires_at, ..
            } => assert!(
                (at(19_000)..=at(20_000)).contains(&lease_expires_at),
                "{lease_expires_at:?}"
            ),
            other => panic!("{other:?}"),
        }
        let done = answer("done");
        store
            .complete(&Completion {
                key: k,
                token,
                response: &done,
                now: at(0),
                outbox: &[],
            })
            .await
            .expect("complete");
        let within = ahead(1_000).claim(&claim).await.expect("claim");
        assert!(matches!(within, Claim::Completed { .. }), "{within:?}");
        let after = ahead(2_500).claim(&claim).await.expect("claim");
        assert!(matches!(after, Claim::New { .. }), "{after:?}");
        store.pool().close().await;
        schema.drop_schema().await;
    }

    /// Two replicas claim one key at once: the second's insert waits on the first's open
    /// transaction, and when that commits, the second's statement finds the key taken but cannot
    /// read the row (READ COMMITTED: its snapshot is older than the commit). It must not take
    /// that for a win: it claims again and answers with the first replica's claim, in flight.
    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test]
    async fn postgres_a_claim_that_waited_on_another_replicas_claim_does_not_win() {
        let Some(schema) = TestSchema::create("waited").await else {
            return;
        };
        let k = key("claimed by two replicas at once");
        let second_pool = schema.pool(1).await;
        let second = PostgresStore::from_pool(second_pool.clone())
            .await
            .expect("store");
        let first = schema.pool(1).await;
        let mut tx = first.begin().await.expect("begin");
        sqlx::query(
            "INSERT INTO idempotency_records (ref, token, claimed_at, window_s, lease_or_settled_at, \
                 generation, state, key_rest, tenant, subject, tool, fingerprint) \
             SELECT $1, 7, t, 900, t + 60000, 1, 0, $2, $3, '', $4, '' \
             FROM (SELECT (date_part('epoch', statement_timestamp()) * 1000)::BIGINT AS t) s",
        )
        .bind(i64::from_be_bytes(k.as_bytes()[..8].try_into().expect("8 bytes")))
        .bind(&k.as_bytes()[8..])
        .bind(TENANT)
        .bind(TOOL)
        .execute(&mut *tx)
        .await
        .expect("the first replica's claim, uncommitted");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&second_pool)
            .await
            .expect("pid");
        let claiming = tokio::spawn(async move { second.claim(&req(k, None, 0)).await });
        // Until the second replica's statement waits on the first's transaction.
        let watch = schema.pool(1).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let blocked: bool = sqlx::query_scalar("SELECT cardinality(pg_blocking_pids($1)) > 0")
                .bind(pid)
                .fetch_one(&watch)
                .await
                .expect("blocking pids");
            if blocked {
                break;
            }
            assert!(
                !claiming.is_finished(),
                "the second claim ended without waiting on the first"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "the second claim did not wait on the first within 30 s"
            );
        }
        tx.commit().await.expect("commit the first claim");
        let answer = claiming.await.expect("join").expect("claim");
        match answer {
            Claim::InFlight { reference, .. } => assert_eq!(reference, k.reference(1)),
            other => panic!("the second replica did not see the first's claim: {other:?}"),
        }
        let token: i64 = sqlx::query_scalar("SELECT token FROM idempotency_records")
            .fetch_one(&watch)
            .await
            .expect("the row");
        assert_eq!(token, 7, "the first replica's claim was replaced");
        schema.drop_schema().await;
    }

    /// A claim whose transaction is still open while a reconciler round runs is not lost: that
    /// round cannot see it, and the mark it leaves trails the open transaction, so the next
    /// round reads it.
    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test]
    async fn postgres_reconciler_reads_a_claim_committed_during_a_round() {
        let Some(schema) = TestSchema::create("mark").await else {
            return;
        };
        let store = schema.server_clock_store().await;
        let pool = store.pool().clone();
        assert!(store
            .unsettled(at(0), 10)
            .await
            .expect("unsettled")
            .is_empty());
        // A claim, in a transaction left open.
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query(CLAIMED_NOW_LEASE_ENDED)
            .execute(&mut *tx)
            .await
            .expect("insert");
        let during = store.unsettled(at(0), 10).await.expect("unsettled");
        assert!(during.is_empty(), "{during:?}");
        tx.commit().await.expect("commit");
        let after = store.unsettled(at(0), 10).await.expect("unsettled");
        assert_eq!(after.len(), 1, "{after:?}");
        // Watched from now on: a round 10 minutes later (a store whose clock is that far ahead),
        // whose mark is past the claim, still lists it.
        let later = store.clone().with_server_clock_offset(600_000);
        let again = later.unsettled(at(0), 10).await.expect("unsettled");
        assert_eq!(again.len(), 1, "{again:?}");
        let mark: i64 = sqlx::query_scalar("SELECT mark FROM idempotency_reconciler")
            .fetch_one(&pool)
            .await
            .expect("mark");
        let claimed: i64 = sqlx::query_scalar("SELECT claimed_at FROM idempotency_records")
            .fetch_one(&pool)
            .await
            .expect("claim time");
        assert!(
            mark > claimed,
            "the round read it from the watch, not as a new claim"
        );
        pool.close().await;
        schema.drop_schema().await;
    }

    /// SQLite: purge and the reconciler's query search their partial indexes (`EXPLAIN QUERY
    /// PLAN`), on an empty file and on a full analysed one.
    #[tokio::test]
    async fn sqlite_background_work_reads_its_indexes() {
        let file = SqliteFile::new("bgplans");
        let store = SqliteStore::open(&file.0).await.expect("open");
        let pool = store.pool().clone();
        let check = |label: &'static str| {
            let pool = pool.clone();
            async move {
                let [purge, unsettled] = SqliteStore::background_statements();
                for (sql, index, args) in [
                    (
                        purge,
                        "idempotency_records_settled",
                        (T0 - 48 * 60 * M, 1000i64),
                    ),
                    (unsettled, "idempotency_records_open", (T0, 100)),
                ] {
                    let explain = format!("EXPLAIN QUERY PLAN {sql}");
                    let rows = sqlx::query(sqlx::AssertSqlSafe(explain))
                        .bind(args.0)
                        .bind(args.1)
                        .fetch_all(&pool)
                        .await
                        .expect("explain");
                    let plan: Vec<String> = rows.iter().map(|r| r.get::<String, _>(3)).collect();
                    let plan = plan.join("\n");
                    assert!(
                        !plan
                            .lines()
                            .any(|l| l.starts_with("SCAN idempotency_records")
                                && !l.contains("USING")),
                        "{label}: {sql}\n{plan}"
                    );
                    assert!(plan.contains(index), "{label}: {sql}\n{plan}");
                }
            }
        };
        check("empty").await;
        let fill = steady_state(
            "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) SELECT i FROM n)",
            "zeroblob(24)",
            "X''",
        );
        sqlx::query(sqlx::AssertSqlSafe(fill))
            .bind(100_000i64)
            .bind(T0)
            .execute(&pool)
            .await
            .expect("fill");
        sqlx::raw_sql("ANALYZE")
            .execute(&pool)
            .await
            .expect("analyze");
        check("full").await;
        assert_eq!(
            store
                .unsettled(at(0), 1_000)
                .await
                .expect("unsettled")
                .len(),
            100
        );
        assert_eq!(
            store
                .purge(at(0), at(-48 * 60 * M), 1_000)
                .await
                .expect("purge"),
            200
        );
        pool.close().await;
    }
}
