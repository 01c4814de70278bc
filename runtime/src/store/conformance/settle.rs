//! Settlements: completed, released, unknown.

use super::fixtures::*;
use super::subject::*;
use crate::store::{Claim, Fenced, RecordState, Settlement};

pub(super) async fn settle_completed_answers_repeats_for_the_window(b: &Subject) {
    let k = key("found");
    let t = b.new_claim(k, None, 0).await;
    b.settle(k, t, &Settlement::Completed(answer("found")), M)
        .await
        .expect("expected the settlement to apply");
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

pub(super) async fn settle_released_lets_a_repeat_run_under_the_same_reference(b: &Subject) {
    let k = key("not-charged");
    let t = b.new_claim(k, None, 0).await;
    b.store
        .mark_unknown(k, t)
        .await
        .expect("expected marking it unknown to apply");
    b.settle(k, t, &Settlement::Released, M)
        .await
        .expect("expected the settlement to apply");
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

/// A round that cannot tell (no `Reconcile`, or it said unknown) marks the claim unknown and
/// keeps its token: the worker, paused or cut off past its lease, may still report, and its
/// answer is the truth the round lacked. Its release (a retryable error: nothing was done) lands
/// too.
pub(super) async fn settle_unknown_keeps_it_unknown_until_its_worker_reports(b: &Subject) {
    let k = key("unclear");
    let t = b.new_claim(k, None, 0).await;
    b.settle(k, t, &Settlement::Unknown, LEASE)
        .await
        .expect("expected the settlement to apply");
    assert_eq!(
        b.claim(k, None, LEASE + S).await,
        Claim::Unknown {
            reference: k.reference(1),
            since: at(0)
        }
    );
    let due = b.unsettled(LEASE + S, 10).await;
    assert_eq!(
        due.iter().map(|u| (u.state, u.token)).collect::<Vec<_>>(),
        vec![(RecordState::Unknown, t)],
        "the token is kept"
    );
    b.complete(k, t, LEASE + 2 * S, "late")
        .await
        .expect("the worker's late answer lands");
    assert_eq!(
        b.claim(k, None, LEASE + 3 * S).await,
        Claim::Completed {
            reference: k.reference(1),
            response: answer("late"),
            completed_at: at(LEASE + 2 * S)
        }
    );
    assert!(b.unsettled(LEASE + 3 * S, 10).await.is_empty());

    let r = key("unclear-then-retryable");
    let tr = b.new_claim(r, None, 0).await;
    b.settle(r, tr, &Settlement::Unknown, LEASE)
        .await
        .expect("expected the settlement to apply");
    b.store
        .release(r, tr, at(LEASE + S))
        .await
        .expect("the worker's release lands");
    assert_eq!(
        b.status(TENANT, r.reference(1)).await.map(|s| s.state),
        Some(RecordState::Released)
    );
}

/// A settlement that knows (completed, released) bumps the token: the worker's late answer after
/// it is fenced, and the settled answer stands.
pub(super) async fn a_settlement_after_unknown_fences_the_worker(b: &Subject) {
    let k = key("unclear-found");
    let t = b.new_claim(k, None, 0).await;
    b.settle(k, t, &Settlement::Unknown, LEASE)
        .await
        .expect("expected the unknown settlement to apply");
    b.settle(k, t, &Settlement::Completed(answer("found")), LEASE + S)
        .await
        .expect("expected the completed settlement to apply");
    assert_fenced(
        b.complete(k, t, LEASE + 2 * S, "late").await,
        k.reference(1),
    );
    assert!(
        matches!(b.claim(k, None, LEASE + 3 * S).await, Claim::Completed { response, .. } if response == answer("found"))
    );
}
