//! The outbox, written with the completion.

use super::fixtures::*;
use super::subject::*;
use crate::store::{Completion, Fenced, Receipt, StoreError};

// ---------------------------------------------------------------------------------------------
// Outbox
// ---------------------------------------------------------------------------------------------

pub(super) async fn outbox_is_written_with_the_completion(b: &Subject) {
    let redeliver = dur(60 * S);
    let fetch = |now: i64, limit: u32| async move {
        b.store
            .fetch(at(now), at(now) + redeliver, limit)
            .await
            .expect("expected the outbox fetch to succeed")
    };
    let k = key("with-receipt");
    let t = b.new_claim(k, None, 0).await;
    let msgs = [
        message("receipt_email", r#"{"to":"alice@example.com"}"#),
        message("ledger", "{}"),
    ];
    b.store
        .complete(&Completion {
            key: k,
            token: t,
            response: &answer("charged"),
            now: at(S),
            outbox: &msgs,
        })
        .await
        .expect("expected the completion to apply");

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
    b.store
        .ack(&first[0].receipt)
        .await
        .expect("expected the ack to succeed");
    let rest = fetch(S + 120 * S, 10).await;
    assert_eq!(
        rest.iter()
            .map(|e| (e.receipt.clone(), e.attempts))
            .collect::<Vec<_>>(),
        vec![(first[1].receipt.clone(), 2)]
    );
    b.store
        .ack(&first[1].receipt)
        .await
        .expect("expected the ack to succeed");
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
    b.complete(k2, t2, S, "plain")
        .await
        .expect("expected the completion to apply");
    let k3 = key("fenced-receipt");
    let t3 = b.new_claim(k3, None, 0).await;
    b.store
        .release(k3, t3, at(S))
        .await
        .expect("expected the release to apply");
    b.new_claim(k3, None, 2 * S).await;
    assert_fenced(
        b.store
            .complete(&Completion {
                key: k3,
                token: t3,
                response: &answer("late"),
                now: at(3 * S),
                outbox: &msgs,
            })
            .await,
        k3.reference(1),
    );
    assert!(fetch(20 * M, 10).await.is_empty());

    // Oldest first, bounded by the limit.
    let k4 = key("three");
    let t4 = b.new_claim(k4, None, 0).await;
    let three = [message("a", "1"), message("b", "2"), message("c", "3")];
    b.store
        .complete(&Completion {
            key: k4,
            token: t4,
            response: &answer("ok"),
            now: at(30 * M),
            outbox: &three,
        })
        .await
        .expect("expected the completion to apply");
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
