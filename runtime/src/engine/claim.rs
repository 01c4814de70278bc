//! The claim steps of a call: claiming its key (and, while secrets are rotated, recognising a
//! record under a previous secret's key), taking over a call whose worker is gone
//! (`recover = "rerun"`), and the fencing token of each attempt.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Error;
use crate::key::{Reference, Scope, Secret};
use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::record::{RecordState, Standing};
use crate::store::{Claim, ClaimRequest, StoreError, Token};
use crate::tool::Prepared;

use super::attempt::{Attempt, Claimed};
use super::guard::{bounded, Guard, Held, Landing};
use super::{answered, noise, refused, Idempotency};

impl Idempotency {
    /// Claims the call's key under the current secret and, while secrets are rotated, its keys
    /// under the previous ones too, in the order every replica claims them
    /// ([`claim_in_order`](Idempotency::claim_in_order)); an error is the caller's answer
    /// (nothing ran).
    pub(super) async fn claim_any<T, E>(
        &self,
        prepared: &Prepared,
        key: crate::key::Key,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Claim, Outcome<T, Failure<E>>> {
        if self.previous.is_empty() {
            self.claim(prepared, &self.secret, now, by).await
        } else {
            self.claim_in_order(prepared, key, now, by).await
        }
    }

    /// Claims the call's key under `secret`; an error is the caller's answer (nothing ran).
    pub(super) async fn claim<T, E>(
        &self,
        prepared: &Prepared,
        secret: &Secret,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Claim, Outcome<T, Failure<E>>> {
        let tool = prepared.spec.name;
        let req = self.request(prepared, secret, now);
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
        let store = self.store.clone();
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
        Landing::new(self, (key, token), tool, call)
    }

    /// `recover = "rerun"`: takes over the call whose worker is gone (its reference, and when it
    /// started; under `key`, or while secrets are rotated the previous secret's key holding it)
    /// and runs the body again under its reference (same generation). One runner: a takeover
    /// that loses (another repeat or replica took it over first, or the record settled
    /// meanwhile) answers "in progress", unless the repeat may wait until a time still to come
    /// (`until`): then the body comes back with that answer (`Err`), to wait for the rerun's
    /// answer. A takeover whose reply is lost (or whose caller goes away meanwhile) is given
    /// back in the background, fenced by its own token, as a lost claim is: nothing ran under
    /// it, and the next repeat runs it at once.
    pub(super) async fn rerun<T, E, Fut>(
        &self,
        prepared: &Prepared,
        key: crate::key::Key,
        ((reference, since), now, by, until): (
            Gone,
            crate::clock::Timestamp,
            Option<tokio::time::Instant>,
            Option<tokio::time::Instant>,
        ),
        (policy, body): (ErrorPolicy<E>, Fut),
    ) -> Result<Outcome<T, Failure<E>>, Lost<T, E, Fut>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let spec = &prepared.spec;
        let tool = spec.name;
        let key = self.key_holding(prepared, key, reference).unwrap_or(key);
        let token = attempt_token(now);
        let store = self.store.clone();
        let lease = self.lease;
        let sent = tokio::time::Instant::now();
        let mut landing = Landing::new(
            self,
            (key, token),
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
                Ok(Attempt::new(
                    self,
                    *spec,
                    Held {
                        key,
                        reference,
                        token,
                    },
                    Claimed { at: now, sent },
                )
                .for_caller(prepared.caller.clone())
                .run(policy, body)
                .await)
            }
            Err(StoreError::WrongState { .. } | StoreError::NotFound) => {
                tracing::info!(tool, %reference, "idempotency: another repeat took over the call first (or it settled)");
                let lost = answered(Error::InFlight {
                    tool: tool.into(),
                    reference,
                    since,
                });
                match until {
                    Some(u) if tokio::time::Instant::now() < u => {
                        // Then claims again (finding the rerun in progress, or its answer).
                        super::wait::pace(&mut 0, until).await;
                        Err((lost, (policy, body)))
                    }
                    _ => Ok(lost),
                }
            }
            Err(source) => {
                tracing::warn!(tool, %reference, error = %source, "idempotency: could not take over a call whose worker is gone; nothing was run");
                Ok(refused(Error::Store {
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
        if !self.secret_check.passed() {
            if let Err(source) = bounded(by, self.secret_check.ensure(&*self.store)).await {
                tracing::error!(tool, error = %source, "idempotency: the store's secret check failed; nothing was run");
                return Err(refused(Error::Store {
                    tool: tool.into(),
                    source,
                }));
            }
        }
        Ok(())
    }

    /// What a claim of `prepared`'s key under `secret` asks the store for, with a new token.
    pub(super) fn request<'p>(
        &self,
        prepared: &'p Prepared,
        secret: &Secret,
        now: crate::clock::Timestamp,
    ) -> ClaimRequest<'p> {
        let (spec, caller) = (&prepared.spec, &prepared.caller);
        ClaimRequest {
            key: prepared.key.key(secret),
            tenant: &caller.tenant,
            subject: match prepared.scope {
                Scope::Subject => Some(&caller.subject),
                Scope::Tenant => None,
            },
            tool: spec.name,
            fingerprint: prepared.fingerprint.map(|f| f.fingerprint(secret)),
            now,
            lease: self.lease,
            window: spec.window,
            token: attempt_token(now),
        }
    }

    /// While secrets are rotated: the live record of this call under a previous secret's key,
    /// if there is one. A probe that finds none made a claim there, which it gives back at once.
    pub(super) async fn recognise<T, E>(
        &self,
        prepared: &Prepared,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Option<Claim>, Outcome<T, Failure<E>>> {
        let spec = &prepared.spec;
        for secret in self.previous.iter() {
            match self.claim(prepared, secret, now, by).await? {
                Claim::New { token, reference } => {
                    // Given back at once; the guard does it in the background if this future is
                    // dropped meanwhile or the release fails.
                    let key = prepared.key.key(secret);
                    let probe = Guard::claiming(self, key, token, spec.name);
                    if let Err(source) = bounded(by, self.store.release(key, token, now)).await {
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

/// A takeover that lost the race ([`Idempotency::rerun`]): the "in progress" answer, and the
/// policy and body handed back.
pub(super) type Lost<T, E, Fut> = (Outcome<T, Failure<E>>, (ErrorPolicy<E>, Fut));

/// A call whose worker is gone: its reference, and when it started.
pub(super) type Gone = (Reference, crate::clock::Timestamp);

/// The call a claim found whose worker is gone, with when it started: in flight with its lease
/// passed unrenewed ([`Standing::LeasePassed`]), or unknown. `None` for any other answer.
pub(super) fn gone(claim: &Claim, now: crate::clock::Timestamp) -> Option<Gone> {
    match *claim {
        Claim::InFlight {
            reference,
            claimed_at,
            lease_expires_at,
        } if Standing::of(RecordState::InFlight, None, now >= lease_expires_at, false)
            == Standing::LeasePassed =>
        {
            Some((reference, claimed_at))
        }
        Claim::Unknown { reference, since } => Some((reference, since)),
        _ => None,
    }
}

/// A fencing token for one attempt: its claim time in ms × 2^20 plus 20 random bits, so tokens
/// grow with time (a key claimed again after a purge never repeats a token a worker of the purged
/// record could hold) and two attempts at the same millisecond practically never share one.
fn attempt_token(now: crate::clock::Timestamp) -> Token {
    let low = i64::try_from(noise() & 0xF_FFFF).unwrap_or(0);
    Token(now.as_millis().saturating_mul(1 << 20) | low)
}
