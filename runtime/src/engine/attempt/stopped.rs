//! What an attempt answers when it cannot answer with its own result: its lease passed before
//! the body finished, or someone else settled its record first. Never a fresh answer that the
//! record contradicts: the answer that stands, "in progress" for a call someone else now runs,
//! or "outcome unknown".

use std::sync::atomic::Ordering;

use serde::de::DeserializeOwned;

use super::{Attempt, Hold, SETTLE_GRACE};
use crate::engine::guard::{bounded, OnDrop};
use crate::error::{Error, UnknownReason};
use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::record::Standing;
use crate::store::{Fenced, StoreError};

/// How long a stopped attempt spends on the store before it answers: its settling is bounded
/// like any other, at most [`SETTLE_GRACE`] (the drop guard goes on in the background).
fn soon(settle_by: Option<tokio::time::Instant>) -> Option<tokio::time::Instant> {
    let grace = tokio::time::Instant::now() + SETTLE_GRACE;
    Some(settle_by.map_or(grace, |by| by.min(grace)))
}

impl Attempt {
    /// The worker's lease passed before the body finished, and the body was stopped. Nothing ran:
    /// the claim is given back and the caller may try again. Otherwise the record is marked
    /// unknown (the body may have acted); if someone settled it first, its truth is the answer.
    pub(super) async fn lease_ended<T, E>(
        mut self,
        policy: &ErrorPolicy<E>,
        settle_by: Option<tokio::time::Instant>,
    ) -> Outcome<T, Failure<E>>
    where
        T: DeserializeOwned,
    {
        let (tool, reference) = (self.tool(), self.guard.reference);
        let by = soon(settle_by);
        if !self.guard.started.load(Ordering::Relaxed) {
            tracing::warn!(tool, %reference, "idempotency: the claim's lease passed before the handler started (the store did not answer its renewals, or this process was paused); given back, nothing ran");
            let source = match self.release(by).await {
                Ok(()) => StoreError::Unavailable(
                    "the claim's lease could not be kept, so it was given back before the handler started"
                        .into(),
                ),
                Err(e) => e,
            };
            return Outcome {
                result: Err(Failure::Wrapper(Error::Store {
                    tool: tool.into(),
                    source,
                })),
                replayed: false,
                reference: Some(reference),
            };
        }
        tracing::error!(tool, %reference, "idempotency: the claim's lease passed without a renewal the store accepted (the store unreachable, or this process paused); the handler was stopped: outcome unknown");
        let marked = bounded(
            by,
            self.guard
                .core
                .store
                .mark_unknown(self.guard.key, self.guard.token),
        )
        .await;
        match marked {
            Ok(()) => self.guard.on_drop = OnDrop::Nothing,
            Err(
                e @ (StoreError::Fenced { .. }
                | StoreError::WrongState { .. }
                | StoreError::NotFound),
            ) => {
                self.guard.on_drop = OnDrop::Nothing;
                return self.settled_elsewhere(e, policy, settle_by).await;
            }
            // Not answered in time: the drop guard marks it in the background.
            Err(e) => {
                tracing::warn!(tool, %reference, error = %e, "idempotency: could not mark a stopped call unknown yet; retrying in the background");
            }
        }
        Outcome {
            result: Err(self.unknown(UnknownReason::LeaseExpired, None)),
            replayed: false,
            reference: Some(reference),
        }
    }

    /// The record was settled (or taken over) by someone else, `e` says how: the answer is the
    /// record's truth as the caller would read it now. Its stored answer if it completed; "in
    /// progress" if another attempt runs it now; otherwise "outcome unknown".
    pub(super) async fn settled_elsewhere<T, E>(
        &self,
        e: StoreError,
        policy: &ErrorPolicy<E>,
        settle_by: Option<tokio::time::Instant>,
    ) -> Outcome<T, Failure<E>>
    where
        T: DeserializeOwned,
    {
        let (tool, reference) = (self.tool(), self.guard.reference);
        let found = match &self.caller {
            Some(c) => {
                let read = self
                    .guard
                    .core
                    .store
                    .status(&c.tenant, &c.subject, reference);
                bounded(soon(settle_by), read).await
            }
            None => Ok(None),
        };
        match found {
            // Judged as a repeat and the status tool judge it: on the store's clock.
            Ok(Some(s)) if s.reference == reference => match s.standing(reference, self.now()) {
                Standing::Completed | Standing::Failed | Standing::Expired => {
                    if let Some(response) = &s.response {
                        tracing::info!(tool, %reference, "idempotency: answering with the record's settled answer, not this attempt's");
                        return crate::engine::replay(tool, reference, response, policy);
                    }
                }
                Standing::InFlight => {
                    return Outcome {
                        result: Err(Failure::Wrapper(Error::InFlight {
                            tool: tool.into(),
                            reference,
                            since: s.claimed_at,
                        })),
                        replayed: false,
                        reference: Some(reference),
                    };
                }
                // Its lease passed unrenewed, unknown, released: the outcome is not known.
                _ => {}
            },
            Ok(_) => {}
            Err(read) => {
                tracing::warn!(tool, %reference, error = %read, "idempotency: could not read the record settled elsewhere");
            }
        }
        Outcome {
            result: Err(self.unknown(UnknownReason::LeaseLost, Some(e))),
            replayed: false,
            reference: Some(reference),
        }
    }
}
