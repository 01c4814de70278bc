//! Why a store call failed.

use crate::key::{Reference, SecretFingerprint};

/// A boxed error a backend keeps as a source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a store call failed. `Display` says what went wrong in this layer; the underlying error
/// (the driver's, the I/O's) is the [`source`](std::error::Error::source), never repeated.
///
/// `Debug` (what `fn main() -> Result<(), Box<dyn Error>>` prints) is the message and its causes
/// as a person reads them: `the idempotency store could not be reached: cannot connect to
/// postgres://app@db:5432/app: error communicating with database: Connection refused`.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be reached or a statement failed on the way (connection refused,
    /// reset, timed out; a pool exhausted; a database busy, loading, read only after a failover;
    /// a Redis Cluster down or resharding): trying again later may work.
    #[error("the idempotency store could not be reached")]
    Unavailable(#[source] BoxError),
    /// The store is configured in a way it cannot work with (an in-memory SQLite database, a
    /// URL that does not parse). Trying again will not help.
    #[error("the idempotency store is misconfigured: {problem}")]
    Config {
        /// What is wrong and how to fix it.
        problem: String,
        /// The underlying error, if there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// An operation kept losing races with concurrent writers of the same record and gave up
    /// without changing anything. Trying again may work.
    #[error(
        "{operation} kept racing with concurrent writers ({attempts} attempts) and changed nothing"
    )]
    Contention {
        /// The operation, e.g. `"the claim"`.
        operation: &'static str,
        /// How many times it ran.
        attempts: usize,
    },
    /// The store's schema migrations could not be applied. Trying again will not help until the
    /// database is fixed or the server upgraded.
    #[error("the idempotency store's schema could not be migrated: {problem}")]
    Migration {
        /// Which migration and what went wrong.
        problem: String,
        /// The database's error, if there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// A record could not be read back (a value of the wrong type or length, an unknown state
    /// code, a Redis record whose fields do not add up or that a script cannot unpack): a newer
    /// schema or damage. Trying again finds it the same: an operator must repair, settle or
    /// remove the record (the engine answers [`Error::Unreadable`](crate::Error::Unreadable)).
    #[error("the idempotency store holds a record this version cannot read: {problem}")]
    Corrupt {
        /// What could not be read.
        problem: String,
        /// The decoder's error, if there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The token presented is no longer the record's: someone else settled or took it over.
    #[error("the record of ref {reference} has moved on (its fencing token is stale); this worker's result was not recorded")]
    Fenced {
        /// The operation's reference.
        reference: Reference,
    },
    /// The record is in a state this operation does not apply to (e.g. releasing a completed record).
    #[error("the record of ref {reference} is {state}, not in flight; nothing was changed")]
    WrongState {
        /// The operation's reference.
        reference: Reference,
        /// Its current state.
        state: &'static str,
    },
    /// A record of a *different* key holds this key's reference: the two keys share their first
    /// 8 bytes. No two live records share a reference (downstream systems deduplicate on it), so
    /// the claim is refused until that record is purged.
    #[error("ref {reference} is held by the record of a different key (the two keys share their first 8 bytes); nothing was recorded")]
    ReferenceTaken {
        /// The reference both keys map to.
        reference: Reference,
    },
    /// The engine's secret is not the one the store's keys are made with, nor is that one among
    /// the engine's previous secrets: an engine with its own secret would run every call again
    /// (its keys never meet the others' records). The engine refuses to start, and refuses every
    /// call. Give every replica sharing the store the same secret; to rotate, see
    /// [`IdempotencyBuilder::previous_secrets`](crate::IdempotencyBuilder::previous_secrets).
    #[error("{}", secret_mismatch(stored, engine))]
    SecretMismatch {
        /// The fingerprint the store keeps.
        stored: SecretFingerprint,
        /// The engine's secret's fingerprint.
        engine: SecretFingerprint,
    },
    /// There is no record for the key.
    #[error("no record for this key")]
    NotFound,
    /// An operator's tool was pointed at a place holding no idempotency store (a missing SQLite
    /// file, a file or schema without the library's tables, an empty Redis namespace). Nothing
    /// was created there: check the path, URL or namespace; only a migration creates a store.
    #[error("no idempotency store here: {place}")]
    NoStore {
        /// The place and what it lacks, e.g. `the SQLite file /srv/app.db has no idempotency_migrations table`.
        place: String,
    },
    /// The store broke the contract of [`RecordStore`](super::RecordStore): it answered a
    /// [`Transition`](super::Transition) with what that transition never answers, or was asked
    /// for a transition it does not know (one added after it was written). A bug in the store,
    /// or a store older than this library; trying again will not help.
    #[error("the idempotency store does not keep its contract: {problem}")]
    Contract {
        /// What it did, e.g. `its transition answered release with TakenOver(..)`.
        problem: String,
    },
    /// An outbox receipt this store did not hand out.
    #[error("outbox receipt {receipt:?} was not issued by this store")]
    ForeignReceipt {
        /// The receipt as given.
        receipt: String,
    },
}

impl StoreError {
    /// Whether trying the same operation again later may succeed: the store was unreachable, or
    /// the operation kept losing races. Configuration, migration and corrupt-row errors are not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Contention { .. }
        )
    }

    /// A [`StoreError::Migration`] without an underlying error.
    pub fn migration(problem: impl Into<String>) -> Self {
        StoreError::Migration {
            problem: problem.into(),
            source: None,
        }
    }

    /// A [`StoreError::Corrupt`] without an underlying error.
    pub fn corrupt(problem: impl Into<String>) -> Self {
        StoreError::Corrupt {
            problem: problem.into(),
            source: None,
        }
    }
}

/// [`StoreError::SecretMismatch`]'s message: which secret is which, and what to do.
fn secret_mismatch(stored: &SecretFingerprint, engine: &SecretFingerprint) -> String {
    let name = |f: &SecretFingerprint| {
        if f.is_demo() {
            format!("{f}, the published demo secret used when none is configured")
        } else {
            f.to_string()
        }
    };
    format!(
        "this engine's idempotency secret (fingerprint {}) is not the one this store's keys are made with \
         (fingerprint {}) nor among its previous secrets, so every call would run again here: give every \
         replica sharing the store the same secret (IdempotencyBuilder::secret); to rotate to a new one, \
         list the store's in IdempotencyBuilder::previous_secrets",
        name(engine),
        name(stored)
    )
}

impl std::fmt::Debug for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", chain(self))
    }
}

/// `e` and its sources, joined by ": ", a source whose words already end the text said once
/// (some drivers repeat their source).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let words = cause.to_string();
        if !text.ends_with(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        source = cause.source();
    }
    text
}

/// `url` without its password (`user:secret@` becomes `user@`), for messages and logs.
#[cfg(feature = "redis")]
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let name = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{name}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// A store's database that could not be connected to: the target (never a password) and the
/// driver's reason, as its source.
#[cfg(any(feature = "_sql", test))]
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {target}")]
pub(crate) struct Unreachable {
    pub(crate) target: String,
    #[source]
    pub(crate) source: BoxError,
}

#[cfg(test)]
mod tests {
    use super::{StoreError, Unreachable};

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_sqlite_file_that_cannot_be_opened_is_named_with_the_reason() {
        let path = std::path::Path::new("/nonexistent-directory-of-idempotency/app.db");
        let e = crate::store::SqliteStore::open(path).await.unwrap_err();
        let text = format!("{e:?}");
        assert!(
            text.contains(
                "cannot connect to the SQLite file /nonexistent-directory-of-idempotency/app.db"
            ) && text.contains("unable to open database file"),
            "{text}"
        );
    }

    #[cfg(feature = "redis")]
    #[test]
    fn urls_lose_their_password() {
        assert_eq!(
            super::redact("redis://:hunter2@h:6379/0"),
            "redis://@h:6379/0"
        );
        assert_eq!(super::redact("redis://app:pw@h:1"), "redis://app@h:1");
        assert_eq!(super::redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn debug_is_the_message_and_its_causes_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = StoreError::Unavailable(Box::new(Unreachable {
            target: "postgres://app@db:5432/app".into(),
            source: Box::new(io),
        }));
        assert_eq!(
            format!("{e:?}"),
            "the idempotency store could not be reached: cannot connect to postgres://app@db:5432/app: Connection refused"
        );
    }
}
