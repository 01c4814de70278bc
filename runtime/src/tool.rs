//! What the engine knows of a tool ([`ToolSpec`]) and of one call's arguments ([`Prepared`]).

use std::time::Duration;

use serde::Serialize;

use crate::error::Error;
use crate::key::{Caller, Fingerprint, Key, KeyError};

/// What the engine needs to know of a tool: its name, window and timeout. `#[idempotent]` makes
/// one for every tool it wraps (`charge_card::TOOL` for a free function, `Self::CHARGE_CARD_TOOL`
/// for a method); build one yourself to drive [`Idempotency`](crate::Idempotency) by hand.
///
/// ```
/// use std::time::Duration;
/// use idempotency::tool::ToolSpec;
/// const CHARGE: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(900))
///     .with_timeout(Duration::from_secs(30));
/// assert_eq!(CHARGE.name(), "charge_card");
/// assert_eq!(CHARGE.timeout(), Some(Duration::from_secs(30)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolSpec {
    pub(crate) name: &'static str,
    pub(crate) window: Duration,
    pub(crate) timeout: Option<Duration>,
}

impl ToolSpec {
    /// A tool named `name` (part of the key) whose completed answers are replayed for `window`.
    pub const fn new(name: &'static str, window: Duration) -> Self {
        ToolSpec {
            name,
            window,
            timeout: None,
        }
    }

    /// Abandons a running call as "outcome unknown" after `timeout`.
    pub const fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The tool's name (part of the key).
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// How long a completed answer is replayed, counted from its completion.
    pub const fn window(&self) -> Duration {
        self.window
    }

    /// After how long a running call is abandoned as "outcome unknown".
    pub const fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
}

/// Who shares a tool's records: every subject of the caller's tenant, or only the caller's
/// subject. It decides whether the subject is part of the key, and who may look a record up by
/// its reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Any subject of the tenant: the same business key (or call) from two subjects of one
    /// tenant is one operation, and either may ask its status. The default for business keys,
    /// which name a tenant-wide thing (an order is the organisation's, whichever agent retries it).
    Tenant,
    /// Only the caller's subject: another subject of the tenant gets neither the replay nor the
    /// status. The default for call keys.
    Subject,
}

/// A call's key and (for business keys) the fingerprint of its full arguments: what the engine
/// claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The key.
    pub key: Key,
    /// The full arguments' fingerprint, for business keys.
    pub fingerprint: Option<Fingerprint>,
    /// Who shares the record.
    pub scope: Scope,
}

impl Prepared {
    /// The key of a call keyed by all its arguments.
    ///
    /// ```
    /// use idempotency::{tool::Prepared, Caller};
    /// let p = Prepared::call(&Caller::new("acme", "alice"), "charge_card", &serde_json::json!({"amount": 1}))?;
    /// assert!(p.fingerprint.is_none());
    /// # Ok::<(), idempotency::Error>(())
    /// ```
    pub fn call<A: Serialize + ?Sized>(
        caller: &Caller,
        tool: &str,
        args: &A,
    ) -> Result<Self, Error> {
        let key = Key::for_call(caller, tool, args).map_err(|e| refused(tool, e))?;
        Ok(Prepared {
            key,
            fingerprint: None,
            scope: Scope::Subject,
        })
    }

    /// The key of a call keyed by a business key (the value of the arguments' `field`), with the
    /// full arguments' fingerprint. A missing business key — `null`, `""`, or a composite whose
    /// parts are all missing — is refused before anything is claimed: calls without one cannot
    /// be told apart, so they must never share a record.
    ///
    /// ```
    /// use idempotency::{tool::Prepared, Caller, Error};
    /// let alice = Caller::new("acme", "alice");
    /// let none: Option<&str> = None;
    /// let e = Prepared::business(&alice, "create_shipment", "order_id", &none, &"apple").unwrap_err();
    /// assert!(matches!(e, Error::Arguments { .. }));
    /// assert!(e.advice().contains("order_id"));
    /// ```
    pub fn business<A: Serialize + ?Sized, B: Serialize + ?Sized>(
        caller: &Caller,
        tool: &str,
        field: &str,
        business_key: &B,
        args: &A,
    ) -> Result<Self, Error> {
        if is_missing(business_key) {
            return Err(refused(
                tool,
                KeyError::MissingBusinessKey {
                    field: field.to_owned(),
                },
            ));
        }
        let key =
            Key::for_business_key(caller, tool, business_key).map_err(|e| refused(tool, e))?;
        let fingerprint = Fingerprint::of(args).map_err(|e| refused(tool, e))?;
        Ok(Prepared {
            key,
            fingerprint: Some(fingerprint),
            scope: Scope::Tenant,
        })
    }
}

/// Whether a business-key value is missing: `null`, `""`, or a list whose parts all are.
fn is_missing<B: Serialize + ?Sized>(value: &B) -> bool {
    fn missing(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Null => true,
            serde_json::Value::String(s) => s.is_empty(),
            serde_json::Value::Array(parts) => parts.iter().all(missing),
            _ => false,
        }
    }
    // A value that cannot be serialised is left to the keying, which says why.
    serde_json::to_value(value).is_ok_and(|v| missing(&v))
}

/// Why a call could not be keyed, as the wrapper's answer for `tool`.
fn refused(tool: &str, e: KeyError) -> Error {
    match e {
        KeyError::EmptyTenant => Error::InvalidCaller {
            reason: e.to_string(),
        },
        _ => Error::Arguments {
            tool: tool.to_owned(),
            source: e,
        },
    }
}
