//! Takeovers, unknown records, tokens and fencing, lease renewal.

use super::fixtures::*;
use super::subject::*;
use crate::store::{Claim, Fenced, RecordState, Settlement, StoredResponse};

pub(super) async fn released_is_taken_over_under_the_same_reference(b: &Subject) {
    let k = key("retry");
    let t1 = b.new_claim(k, None, 0).await;
    b.store
        .release(k, t1, at(S))
        .await
        .expect("expected the release to apply");
    let released = b
        .status(TENANT, k.reference(1))
        .await
        .expect("expected the record");
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
    let taken = b
        .status(TENANT, k.reference(1))
        .await
        .expect("expected the record");
    assert_eq!(
        (taken.state, taken.claimed_at, taken.completed_at),
        (RecordState::InFlight, at(2 * S), None)
    );
    assert_fenced(b.complete(k, t1, 3 * S, "stale").await, k.reference(1));
    b.complete(k, first_token(2 * S), 3 * S, "done")
        .await
        .expect("expected the completion to apply");
    assert!(
        matches!(b.claim(k, None, 4 * S).await, Claim::Completed { response, .. } if response == answer("done"))
    );
}

pub(super) async fn unknown_answers_unknown_until_settled(b: &Subject) {
    let k = key("lost");
    let t = b.new_claim(k, None, 0).await;
    b.store
        .mark_unknown(k, t)
        .await
        .expect("expected marking it unknown to apply");
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
pub(super) async fn tokens_are_not_reused_after_a_purge(b: &Subject) {
    let k = key("purged");
    let old = b.new_claim(k, None, 0).await;
    b.settle(k, old, &Settlement::Released, S)
        .await
        .expect("expected the settlement to apply");
    let later = 50 * 60 * M; // 50 h
    assert_eq!(
        b.store
            .purge(at(later), at(later), 10)
            .await
            .expect("expected the purge to succeed"),
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

pub(super) async fn stale_tokens_are_fenced(b: &Subject) {
    let k = key("fenced");
    let t1 = b.new_claim(k, None, 0).await;
    b.store
        .release(k, t1, at(S))
        .await
        .expect("expected the release to apply");
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

    b.complete(k, t2, 3 * S, "done")
        .await
        .expect("expected the completion to apply");
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
    b.complete_with(e, te, S, &declined)
        .await
        .expect("expected the completion with an error answer to apply");
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

pub(super) async fn late_completion_after_settle_is_fenced(b: &Subject) {
    let k = key("late");
    let t = b.new_claim(k, None, 0).await;
    let due = b.unsettled(LEASE, 10).await;
    assert_eq!(
        due.iter().map(|u| (u.key, u.token)).collect::<Vec<_>>(),
        vec![(k, t)]
    );
    b.settle(k, t, &Settlement::Completed(answer("settled")), LEASE + S)
        .await
        .expect("expected the settlement to apply");
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

pub(super) async fn renew_extends_the_lease(b: &Subject) {
    let k = key("long");
    let t = b.new_claim(k, None, 0).await;
    b.store
        .renew(k, t, at(0), dur(3 * LEASE))
        .await
        .expect("expected the renewal to apply");
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
