//! Claims while secrets are rotated: a call has one key per secret an engine knows, and the
//! replicas of a rolling rotation know different sets (step 1: `secret(old)` with `new` listed,
//! step 2: `secret(new)` with `old` listed). Every replica claims the call's keys in one order
//! shared by all of them, ascending key bytes (a replica with one secret claims its one key,
//! which is one of that ordered set), and keeps going only while its claims are new. The same
//! call arriving at replicas of both steps at once then has one winner: the first to claim the
//! first key of the order claims the others after it, and the others find its claim (or the
//! claim it runs under) and wait for it or answer "in progress" for a call that is running.
//! Claimed in each replica's own order instead, each claimed its own key, found the other's
//! claim under its previous key, gave its own back, and both answered "in progress": nobody ran
//! the call.

use crate::key::{Key, Reference};
use crate::outcome::{Failure, Outcome};
use crate::store::{Claim, Fenced};

use super::answer::{gone, refused};
use super::guard::{bounded, Fence, Guard};
use super::keyed::{Claiming, Keyed};
use super::Idempotency;

/// A claim made on the way through the order, under which nothing runs: given back (by its
/// guard, in the background, if the call goes away first or the release fails).
struct Made {
    key: Key,
    token: crate::store::Token,
    guard: Guard,
}

/// When a claim is given back, and by when the store must have answered.
#[derive(Clone, Copy, Debug)]
struct At {
    now: crate::clock::Timestamp,
    by: Option<tokio::time::Instant>,
}

impl Idempotency {
    /// While secrets are rotated: claims the call's keys (the current secret's, and each
    /// previous secret's) in ascending key order. All new: the current secret's claim is the
    /// call's (the others are given back). A record found under one of them (live, completed,
    /// unknown, a mismatch) answers for the call: the claims made before it are given back. An
    /// error is the caller's answer (nothing ran).
    pub(super) async fn claim_in_order<T, E>(
        &self,
        keyed: &Keyed,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Claim, Outcome<T, Failure<E>>> {
        let tool = keyed.tool();
        let at = At { now, by };
        let (before, after) = self.keys_around(keyed);
        let mut made = Vec::with_capacity(before.len() + after.len() + 1);
        for claiming in before {
            match self.claim(keyed, claiming, now, by).await? {
                Claim::New { token, .. } => made.push(self.made(claiming.key, token, tool)),
                earlier => return Ok(self.answered_by(earlier, made, at, tool).await),
            }
        }
        let own = self.claim(keyed, keyed.current, now, by).await?;
        let Claim::New { token, .. } = own else {
            return Ok(self.answered_by(own, made, at, tool).await);
        };
        let key = keyed.key();
        let guard = Guard::claiming(&self.core, Fence { key, token }, tool);
        for claiming in after {
            match self.claim(keyed, claiming, now, by).await? {
                Claim::New { token, .. } => made.push(self.made(claiming.key, token, tool)),
                earlier => {
                    made.push(Made { key, token, guard });
                    return Ok(self.answered_by(earlier, made, at, tool).await);
                }
            }
        }
        // All new: the others are given back before the call runs under its own.
        if let Err(source) = self.give_back(made, at).await {
            tracing::warn!(tool, error = %source, "idempotency: could not give back a claim under another secret's key; nothing was run");
            return Err(refused(crate::error::Error::Store {
                tool: tool.into(),
                source,
            }));
        }
        // From here the call's attempt guards its claim.
        guard.disarm();
        Ok(own)
    }

    fn made(&self, key: Key, token: crate::store::Token, tool: &'static str) -> Made {
        Made {
            key,
            token,
            guard: Guard::claiming(&self.core, Fence { key, token }, tool),
        }
    }

    /// `found` answers for the call: the claims `made` on the way are given back (in the
    /// background if that fails now).
    async fn answered_by(
        &self,
        found: Claim,
        made: Vec<Made>,
        at: At,
        tool: &'static str,
    ) -> Claim {
        if let Err(source) = self.give_back(made, at).await {
            tracing::warn!(tool, error = %source, "idempotency: could not give back a claim answered from another key's record; retrying in the background");
        }
        found
    }

    /// Gives back each claim of `made`; at the first failure, the rest go back in the
    /// background (their guards).
    async fn give_back(&self, made: Vec<Made>, at: At) -> Result<(), crate::store::StoreError> {
        for m in made {
            bounded(at.by, self.core.store.release(m.key, m.token, at.now)).await?;
            m.guard.disarm();
        }
        Ok(())
    }

    /// The call's keys under the previous secrets, in the order every replica claims them
    /// (ascending key bytes), split around the current secret's: those before it, and those
    /// after it.
    fn keys_around(&self, keyed: &Keyed) -> (Vec<Claiming>, Vec<Claiming>) {
        let key = keyed.key();
        let mut keys: Vec<Claiming> = self
            .previous
            .iter()
            .map(|s| Claiming::under(&keyed.prepared, s))
            .filter(|c| c.key != key)
            .collect();
        keys.sort_by_key(|c| c.key);
        keys.dedup_by_key(|c| c.key);
        let after = keys.split_off(keys.partition_point(|c| c.key < key));
        (keys, after)
    }

    /// The key to wait on for `claim` (a call in flight): the one holding its record (the
    /// current secret's, or while secrets are rotated a previous one's); `None`: not waited on
    /// (its lease passed, its worker is gone; or none of the call's keys holds it).
    pub(super) fn waited_key(
        &self,
        keyed: &Keyed,
        claim: &Claim,
        now: crate::clock::Timestamp,
    ) -> Option<Key> {
        match claim {
            Claim::InFlight { reference, .. } if gone(claim, now).is_none() => {
                self.key_holding(keyed, *reference)
            }
            _ => None,
        }
    }

    /// Which of the call's keys (the current secret's, or a previous secret's) holds
    /// `reference`'s record; `None` if none does.
    pub(super) fn key_holding(&self, keyed: &Keyed, reference: Reference) -> Option<Key> {
        let holds = |k: &Key| k.reference(reference.generation()) == reference;
        if holds(&keyed.key()) {
            return Some(keyed.key());
        }
        self.previous
            .iter()
            .map(|s| keyed.prepared.key.key(s))
            .find(holds)
    }
}
