//! The drop guard of an attempt: if the caller's future is dropped before the record is settled
//! (client gone, a timeout around the call, shutdown), it settles the record in the background
//! with what is known at that point.

use std::sync::atomic::{AtomicBool, Ordering};

use super::core::Core;
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::StoredResponse;
use crate::store::OutboxMessage;
use crate::store::{Completion, Fenced, StoreError, Token};

/// What an attempt holds of its claim, and what to do with it if dropped now.
pub(super) struct Guard {
    /// The engine's store and clock (and lease).
    pub(super) core: Core,
    pub(super) key: Key,
    pub(super) reference: Reference,
    pub(super) token: Token,
    pub(super) tool: &'static str,
    /// Set at the body's first poll.
    pub(super) started: AtomicBool,
    pub(super) on_drop: OnDrop,
}

/// What a claim holds: the key, the reference it answers for, the attempt's token.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) key: Key,
    pub(super) reference: Reference,
    pub(super) token: Token,
}

impl Guard {
    /// A guard over what `engine` holds (or may hold) of `held`'s claim for `tool`: dropped
    /// before [`Guard::disarm`], it settles the claim in the background with what is known.
    pub(super) fn new(core: &Core, held: Held, tool: &'static str) -> Self {
        Guard {
            core: core.clone(),
            key: held.key,
            reference: held.reference,
            token: held.token,
            tool,
            started: AtomicBool::new(false),
            on_drop: OnDrop::Undecided,
        }
    }

    /// A guard over a claim made (a [`Landing`] answered it), under which nothing ran while the
    /// call goes on to answer another way: dropped before [`Guard::disarm`] (the call dropped
    /// meanwhile, or its release failed), it gives the claim back in the background, fenced by
    /// the attempt's own token, so it never touches anyone else's. Nothing ran, so released is
    /// the truth.
    pub(super) fn claiming(core: &Core, fence: Fence, tool: &'static str) -> Self {
        let Fence { key, token } = fence;
        let reference = key.reference(1);
        Guard::new(
            core,
            Held {
                key,
                reference,
                token,
            },
            tool,
        )
    }

    /// The claim is settled, or answered for: nothing to do when this guard goes.
    pub(super) fn disarm(mut self) {
        self.on_drop = OnDrop::Nothing;
    }
}

/// What the drop guard does if the attempt is dropped now.
pub(super) enum OnDrop {
    /// Release if the body never started, else mark the outcome unknown.
    Undecided,
    /// The body ended with a retryable error: nothing was done.
    Release,
    /// The body returned this answer; it was being recorded.
    Complete(Box<Answer>),
    /// The record is settled; nothing to do.
    Nothing,
}

/// A completion the attempt owns (the store's [`Completion`] borrows from it).
pub(super) struct Answer {
    pub(super) response: StoredResponse,
    pub(super) outbox: Vec<OutboxMessage>,
    pub(super) now: Timestamp,
}

impl Answer {
    pub(super) fn completion(&self, key: Key, token: Token) -> Completion<'_> {
        Completion {
            key,
            token,
            response: &self.response,
            now: self.now,
            outbox: &self.outbox,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let on_drop = std::mem::replace(&mut self.on_drop, OnDrop::Nothing);
        let on_drop = match on_drop {
            OnDrop::Nothing => return,
            OnDrop::Undecided if self.started.load(Ordering::Relaxed) => OnDrop::Undecided,
            OnDrop::Undecided => OnDrop::Release,
            other => other,
        };
        let (store, key, token, reference, tool) = (
            self.core.store.clone(),
            self.key,
            self.token,
            self.reference,
            self.tool,
        );
        let what = match &on_drop {
            OnDrop::Release => "release",
            OnDrop::Complete(_) => "complete",
            _ => "mark unknown",
        };
        tracing::warn!(tool, %reference, settle = what, "idempotency call dropped before it was recorded; settling it in the background");
        let answer = match on_drop {
            // Nothing ran under it: given back, with the retries a lost claim needs.
            OnDrop::Release => {
                let release = release(self.core.clone(), Fence { key, token }, tool);
                in_background(release, tool, reference);
                return;
            }
            OnDrop::Complete(answer) => Some(answer),
            _ => None,
        };
        let settle = async move {
            let r = match answer {
                Some(answer) => match store.complete(&answer.completion(key, token)).await {
                    Err(
                        e @ (StoreError::Fenced { .. }
                        | StoreError::WrongState { .. }
                        | StoreError::NotFound),
                    ) => Err(e),
                    Err(e) => {
                        tracing::error!(tool, %reference, error = %e, "idempotency could not complete a dropped call; marking it unknown");
                        store.mark_unknown(key, token).await
                    }
                    ok => ok,
                },
                None => store.mark_unknown(key, token).await,
            };
            if let Err(e) = r {
                tracing::error!(tool, %reference, error = %e, "idempotency could not settle a dropped call; the reconciler will see its lease expire");
            }
        };
        in_background(settle, tool, reference);
    }
}

/// A store call that may make a claim (a claim, a takeover), owned so that it can finish
/// without its caller. If the caller stops waiting (its future dropped, its deadline passed),
/// the call goes on in the background and a claim it made is given back once it lands, fenced
/// by the attempt's token, however late that is: a database finishes a statement its client
/// stopped waiting for, and a busy SQLite file or a loaded server can take seconds to. A call
/// answered with an error may still have landed (its reply lost): given back too, with the
/// retries such a claim needs. Nothing ran under either.
pub(super) struct Landing<T: Made> {
    state: LandingState<T>,
    core: Core,
    fence: Fence,
    tool: &'static str,
}

/// A claim's key and the attempt's token that fences every write to it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fence {
    pub(super) key: Key,
    pub(super) token: Token,
}

enum LandingState<T> {
    /// On its way to the store.
    Flying(crate::store::BoxFuture<'static, Result<T, StoreError>>),
    /// Answered with a claim: the caller's from here on.
    Answered,
    /// Answered with an error: it may have landed, so it is given back when this goes.
    Failed,
}

/// A store call's answer that may be a claim the attempt made.
pub(super) trait Made: Send + 'static {
    /// Whether this answer is a claim made with `token`.
    fn made(&self, token: Token) -> bool;
}

impl Made for crate::store::Claim {
    fn made(&self, token: Token) -> bool {
        matches!(self, crate::store::Claim::New { token: t, .. } if *t == token)
    }
}

impl Made for Reference {
    /// A takeover's answer is the taken-over record's reference: made.
    fn made(&self, _: Token) -> bool {
        true
    }
}

/// How long a claim whose caller left may take to land before the background stops waiting
/// for it and looks for it instead (a store that never answers).
const LANDING_BOUND: std::time::Duration = std::time::Duration::from_secs(120);

impl<T: Made> Landing<T> {
    /// `call`, made under `fence` by a call of `tool` on `core`'s store.
    pub(super) fn new(
        core: &Core,
        fence: Fence,
        tool: &'static str,
        call: crate::store::BoxFuture<'static, Result<T, StoreError>>,
    ) -> Self {
        Landing {
            state: LandingState::Flying(call),
            core: core.clone(),
            fence,
            tool,
        }
    }

    /// The call's answer. Dropped before it comes, the call finishes in the background.
    pub(super) async fn answer(&mut self) -> Result<T, StoreError> {
        let LandingState::Flying(call) = &mut self.state else {
            return Err(StoreError::Unavailable(
                "the store call was already answered".into(),
            ));
        };
        let r = call.await;
        self.state = match r {
            Ok(_) => LandingState::Answered,
            Err(_) => LandingState::Failed,
        };
        r
    }
}

impl<T: Made> Drop for Landing<T> {
    fn drop(&mut self) {
        let call = match std::mem::replace(&mut self.state, LandingState::Answered) {
            LandingState::Answered => return,
            LandingState::Failed => None,
            LandingState::Flying(call) => Some(call),
        };
        let (fence, tool) = (self.fence, self.tool);
        let (key, token) = (fence.key, fence.token);
        let core = self.core.clone();
        let land = async move {
            if let Some(call) = call {
                match tokio::time::timeout(LANDING_BOUND, call).await {
                    Ok(Ok(answer)) if !answer.made(token) => return,
                    Ok(_) => {}
                    Err(_) => {
                        tracing::warn!(tool, reference = %key.reference(1), "idempotency: a claim whose caller left has had no answer for 2 minutes; looking for it instead");
                    }
                }
            }
            release(core, fence, tool).await;
        };
        in_background(land, tool, key.reference(1));
    }
}

/// How often a lost claim's release is tried, and the first pause between tries (doubling): the
/// last try comes about 6 s after the first.
const RELEASE_TRIES: u32 = 9;
const RELEASE_PAUSE: std::time::Duration = std::time::Duration::from_millis(25);

/// Gives back a claim nothing ran under, fenced by its token: tried [`RELEASE_TRIES`] times,
/// "no such record" included (a dropped claim may still land).
async fn release(core: Core, fence: Fence, tool: &'static str) {
    let Fence { key, token } = fence;
    for attempt in 0..RELEASE_TRIES {
        match core.store.release(key, token, core.clock.now()).await {
            Ok(()) => {
                tracing::info!(tool, reference = %key.reference(1), "idempotency released a claim nothing ran under (its answer was lost, or the call was answered another way)");
                return;
            }
            // Not ours (another attempt's token, or settled): nothing to give back.
            Err(StoreError::Fenced { .. } | StoreError::WrongState { .. }) => return,
            // Not there yet, or never made: a dropped claim may still land.
            Err(StoreError::NotFound) if attempt + 1 == RELEASE_TRIES => {
                tracing::debug!(tool, reference = %key.reference(1), "idempotency: a claim whose answer was lost was never made");
                return;
            }
            Err(StoreError::NotFound) => {
                tokio::time::sleep(RELEASE_PAUSE * 2u32.pow(attempt)).await;
            }
            Err(e) => {
                tracing::warn!(tool, error = %e, attempt, "idempotency could not release a claim nothing ran under; retrying");
                tokio::time::sleep(RELEASE_PAUSE * 2u32.pow(attempt)).await;
            }
        }
    }
    tracing::error!(tool, "idempotency gave up releasing a claim whose answer was lost; its lease will pass and lease expiry will settle it");
}

/// Runs a drop guard's settlement on the current runtime; outside one it cannot run, and the
/// record is left to lease expiry (said in the log).
fn in_background(
    settle: impl std::future::Future<Output = ()> + Send + 'static,
    tool: &str,
    reference: Reference,
) {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn(settle);
        }
        Err(_) => tracing::error!(
            tool,
            %reference,
            "idempotency call dropped outside a Tokio runtime; its record is left to lease expiry"
        ),
    }
}

/// `fut`, abandoned at `by` with an "unavailable: no answer in time" error.
pub(super) async fn bounded<T, F>(by: Option<tokio::time::Instant>, fut: F) -> Result<T, StoreError>
where
    F: std::future::Future<Output = Result<T, StoreError>>,
{
    match by {
        None => fut.await,
        Some(by) => match tokio::time::timeout_at(by, fut).await {
            Ok(r) => r,
            Err(elapsed) => Err(StoreError::Unavailable(Box::new(elapsed))),
        },
    }
}

/// Whether `e` is [`bounded`]'s "no answer in time".
pub(super) fn is_elapsed(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(source) if source.is::<tokio::time::error::Elapsed>())
}
