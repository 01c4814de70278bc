//! The answers a call gets without running its body: what a record the claim found means at
//! the time the claim read it (replayed, in flight, outcome unknown, a mismatch), and the
//! wrapper's answers when no claim was made.

use serde::de::DeserializeOwned;

use crate::clock::Timestamp;
use crate::error::{Error, UnknownReason};
use crate::key::Reference;
use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::record::{RecordState, Standing};
use crate::store::{Claim, StoreError};

/// The answer from a record the claim found (not a new claim), read at `now`: the stored
/// answer replayed, or the wrapper's answer naming the record's reference.
pub(super) fn answer_found<T, E>(
    tool: &'static str,
    claim: Claim,
    now: Timestamp,
    policy: &ErrorPolicy<E>,
) -> Outcome<T, Failure<E>>
where
    T: DeserializeOwned,
{
    let gone = gone(&claim, now);
    match claim {
        Claim::New { .. } => unreachable!("a new claim is run, not answered"),
        Claim::Completed {
            reference,
            response,
            ..
        } => {
            tracing::debug!(tool, %reference, ok = response.ok, "idempotency replay");
            replay(tool, reference, &response, policy)
        }
        Claim::InFlight {
            reference,
            claimed_at,
            lease_expires_at,
        } => match gone {
            // Nobody has renewed the claim since its lease ended: its worker is gone or
            // could not record its outcome. Not "in progress" as if someone were working.
            Some(_) => {
                tracing::info!(tool, %reference, %lease_expires_at, "idempotency in flight with its lease passed: outcome unknown");
                answered(Error::OutcomeUnknown {
                    tool: tool.into(),
                    reference,
                    reason: UnknownReason::Unreported {
                        lease_ended: lease_expires_at,
                    },
                    source: None,
                })
            }
            None => {
                tracing::info!(tool, %reference, "idempotency in flight");
                answered(Error::InFlight {
                    tool: tool.into(),
                    reference,
                    since: claimed_at,
                })
            }
        },
        Claim::Unknown { reference, .. } => {
            tracing::info!(tool, %reference, "idempotency outcome unknown (repeat)");
            answered(Error::OutcomeUnknown {
                tool: tool.into(),
                reference,
                reason: UnknownReason::Earlier,
                source: None,
            })
        }
        Claim::Mismatch { reference } => {
            tracing::info!(tool, %reference, "idempotency payload mismatch");
            answered(Error::PayloadMismatch {
                tool: tool.into(),
                reference,
            })
        }
    }
}

/// The record the store answered with instead of a claim, and the engine's time then.
pub(super) struct Found {
    pub(super) claim: Claim,
    pub(super) now: Timestamp,
}

/// A stored answer, replayed: the handler's value or its definitive error, decoded as the
/// call's door reads it (an answer the other door recorded is translated; see `door.rs`).
pub(super) fn replay<T, E>(
    tool: &'static str,
    reference: Reference,
    response: &crate::record::StoredResponse,
    policy: &ErrorPolicy<E>,
) -> Outcome<T, Failure<E>>
where
    T: DeserializeOwned,
{
    let unreadable = |message: String| {
        Failure::Wrapper(Error::Replay {
            tool: tool.into(),
            reference,
            message,
        })
    };
    // As this call's door reads the record, whichever door wrote it (`door.rs`).
    let result = match policy.door.read(response) {
        Err(message) => Err(unreadable(message)),
        Ok(read) if !read.error => serde_json::from_str::<T>(&read.json)
            .map_err(|e| unreadable(read.unreadable(&e.to_string()))),
        Ok(read) => match (policy.decode)(&read.json) {
            Ok(e) => Err(Failure::Handler(e)),
            Err(message) => Err(unreadable(read.unreadable(&message))),
        },
    };
    Outcome {
        result,
        replayed: true,
        reference: Some(reference),
    }
}

/// The wrapper's answer about an existing record (it names the record's reference).
pub(super) fn answered<T, E>(e: Error) -> Outcome<T, Failure<E>> {
    let reference = e.reference();
    Outcome {
        result: Err(Failure::Wrapper(e)),
        replayed: false,
        reference,
    }
}

/// The wrapper's answer when no claim was made.
pub(super) fn refused<T, E>(e: Error) -> Outcome<T, Failure<E>> {
    Outcome {
        result: Err(Failure::Wrapper(e)),
        replayed: false,
        reference: None,
    }
}

/// The answer to a claim the store failed (nothing ran).
pub(super) fn claim_failed<T, E>(
    tool: &'static str,
    key: crate::key::Key,
    error: StoreError,
) -> Outcome<T, Failure<E>> {
    match error {
        StoreError::ReferenceTaken { reference } => {
            tracing::error!(tool, %reference, "idempotency claim refused: the reference is held by a different key; nothing was run");
            // This call's own reference: nothing about the holder (not its generation).
            refused(Error::ReferenceTaken {
                tool: tool.into(),
                reference: key.reference(1),
            })
        }
        source @ StoreError::Corrupt { .. } => {
            // Every repeat finds the same record: not a passing failure. Named by the key's
            // first generation, which finds the record whatever its generation reads as.
            let reference = key.reference(1);
            tracing::error!(tool, %reference, error = %source, "idempotency claim found a record it cannot read; nothing was run");
            answered(Error::Unreadable {
                tool: tool.into(),
                reference,
                source,
            })
        }
        source => {
            tracing::warn!(tool, error = %source, "idempotency claim failed; nothing was run");
            refused(Error::Store {
                tool: tool.into(),
                source,
            })
        }
    }
}

/// A call whose worker is gone: its reference, and when it started.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gone {
    pub(super) reference: Reference,
    /// When its call started.
    pub(super) since: Timestamp,
}

/// The call a claim found whose worker is gone, with when it started: in flight with its lease
/// passed unrenewed ([`Standing::LeasePassed`]), or unknown. `None` for any other answer.
pub(super) fn gone(claim: &Claim, now: Timestamp) -> Option<Gone> {
    match *claim {
        Claim::InFlight {
            reference,
            claimed_at,
            lease_expires_at,
        } if Standing::of(RecordState::InFlight, None, now >= lease_expires_at, false)
            == Standing::LeasePassed =>
        {
            Some(Gone {
                reference,
                since: claimed_at,
            })
        }
        Claim::Unknown { reference, since } => Some(Gone { reference, since }),
        _ => None,
    }
}
