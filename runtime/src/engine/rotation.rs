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

use crate::key::{Key, Reference, Secret};
use crate::outcome::{Failure, Outcome};
use crate::store::Claim;
use crate::tool::Prepared;

use super::claim::gone;
use super::guard::{bounded, Guard};
use super::{refused, Idempotency};

/// A claim made on the way through the order, under which nothing runs: given back (by its
/// guard, in the background, if the call goes away first or the release fails).
struct Made {
    key: Key,
    token: crate::store::Token,
    guard: Guard,
}

/// A call's keys, each with the secret it is made under.
type Keys<'s> = Vec<(Key, &'s Secret)>;

/// When a claim is given back, and by when the store must have answered.
type At = (crate::clock::Timestamp, Option<tokio::time::Instant>);

impl Idempotency {
    /// While secrets are rotated: claims the call's keys (`key`, the current secret's, and each
    /// previous secret's) in ascending key order. All new: the current secret's claim is the
    /// call's (the others are given back). A record found under one of them (live, completed,
    /// unknown, a mismatch) answers for the call: the claims made before it are given back. An
    /// error is the caller's answer (nothing ran).
    pub(super) async fn claim_in_order<T, E>(
        &self,
        prepared: &Prepared,
        key: Key,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Claim, Outcome<T, Failure<E>>> {
        let tool = prepared.spec.name;
        let (before, after) = self.keys_around(prepared, key);
        let mut made = Vec::with_capacity(before.len() + after.len() + 1);
        for (k, secret) in before {
            match self.claim(prepared, secret, now, by).await? {
                Claim::New { token, .. } => made.push(self.made(k, token, tool)),
                earlier => return Ok(self.answered_by(earlier, made, (now, by), tool).await),
            }
        }
        let own = self.claim(prepared, &self.secret, now, by).await?;
        let Claim::New { token, .. } = own else {
            return Ok(self.answered_by(own, made, (now, by), tool).await);
        };
        let guard = Guard::claiming(self, key, token, tool);
        for (k, secret) in after {
            match self.claim(prepared, secret, now, by).await? {
                Claim::New { token, .. } => made.push(self.made(k, token, tool)),
                earlier => {
                    made.push(Made { key, token, guard });
                    return Ok(self.answered_by(earlier, made, (now, by), tool).await);
                }
            }
        }
        // All new: the others are given back before the call runs under its own.
        if let Err(source) = self.give_back(made, (now, by)).await {
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
            guard: Guard::claiming(self, key, token, tool),
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
    async fn give_back(
        &self,
        made: Vec<Made>,
        (now, by): At,
    ) -> Result<(), crate::store::StoreError> {
        for m in made {
            bounded(by, self.store.release(m.key, m.token, now)).await?;
            m.guard.disarm();
        }
        Ok(())
    }

    /// The call's keys under the previous secrets, in the order every replica claims them
    /// (ascending key bytes), split around `key` (the current secret's): those before it, and
    /// those after it.
    fn keys_around<'s>(&'s self, prepared: &Prepared, key: Key) -> (Keys<'s>, Keys<'s>) {
        let mut keys: Keys<'s> = self
            .previous
            .iter()
            .map(|s| (prepared.key.key(s), s))
            .filter(|(k, _)| *k != key)
            .collect();
        keys.sort_by_key(|(k, _)| *k);
        keys.dedup_by_key(|(k, _)| *k);
        let after = keys.split_off(keys.partition_point(|(k, _)| *k < key));
        (keys, after)
    }

    /// The key to wait on for `claim` (a call in flight): the one holding its record (the
    /// current secret's, or while secrets are rotated a previous one's); `None`: not waited on
    /// (its lease passed, its worker is gone; or none of the call's keys holds it).
    pub(super) fn waited_key(
        &self,
        prepared: &Prepared,
        key: Key,
        claim: &Claim,
        now: crate::clock::Timestamp,
    ) -> Option<Key> {
        match claim {
            Claim::InFlight { reference, .. } if gone(claim, now).is_none() => {
                self.key_holding(prepared, key, *reference)
            }
            _ => None,
        }
    }

    /// Which of the call's keys (`key`, the current secret's, or a previous secret's) holds
    /// `reference`'s record; `None` if none does.
    pub(super) fn key_holding(
        &self,
        prepared: &Prepared,
        key: Key,
        reference: Reference,
    ) -> Option<Key> {
        let holds = |k: &Key| k.reference(reference.generation()) == reference;
        if holds(&key) {
            return Some(key);
        }
        self.previous
            .iter()
            .map(|s| prepared.key.key(s))
            .find(holds)
    }
}
