//! Background reads: purge and the unsettled list.

use super::fixtures::*;
use super::subject::*;
use crate::store::{Claim, Fenced, RecordState, Unsettled};

// ---------------------------------------------------------------------------------------------
// Purge and reconciliation
// ---------------------------------------------------------------------------------------------

pub(super) async fn purge_deletes_only_settled_records_past_the_cutoff(b: &Subject) {
    let cutoff = 30 * M;
    let completed = |name: &'static str, window: i64| async move {
        let k = key(name);
        let t = b.new_claim_window(k, None, 0, window).await;
        b.complete(k, t, 0, name)
            .await
            .expect("expected the completion to apply");
        k
    };
    let gone = completed("expired", WINDOW).await;
    let live = completed("live", 60 * M).await;
    let edge = completed("edge", cutoff).await; // expires_at == cutoff: not before it
    let released = key("released");
    let t = b.new_claim(released, None, 0).await;
    b.store
        .release(released, t, at(S))
        .await
        .expect("expected the release to apply");
    let in_flight = key("in-flight");
    b.new_claim(in_flight, None, 0).await;
    let unknown = key("unknown");
    let t = b.new_claim(unknown, None, 0).await;
    b.store
        .mark_unknown(unknown, t)
        .await
        .expect("expected marking it unknown to apply");

    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 100)
            .await
            .expect("expected the purge to succeed"),
        2
    );
    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 100)
            .await
            .expect("expected the purge to succeed"),
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
            .expect("expected the purge to succeed"),
        3
    );
    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 3)
            .await
            .expect("expected the purge to succeed"),
        2
    );
    assert_eq!(
        b.store
            .purge(at(cutoff), at(cutoff), 3)
            .await
            .expect("expected the purge to succeed"),
        0
    );
}

pub(super) async fn unsettled_lists_expired_leases_and_unknowns(b: &Subject) {
    let (k1, k2, k3, k4, k5) = (key("k1"), key("k2"), key("k3"), key("k4"), key("k5"));
    b.new_claim(k1, None, 0).await;
    b.new_claim(k2, None, 10 * S).await;
    let t3 = b.new_claim(k3, None, 5 * S).await;
    b.store
        .mark_unknown(k3, t3)
        .await
        .expect("expected marking it unknown to apply");
    let t4 = b.new_claim(k4, None, S).await;
    b.complete(k4, t4, 2 * S, "done")
        .await
        .expect("expected the completion to apply");
    let t5 = b.new_claim(k5, None, 2 * S).await;
    b.store
        .release(k5, t5, at(3 * S))
        .await
        .expect("expected the release to apply");

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
