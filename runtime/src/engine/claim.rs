//! The claim steps of a call: claiming its key (and, while secrets are rotated, recognising a
//! record under a previous secret's key), taking over a call whose worker is gone
//! (`recover = "rerun"`), and the fencing token of each attempt.

use crate::error::Error;
use crate::key::Scope;
use crate::outcome::{Failure, Outcome};
use crate::store::{Claim, ClaimRequest, Fenced, StoreError, Token};

use super::answer::{answered, claim_failed, refused, Gone};
use super::attempt::Claimed;
use super::guard::{bounded, Fence, Guard, Held, Landing};
use super::keyed::{Claiming, Keyed};
use super::{noise, Idempotency};

impl Idempotency {
    /// Claims the call's key under the current secret and, while secrets are rotated, its keys
    /// under the previous ones too, in the order every replica claims them
    /// ([`claim_in_order`](Idempotency::claim_in_order)); an error is the caller's answer
    /// (nothing ran).
    pub(super) async fn claim_any<T, E>(
        &self,
        keyed: &Keyed,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Claim, Outcome<T, Failure<E>>> {
        if self.previous.is_empty() {
            self.claim(keyed, keyed.current, now, by).await
        } else {
            self.claim_in_order(keyed, now, by).await
        }
    }

    /// Claims `claiming` (the call's key under one secret); an error is the caller's answer
    /// (nothing ran).
    pub(super) async fn claim<T, E>(
        &self,
        keyed: &Keyed,
        claiming: Claiming,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Claim, Outcome<T, Failure<E>>> {
        let tool = keyed.tool();
        let req = self.request(keyed, claiming, now);
        let key = req.key;
        self.check_secret(tool, by).await?;
        let mut landing = self.claim_landing(&req, tool);
        let claim = bounded(by, landing.answer()).await;
        // Answered: the caller's. Otherwise given back (in the background, once it lands).
        drop(landing);
        claim.map_err(|e| claim_failed(tool, key, e))
    }

    /// The claim `req` asks for, owned so that it can land without its caller.
    fn claim_landing(&self, req: &ClaimRequest<'_>, tool: &'static str) -> Landing<Claim> {
        let store = self.core.store.clone();
        let (tenant, subject) = (req.tenant.to_owned(), req.subject.map(str::to_owned));
        let ClaimRequest {
            key,
            fingerprint,
            now,
            lease,
            window,
            token,
            ..
        } = *req;
        let call = Box::pin(async move {
            let req = ClaimRequest {
                key,
                tenant: &tenant,
                subject: subject.as_deref(),
                tool,
                fingerprint,
                now,
                lease,
                window,
                token,
            };
            store.claim(&req).await
        });
        Landing::new(&self.core, Fence { key, token }, tool, call)
    }

    /// `recover = "rerun"`: takes over the call whose worker is gone (`takeover.gone`; under the
    /// call's key, or while secrets are rotated the previous secret's key holding it), to run the
    /// body again under its reference (same generation). One runner: a takeover that loses
    /// (another repeat or replica took it over first, or the record settled meanwhile) answers
    /// "in progress", unless the repeat may wait until a time still to come (`takeover.until`):
    /// then it is [`TakeOver::Lost`], to claim again and wait for the rerun's answer. A takeover
    /// whose reply is lost (or whose caller goes away meanwhile) is given back in the
    /// background, fenced by its own token, as a lost claim is: nothing ran under it, and the
    /// next repeat runs it at once.
    pub(super) async fn take_over<T, E>(
        &self,
        keyed: &Keyed,
        takeover: Takeover,
    ) -> TakeOver<T, E> {
        let Takeover {
            gone: Gone { reference, since },
            now,
            by,
            until,
        } = takeover;
        let tool = keyed.tool();
        let key = self.key_holding(keyed, reference).unwrap_or(keyed.key());
        let token = attempt_token(now);
        let store = self.core.store.clone();
        let lease = self.core.lease;
        let sent = tokio::time::Instant::now();
        let mut landing = Landing::new(
            &self.core,
            Fence { key, token },
            tool,
            Box::pin(async move { store.take_over(key, token, now, lease).await }),
        );
        let taken = bounded(by, landing.answer()).await;
        // Taken: the caller's. Otherwise given back (in the background, once it lands).
        drop(landing);
        match taken {
            Ok(reference) => {
                tracing::warn!(tool, %reference, "idempotency: running a call whose worker is gone again under its reference (recover = \"rerun\")");
                crate::metrics::rerun(tool);
                let held = Held {
                    key,
                    reference,
                    token,
                };
                TakeOver::Taken(Taken {
                    held,
                    claimed: Claimed { at: now, sent },
                    rerun: true,
                })
            }
            Err(StoreError::WrongState { .. } | StoreError::NotFound) => {
                tracing::info!(tool, %reference, "idempotency: another repeat took over the call first (or it settled)");
                match until {
                    Some(u) if tokio::time::Instant::now() < u => {
                        // Then claims again (finding the rerun in progress, or its answer).
                        super::wait::pace(&mut 0, until).await;
                        TakeOver::Lost
                    }
                    _ => TakeOver::Answered(answered(Error::InFlight {
                        tool: tool.into(),
                        reference,
                        since,
                    })),
                }
            }
            Err(source) => {
                tracing::warn!(tool, %reference, error = %source, "idempotency: could not take over a call whose worker is gone; nothing was run");
                TakeOver::Answered(refused(Error::Store {
                    tool: tool.into(),
                    source,
                }))
            }
        }
    }

    /// Checks once that the store's records are keyed with this engine's secret; an error is
    /// the caller's answer (nothing ran).
    pub(super) async fn check_secret<T, E>(
        &self,
        tool: &'static str,
        by: Option<tokio::time::Instant>,
    ) -> Result<(), Outcome<T, Failure<E>>> {
        if !self.secret_check.passed()
            && let Err(source) = bounded(by, self.secret_check.ensure(&*self.core.store)).await
        {
            tracing::error!(tool, error = %source, "idempotency: the store's secret check failed; nothing was run");
            return Err(refused(Error::Store {
                tool: tool.into(),
                source,
            }));
        }
        Ok(())
    }

    /// What a claim of `claiming` (the call's key under one secret) asks the store for, with a
    /// new token.
    pub(super) fn request<'p>(
        &self,
        keyed: &'p Keyed,
        claiming: Claiming,
        now: crate::clock::Timestamp,
    ) -> ClaimRequest<'p> {
        let prepared = &keyed.prepared;
        let (spec, caller) = (&prepared.spec, &prepared.caller);
        ClaimRequest {
            key: claiming.key,
            tenant: &caller.tenant,
            subject: match prepared.scope {
                Scope::Subject => Some(&caller.subject),
                Scope::Tenant => None,
            },
            tool: spec.name,
            fingerprint: claiming.fingerprint,
            now,
            lease: self.core.lease,
            window: spec.window,
            token: attempt_token(now),
        }
    }

    /// While secrets are rotated: the live record of this call under a previous secret's key,
    /// if there is one. A probe that finds none made a claim there, which it gives back at once.
    pub(super) async fn recognise<T, E>(
        &self,
        keyed: &Keyed,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Option<Claim>, Outcome<T, Failure<E>>> {
        let spec = keyed.spec();
        for secret in self.previous.iter() {
            let claiming = Claiming::under(&keyed.prepared, secret);
            match self.claim(keyed, claiming, now, by).await? {
                Claim::New { token, reference } => {
                    // Given back at once; the guard does it in the background if this future is
                    // dropped meanwhile or the release fails.
                    let key = claiming.key;
                    let probe = Guard::claiming(&self.core, Fence { key, token }, spec.name);
                    let released = self.core.store.release(key, token, now);
                    if let Err(source) = bounded(by, released).await {
                        tracing::warn!(tool = spec.name, %reference, error = %source, "idempotency: could not give back a probe claim under a previous secret");
                        return Err(refused(Error::Store {
                            tool: spec.name.into(),
                            source,
                        }));
                    }
                    probe.disarm();
                }
                earlier => return Ok(Some(earlier)),
            }
        }
        Ok(None)
    }
}

/// A claim acquired: what it holds, when it was made, and whether it took over a call whose
/// worker is gone (its answer is then not kept in the cache).
pub(super) struct Taken {
    pub(super) held: Held,
    pub(super) claimed: Claimed,
    pub(super) rerun: bool,
}

/// How a takeover ([`Idempotency::take_over`]) ended.
pub(super) enum TakeOver<T, E> {
    /// Taken over: the body runs again under the call's reference.
    Taken(Taken),
    /// Lost the race while its repeat may still wait: claim again, to wait for the rerun.
    Lost,
    /// The wrapper's answer ("in progress", or the store failed): nothing ran.
    Answered(Outcome<T, Failure<E>>),
}

/// What a takeover ([`Idempotency::take_over`]) takes over, and when: the call whose worker is
/// gone, the engine's time, by when the store must answer, and until when the repeat may wait.
#[derive(Clone, Copy, Debug)]
pub(super) struct Takeover {
    pub(super) gone: Gone,
    pub(super) now: crate::clock::Timestamp,
    pub(super) by: Option<tokio::time::Instant>,
    pub(super) until: Option<tokio::time::Instant>,
}

/// A fencing token for one attempt: its claim time in ms × 2^20 plus 20 random bits, so tokens
/// grow with time (a key claimed again after a purge never repeats a token a worker of the purged
/// record could hold) and two attempts at the same millisecond practically never share one.
fn attempt_token(now: crate::clock::Timestamp) -> Token {
    let low = i64::try_from(noise() & 0xF_FFFF).unwrap_or(0);
    Token(now.as_millis().saturating_mul(1 << 20) | low)
}
