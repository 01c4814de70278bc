//! One conformance suite, run against every store: `MemoryStore` (the reference), `SqliteStore`
//! (a temporary file), `PostgresStore` (a schema of its own per test; skipped with a printed
//! line without `DATABASE_URL`) and `RedisStore`, on one Redis and on a 3-master + 3-replica
//! Redis Cluster (servers of this test process's own, a namespace per test). Every case passes explicit times, so window edges are exact.
//!
//! What only the SQL stores have (migrations, undecodable rows, plans) is in
//! `sql_conformance.rs`; the fixtures both use are in `idempotency_tests::conformance`.

use idempotency::key::Key;
use idempotency::store::{
    Claim, ClaimRequest, MemoryStore, Receipt, RecordState, RecordStatus, RedisStore, Settlement,
    SqliteStore, StoreError, StoredResponse, Token, Unsettled,
};
use idempotency_tests::conformance::*;
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::redis_servers::{shared_cluster, shared_server};

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
