//! The claim table: new, in flight, completed within its window and at its edges, payload mismatches.

use super::fixtures::*;
use super::subject::*;
use crate::store::{Claim, Fenced, RecordState, RecordStatus, StoredResponse, Token};

// ---------------------------------------------------------------------------------------------
// The claim table
// ---------------------------------------------------------------------------------------------

pub(super) async fn no_row_is_new_then_in_flight(b: &Subject) {
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

pub(super) async fn in_flight_stays_in_flight_after_its_lease(b: &Subject) {
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

pub(super) async fn completed_replays_within_its_window(b: &Subject) {
    let k = key("a");
    let t = b.new_claim(k, None, 0).await;
    b.complete(k, t, S, r#"{"charge":1}"#)
        .await
        .expect("expected the completion to apply");
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
    b.complete_with(k2, t2, S, &declined)
        .await
        .expect("expected the completion to apply");
    assert_eq!(
        b.claim(k2, None, 2 * S).await,
        Claim::Completed {
            reference: k2.reference(1),
            response: declined,
            completed_at: at(S)
        }
    );
}

pub(super) async fn window_edges(b: &Subject) {
    // Completed at t with window w.
    let t = S;
    let k = key("edge");
    let token = b.new_claim(k, None, 0).await;
    b.complete(k, token, t, "first")
        .await
        .expect("expected the completion to apply");
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
    b.complete(k, token, t, "first")
        .await
        .expect("expected the completion to apply");
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

pub(super) async fn slow_completion_counts_the_window_from_completion(b: &Subject) {
    let k = key("slow");
    let t = b.new_claim(k, None, 0).await;
    b.complete(k, t, 20 * M, "slow")
        .await
        .expect("expected the completion to apply");
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

pub(super) async fn fingerprint_mismatch(b: &Subject) {
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
    b.complete(k, t, 2 * S, "shipped")
        .await
        .expect("expected the completion to apply");
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
    b.store
        .mark_unknown(k, t)
        .await
        .expect("expected marking it unknown to apply");
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
    b.store
        .release(k, t, at(S))
        .await
        .expect("expected the release to apply");
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

/// Each claim of a record has a later claim time than the claim before it: in the same
/// millisecond, with the clock stepped back, and after the window passed. A takeover of a call
/// whose worker is gone (`recover = "rerun"`) continues that claim and keeps its time. (An MCP
/// task id names one claim by its time.)
pub(super) async fn each_claim_of_a_record_has_a_later_claim_time(b: &Subject) {
    let k = key("claims");
    let claimed_at = |s: Option<RecordStatus>| s.expect("the record").claimed_at;
    let new = |c: Claim| match c {
        Claim::New { token, .. } => token,
        other => panic!("expected a new claim, got {other:?}"),
    };
    let t1 = b.new_claim(k, None, 10 * S).await;
    let first = claimed_at(b.status(TENANT, k.reference(1)).await);
    assert_eq!(first, at(10 * S));

    // Released, and claimed again in the same millisecond.
    b.store
        .release(k, t1, at(10 * S))
        .await
        .expect("expected the release to apply");
    let t2 = new(b.claim(k, None, 10 * S).await);
    let second = claimed_at(b.status(TENANT, k.reference(1)).await);
    assert!(second > first, "{second} after {first}");

    // Released, and claimed again by a clock 10 s behind.
    b.store
        .release(k, t2, at(10 * S))
        .await
        .expect("expected the release to apply");
    new(b.claim(k, None, 0).await);
    let third = claimed_at(b.status(TENANT, k.reference(1)).await);
    assert!(third > second, "{third} after {second}");

    // Its worker is gone: the takeover continues the claim, with its time.
    let t4 = Token(first_token(LEASE).0 + 7);
    b.store
        .take_over(k, t4, at(LEASE), dur(LEASE))
        .await
        .expect("expected the takeover to apply");
    assert_eq!(claimed_at(b.status(TENANT, k.reference(1)).await), third);

    // Completed; once its window has passed, the next claim (a new operation) is later too.
    b.complete(k, t4, LEASE, "done")
        .await
        .expect("expected the completion to apply");
    new(b.claim(k, None, LEASE + WINDOW).await);
    let fifth = claimed_at(b.status(TENANT, k.reference(2)).await);
    assert!(fifth > third, "{fifth} after {third}");
}
