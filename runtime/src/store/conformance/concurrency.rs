//! Concurrent claims and takeovers: one winner.

use super::fixtures::*;
use super::subject::*;
use crate::key::Key;
use crate::store::{Claim, Fenced, StoreError, Token};

// ---------------------------------------------------------------------------------------------
// Contention
// ---------------------------------------------------------------------------------------------

async fn crowd(b: &Subject, k: Key, now: i64) -> Vec<Claim> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..b.crowd {
        let store = b.store.clone();
        tasks.spawn(async move {
            store
                .claim(&req(k, None, now))
                .await
                .expect("expected the claim to be answered")
        });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r.expect("a concurrent caller panicked"));
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

pub(super) async fn concurrent_claims_have_one_winner(b: &Subject) {
    let k = key("crowd");
    one_winner(
        &crowd(b, k, 0).await,
        Claim::New {
            reference: k.reference(1),
            token: first_token(0),
        },
    );
}

pub(super) async fn concurrent_takeovers_have_one_winner(b: &Subject) {
    let k = key("released-crowd");
    let t = b.new_claim(k, None, 0).await;
    b.store
        .release(k, t, at(S))
        .await
        .expect("expected the release to apply");
    one_winner(
        &crowd(b, k, 2 * S).await,
        Claim::New {
            reference: k.reference(1),
            token: first_token(2 * S),
        },
    );

    let k = key("expired-crowd");
    let t = b.new_claim_window(k, None, 0, S).await;
    b.complete(k, t, 0, "old")
        .await
        .expect("expected the completion to apply");
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
pub(super) async fn a_gone_call_is_taken_over_once_under_its_reference(b: &Subject) {
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
            .expect("expected the takeover to apply"),
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
    b.store
        .mark_unknown(u, tu)
        .await
        .expect("expected marking it unknown to apply");
    let tv = Token(tu.0 + 1);
    assert_eq!(
        b.store
            .take_over(u, tv, at(S), dur(LEASE))
            .await
            .expect("expected the takeover to apply"),
        u.reference(1)
    );
    assert_fenced(b.store.mark_unknown(u, tu).await, u.reference(1));
    b.complete(u, tv, 2 * S, "done")
        .await
        .expect("expected the completion to apply");

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
    for i in 0..b.crowd as i64 {
        let store = b.store.clone();
        tasks.spawn(async move {
            store
                .take_over(c, Token(1_000 + i), at(LEASE + S), dur(LEASE))
                .await
        });
    }
    let mut won = 0;
    while let Some(r) = tasks.join_next().await {
        match r.expect("a concurrent caller panicked") {
            Ok(_) => won += 1,
            Err(StoreError::WrongState { state, .. }) => assert_eq!(state, "in_flight"),
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(won, 1, "exactly one takeover wins");
}
