//! The engine's record life on MemoryStore: claim → run → record, window edges on a manual clock,
//! mismatch, dispositions, tenant isolation, cancellation, panics, timeouts and the outbox.
//! Each "no second side effect" is counted at the far side (the `Processor` stub).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::Clock;
use idempotency::store::{Fenced, OutboxStore, RecordStore};
use idempotency::{
    clock::{ManualClock, Timestamp},
    error::UnknownReason,
    key::Key,
    outcome::{ErrorPolicy, Outcome},
    store::{Claim, ClaimRequest, MemoryStore, RecordState},
    tool::{BusinessKey, Prepared, ToolSpec},
    Caller, Error, Idempotency,
};
use idempotency_tests::charge::{current_reference, ChargeError};
use serde::{Deserialize, Serialize};

const T0: i64 = 1_796_000_000_000;
const WINDOW: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge: usize,
    reference: String,
}

/// The far side: counts what it was asked to do.
#[derive(Default, Clone)]
struct Processor(Arc<AtomicUsize>);

impl Processor {
    fn charge(&self) -> Receipt {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Receipt {
            charge: n,
            reference: current_reference(),
        }
    }
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

struct World {
    engine: Idempotency,
    clock: ManualClock,
    store: Arc<MemoryStore>,
    processor: Processor,
    caller: Caller,
}

fn world() -> World {
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let store = Arc::new(MemoryStore::new());
    let engine = Idempotency::builder_shared(store.clone())
        .clock(clock.clone())
        .build();
    World {
        engine,
        clock,
        store,
        processor: Processor::default(),
        caller: Caller::new("acme", "alice"),
    }
}

async fn charge(w: &World, amount: u64) -> Outcome<Receipt, ChargeError> {
    let p = w.processor.clone();
    let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &amount).unwrap();
    w.engine
        .execute(prepared, ErrorPolicy::classified(), async move {
            Ok::<_, ChargeError>(p.charge())
        })
        .await
}

#[tokio::test]
async fn a_repeat_replays_the_stored_answer() {
    let w = world();
    let first = charge(&w, 100).await;
    let second = charge(&w, 100).await;
    assert_eq!(w.processor.count(), 1);
    assert!(!first.replayed && second.replayed);
    let (a, b) = (first.result.unwrap(), second.result.unwrap());
    assert_eq!(a, b);
    assert_eq!(
        a.reference,
        first.reference.unwrap().to_string(),
        "the body saw its own ref"
    );
    charge(&w, 101).await.result.unwrap();
    assert_eq!(
        w.processor.count(),
        2,
        "a different amount is a different call"
    );
}

#[tokio::test]
async fn window_is_exact_and_counts_from_completion() {
    let w = world();
    let first = charge(&w, 100).await;
    let r1 = first.reference.unwrap();
    w.clock.advance(WINDOW - Duration::from_secs(1));
    let at_edge = charge(&w, 100).await;
    assert!(at_edge.replayed, "window-1s replays");
    assert_eq!(w.processor.count(), 1);
    w.clock.advance(Duration::from_secs(2));
    let after = charge(&w, 100).await;
    assert!(!after.replayed, "window+1s is a new operation");
    assert_eq!(w.processor.count(), 2);
    let r2 = after.reference.unwrap();
    assert_ne!(r1, r2, "a new operation gets a new reference");
    assert_eq!(r2.generation(), r1.generation() + 1);
    // The old reference resolves to the key's current operation, under its own reference.
    let old = w
        .engine
        .status(&w.caller, r1)
        .await
        .unwrap()
        .expect("status");
    assert_eq!(old.reference, r2, "superseded by the new operation");
    assert!(w.engine.status(&w.caller, r2).await.unwrap().is_some());
}

#[tokio::test]
async fn a_slow_first_call_does_not_expire_before_it_finishes() {
    let w = world();
    let (p, clock) = (w.processor.clone(), w.clock.clone());
    let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &7u64).unwrap();
    let out: Outcome<Receipt, ChargeError> = w
        .engine
        .execute(prepared, ErrorPolicy::classified(), async move {
            clock.advance(Duration::from_secs(20 * 60)); // twenty minutes at the processor
            Ok(p.charge())
        })
        .await;
    out.result.unwrap();
    w.clock.advance(Duration::from_secs(10 * 60)); // 30 min after the claim, 10 after completion
    assert!(charge(&w, 7).await.replayed);
    assert_eq!(w.processor.count(), 1);
}

#[tokio::test]
async fn a_concurrent_repeat_is_told_in_flight_with_the_ref() {
    let w = Arc::new(world());
    let gate = Arc::new(tokio::sync::Notify::new());
    let (w2, g2) = (w.clone(), gate.clone());
    let first = tokio::spawn(async move {
        let p = w2.processor.clone();
        let prepared =
            Prepared::call(&w2.caller, &idempotency_tests::CHARGE_CARD, &100u64).unwrap();
        w2.engine
            .execute(
                prepared,
                ErrorPolicy::<ChargeError>::classified(),
                async move {
                    g2.notified().await;
                    Ok(p.charge())
                },
            )
            .await
    });
    while w.store.is_empty() {
        tokio::task::yield_now().await;
    }
    let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &100u64).unwrap();
    let second: Outcome<Receipt, idempotency::outcome::Failure<ChargeError>> = w
        .engine
        .execute_raw(prepared, ErrorPolicy::classified(), async {
            Ok(Receipt {
                charge: 999,
                reference: String::new(),
            })
        })
        .await;
    gate.notify_one();
    let first = first.await.unwrap();
    match second.result {
        Err(idempotency::outcome::Failure::Wrapper(e @ Error::InFlight { .. })) => {
            let msg = e.advice();
            assert!(msg.contains(&first.reference.unwrap().to_string()), "{msg}");
            assert!(msg.contains("Do not submit it again"), "{msg}");
        }
        other => panic!("expected in flight, got {other:?}"),
    }
    assert_eq!(w.processor.count(), 1);
}

#[tokio::test]
async fn business_key_with_other_arguments_is_a_mismatch() {
    #[derive(Serialize)]
    struct Ship<'a> {
        order_id: &'a str,
        address: &'a str,
    }
    let w = world();
    let run = |address: &'static str| {
        let p = w.processor.clone();
        let args = Ship {
            order_id: "o-1",
            address,
        };
        let prepared = Prepared::business(
            &w.caller,
            &ToolSpec::new("create_shipment", WINDOW),
            BusinessKey {
                field: "order_id",
                value: &args.order_id,
            },
            &args,
        )
        .unwrap();
        let engine = w.engine.clone();
        async move {
            engine
                .execute_raw(
                    prepared,
                    ErrorPolicy::<ChargeError>::classified(),
                    async move { Ok(p.charge()) },
                )
                .await
        }
    };
    let first = run("1 Main St").await;
    first.result.unwrap();
    let again = run("1 Main St").await;
    assert!(again.replayed);
    let other = run("9 Elm St").await;
    match other.result {
        Err(idempotency::outcome::Failure::Wrapper(Error::PayloadMismatch {
            reference, ..
        })) => {
            assert_eq!(Some(reference), first.reference)
        }
        r => panic!("expected mismatch, got {r:?}"),
    }
    assert_eq!(w.processor.count(), 1);
}

async fn failing(w: &World, err: fn() -> ChargeError) -> Outcome<Receipt, ChargeError> {
    let p = w.processor.clone();
    let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &5u64).unwrap();
    w.engine
        .execute(prepared, ErrorPolicy::classified(), async move {
            p.charge();
            Err(err())
        })
        .await
}

#[tokio::test]
async fn retryable_errors_release_the_claim_under_the_same_ref() {
    let w = world();
    let a = failing(&w, || ChargeError::Down).await;
    assert_eq!(a.result.unwrap_err(), ChargeError::Down);
    let b = failing(&w, || ChargeError::Down).await;
    assert_eq!(
        w.processor.count(),
        2,
        "a retryable error lets the repeat run"
    );
    assert_eq!(a.reference, b.reference, "same operation, same ref");
}

#[tokio::test]
async fn definitive_errors_are_replayed() {
    let w = world();
    assert_eq!(
        failing(&w, || ChargeError::Declined)
            .await
            .result
            .unwrap_err(),
        ChargeError::Declined
    );
    let b = failing(&w, || ChargeError::Down).await;
    assert!(b.replayed);
    assert_eq!(b.result.unwrap_err(), ChargeError::Declined);
    assert_eq!(w.processor.count(), 1);
}

#[tokio::test]
async fn unknown_errors_keep_the_claim_and_say_so() {
    let w = world();
    let a = failing(&w, || ChargeError::Timeout).await;
    match a.result.unwrap_err() {
        ChargeError::Wrapper(m) => assert!(
            m.contains("unknown") && m.contains("processor timed out"),
            "{m}"
        ),
        e => panic!("{e:?}"),
    }
    let b = failing(&w, || ChargeError::Declined).await;
    match b.result.unwrap_err() {
        ChargeError::Wrapper(m) => {
            assert!(m.contains("unknown") && m.contains("Do not retry"), "{m}")
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(w.processor.count(), 1);
    let st = w
        .engine
        .status(&w.caller, a.reference.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(st.state, RecordState::Unknown);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_is_an_unknown_outcome_and_the_repeat_does_not_run() {
    let w = world();
    let spec = ToolSpec::new("charge_card", WINDOW).with_timeout(Duration::from_secs(30));
    let run = || {
        let p = w.processor.clone();
        let prepared = Prepared::call(&w.caller, &spec, &1u64).unwrap();
        let engine = w.engine.clone();
        async move {
            engine
                .execute_raw(
                    prepared,
                    ErrorPolicy::<ChargeError>::classified(),
                    async move {
                        p.charge();
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        Ok(Receipt {
                            charge: 0,
                            reference: String::new(),
                        })
                    },
                )
                .await
        }
    };
    let first = run().await;
    match first.result {
        Err(idempotency::outcome::Failure::Wrapper(Error::OutcomeUnknown {
            reason: UnknownReason::TimedOut(d),
            ..
        })) => {
            assert_eq!(d, Duration::from_secs(30))
        }
        r => panic!("{r:?}"),
    }
    let second = run().await;
    assert!(matches!(
        second.result,
        Err(idempotency::outcome::Failure::Wrapper(
            Error::OutcomeUnknown { .. }
        ))
    ));
    assert_eq!(w.processor.count(), 1);
}

/// A panicking handler is answered, not re-raised: "outcome unknown (the handler failed)", with
/// its ref, and the record is unknown; the server keeps serving.
#[tokio::test]
async fn a_panic_after_start_is_answered_as_an_unknown_outcome() {
    let w = world();
    let p = w.processor.clone();
    let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &3u64).unwrap();
    let first = w
        .engine
        .execute_raw(
            prepared,
            ErrorPolicy::<ChargeError>::classified(),
            async move {
                p.charge();
                if p.count() > 0 {
                    panic!("bug after the side effect");
                }
                Ok(Receipt {
                    charge: 0,
                    reference: String::new(),
                })
            },
        )
        .await;
    match &first.result {
        Err(idempotency::outcome::Failure::Wrapper(
            e @ Error::OutcomeUnknown {
                reason: UnknownReason::Panicked(m),
                ..
            },
        )) => {
            assert_eq!(m, "bug after the side effect");
            assert!(e.advice().contains("Do not retry"), "{}", e.advice());
            assert_eq!(e.reference(), first.reference);
        }
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    let st = w
        .engine
        .status(&w.caller, first.reference.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(st.state, RecordState::Unknown);
    let again = charge(&w, 3).await;
    assert!(matches!(again.result, Err(ChargeError::Wrapper(ref m)) if m.contains("unknown")));
    assert_eq!(w.processor.count(), 1);
}

#[tokio::test]
async fn a_dropped_call_tells_the_truth() {
    // Dropped mid-body (rmcp cancels by dropping the future): outcome unknown.
    let w = world();
    let p = w.processor.clone();
    let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &9u64).unwrap();
    let fut = w.engine.execute(
        prepared.clone(),
        ErrorPolicy::<ChargeError>::classified(),
        async move {
            p.charge();
            std::future::pending::<()>().await;
            Ok(Receipt {
                charge: 0,
                reference: String::new(),
            })
        },
    );
    let _ = tokio::time::timeout(Duration::from_millis(20), fut).await;
    let key = prepared.key.key(&idempotency::key::Secret::demo());
    let r = key.reference(1);
    let state = settle_state(&w, r).await;
    assert_eq!(state, RecordState::Unknown);
    assert!(
        matches!(charge(&w, 9).await.result, Err(ChargeError::Wrapper(ref m)) if m.contains("unknown"))
    );
    assert_eq!(w.processor.count(), 1);
}

/// The record's state once the dropped call's background settlement (a task on this test's
/// single-threaded runtime, against the in-memory store) has run: yielding lets it run; no
/// wall-clock wait.
async fn settle_state(w: &World, r: idempotency::Reference) -> RecordState {
    for _ in 0..100 {
        let st = w.engine.status(&w.caller, r).await.unwrap().unwrap().state;
        if st != RecordState::InFlight {
            return st;
        }
        tokio::task::yield_now().await;
    }
    RecordState::InFlight
}

#[tokio::test]
async fn status_of_a_call_key_is_the_subjects_own() {
    // Call keys are subject-scoped by default: the key covers the subject, and so does the status.
    let w = world();
    let out = charge(&w, 100).await;
    let r = out.reference.unwrap();
    assert!(w.engine.status(&w.caller, r).await.unwrap().is_some());
    let same_tenant_other_user = Caller::new("acme", "bob");
    assert!(w
        .engine
        .status(&same_tenant_other_user, r)
        .await
        .unwrap()
        .is_none());
    let other_tenant = Caller::new("globex", "alice");
    assert!(w.engine.status(&other_tenant, r).await.unwrap().is_none());
}

#[tokio::test]
async fn follow_on_work_is_written_with_the_completion_and_not_twice() {
    let w = world();
    let go = || {
        let p = w.processor.clone();
        let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &42u64).unwrap();
        let engine = w.engine.clone();
        async move {
            engine
                .execute(
                    prepared,
                    ErrorPolicy::<ChargeError>::classified(),
                    async move {
                        let receipt = p.charge();
                        let call = idempotency::Call::current().expect("inside the body");
                        call.enqueue("receipt_email", &serde_json::json!({"to": "a@example.com"}))
                            .map_err(|e| ChargeError::Wrapper(e.to_string()))?;
                        Ok(receipt)
                    },
                )
                .await
        }
    };
    let first = go().await;
    go().await;
    let msgs = w
        .store
        .fetch(w.clock.now(), w.clock.now() + Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(Some(msgs[0].reference), first.reference);
    assert_eq!(msgs[0].topic, "receipt_email");
}

/// A message queued after the handler returned (from a task that outlived it) would miss the
/// completion's transaction: it is refused, never dropped silently.
#[tokio::test]
async fn enqueue_after_the_call_finished_is_refused() {
    let w = world();
    let kept: Arc<std::sync::Mutex<Option<idempotency::Call>>> = Arc::default();
    let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &43u64).unwrap();
    let (p, slot) = (w.processor.clone(), kept.clone());
    let out = w
        .engine
        .execute(
            prepared,
            ErrorPolicy::<ChargeError>::classified(),
            async move {
                *slot.lock().unwrap() = idempotency::Call::current();
                Ok(p.charge())
            },
        )
        .await;
    assert!(out.result.is_ok());
    let call = kept.lock().unwrap().take().expect("the body saw its call");
    let late = call.enqueue("receipt_email", &serde_json::json!({"to": "a@example.com"}));
    match late {
        Err(e @ idempotency::EnqueueError::Closed { .. }) => {
            assert!(e.to_string().contains(&call.reference().to_string()), "{e}")
        }
        other => panic!("expected Closed, got {other:?}"),
    }
    let msgs = w
        .store
        .fetch(w.clock.now(), w.clock.now() + Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert!(msgs.is_empty(), "nothing was written for the late message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_claims_make_one_new_claim() {
    let store = Arc::new(MemoryStore::new());
    let key = Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new("acme", "alice"),
        "charge_card",
        &100,
    )
    .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(1000));
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let now = Timestamp::from_millis(T0);
                let req = ClaimRequest {
                    key,
                    tenant: "acme",
                    subject: None,
                    tool: "charge_card",
                    fingerprint: None,
                    now,
                    lease: Duration::from_secs(30),
                    window: WINDOW,
                    token: idempotency::store::Token(now.as_millis()),
                };
                store.claim(&req).await.unwrap()
            })
        })
        .collect();
    let mut new = 0;
    for t in tasks {
        match t.await.unwrap() {
            Claim::New { .. } => new += 1,
            Claim::InFlight { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(new, 1);
}

/// A record of a different key holds this call's reference (the keys share their first 8 bytes):
/// the call is refused with `ReferenceTaken`, the processor is never asked, and the other record
/// is left as it was.
#[tokio::test]
async fn a_reference_held_by_another_key_refuses_the_call() {
    let w = world();
    let mine = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &100u64)
        .unwrap()
        .key
        .key(&idempotency::key::Secret::demo());
    let mut bytes = *mine.as_bytes();
    bytes[31] ^= 1;
    let other = Key::from_bytes(bytes);
    let now = w.clock.now();
    let held = w
        .store
        .claim(&ClaimRequest {
            key: other,
            tenant: "globex",
            subject: None,
            tool: "create_shipment",
            fingerprint: None,
            now,
            lease: Duration::from_secs(30),
            // A window that ends when it completes: the next claim starts generation 2.
            window: Duration::ZERO,
            token: idempotency::store::Token(now.as_millis()),
        })
        .await
        .unwrap();
    let Claim::New { token, .. } = held else {
        panic!("{held:?}")
    };
    // The holder moves on to its second operation (generation 2): a refusal must not say so.
    let answer = idempotency::store::StoredResponse {
        ok: true,
        body: "{}".into(),
    };
    w.store
        .complete(&idempotency::store::Completion {
            key: other,
            token,
            response: &answer,
            now,
            outbox: &[],
        })
        .await
        .unwrap();
    let later = now + Duration::from_millis(1);
    let again = w
        .store
        .claim(&ClaimRequest {
            key: other,
            tenant: "globex",
            subject: None,
            tool: "create_shipment",
            fingerprint: None,
            now: later,
            lease: Duration::from_secs(30),
            window: WINDOW,
            token: idempotency::store::Token(later.as_millis()),
        })
        .await
        .unwrap();
    assert!(
        matches!(again, Claim::New { reference, .. } if reference.generation() == 2),
        "{again:?}"
    );

    let p = w.processor.clone();
    let prepared = Prepared::call(&w.caller, &idempotency_tests::CHARGE_CARD, &100u64).unwrap();
    let out: Outcome<Receipt, idempotency::outcome::Failure<ChargeError>> = w
        .engine
        .execute_raw(prepared, ErrorPolicy::classified(), async move {
            Ok(p.charge())
        })
        .await;
    match out.result {
        Err(idempotency::outcome::Failure::Wrapper(e @ Error::ReferenceTaken { .. })) => {
            // This call's own reference, not the holder's (whose generation is 2).
            assert_eq!(e.reference(), Some(mine.reference(1)));
            assert!(!e.to_string().contains("-2") && !e.advice().contains("-2"));
            assert!(e.nothing_done() && !e.safe_to_retry());
            assert!(e.advice().contains("Nothing was done"), "{}", e.advice());
        }
        other => panic!("expected ReferenceTaken, got {other:?}"),
    }
    assert_eq!(out.reference, None, "the reference is not this call's");
    assert_eq!(w.processor.count(), 0, "the processor was never asked");
    assert_eq!(w.store.len(), 1);
    let status = w
        .engine
        .status(&Caller::new("globex", "bob"), other.reference(2))
        .await
        .unwrap()
        .expect("the holder's record");
    assert_eq!(status.state, RecordState::InFlight);
    assert_eq!(status.tool, "create_shipment");
}
