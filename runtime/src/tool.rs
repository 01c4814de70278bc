//! What the engine knows of a tool ([`ToolSpec`]) and of one call's arguments ([`Prepared`]).

use std::time::Duration;

use serde::Serialize;

use crate::error::Error;
use crate::key::{Caller, ClientKey, FingerprintMaterial, KeyError, KeyMaterial, Owner, Scope};
pub use crate::origin::Origin;
pub use idempotency_options::Recover;

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
    pub(crate) wait: Option<Duration>,
    pub(crate) scope: Option<Scope>,
    pub(crate) ignore: &'static [&'static str],
    pub(crate) recover: Recover,
    pub(crate) transactional: bool,
}

impl ToolSpec {
    /// A tool named `name` (part of the key) whose completed answers are replayed for `window`.
    pub const fn new(name: &'static str, window: Duration) -> Self {
        ToolSpec {
            name,
            window,
            timeout: None,
            wait: None,
            scope: None,
            ignore: &[],
            recover: Recover::Unknown,
            transactional: false,
        }
    }

    /// Runs each call in one transaction of the store's database: the claim, the handler's
    /// writes ([`Call::transaction`](crate::Call::transaction)) and the outcome commit together,
    /// or not at all. Only the SQL stores run such a tool.
    pub const fn with_transactional(mut self) -> Self {
        self.transactional = true;
        self
    }

    /// Whether each call runs in one transaction of the store's database.
    pub const fn is_transactional(&self) -> bool {
        self.transactional
    }

    /// What a repeat does once the call's worker is gone (default [`Recover::Unknown`]).
    pub const fn with_recover(mut self, recover: Recover) -> Self {
        self.recover = recover;
        self
    }

    /// What a repeat does once the call's worker is gone.
    pub const fn recover(&self) -> Recover {
        self.recover
    }

    /// Abandons a running call as "outcome unknown" after `timeout`.
    pub const fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long a repeat that finds the call in progress waits for its answer (bounded also by
    /// the timeout) before it is told "in progress"; overrides the engine's
    /// [`IdempotencyBuilder::wait`](crate::IdempotencyBuilder::wait). Zero: no wait.
    pub const fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// How long a repeat waits for a call in progress, if the tool sets it.
    pub const fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// Who shares the tool's records (default: [`Scope::Subject`] for call keys,
    /// [`Scope::Tenant`] for business keys).
    pub const fn with_scope(mut self, scope: Scope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Argument fields left out of the key and the fingerprint: volatile values a retry may
    /// carry fresh (a client timestamp, a request id) that must not make it a new call. A field
    /// is named by its JSON path through objects: `sent_at` at the top, `meta.request_id` inside
    /// the top-level `meta` object (the names the arguments serialise to; not through arrays).
    /// The handler still gets them; the first call's answer is what a repeat gets.
    ///
    /// A path ending in `.*` (`meta.*`) names the members of that object which the arguments'
    /// type does not read: a wrapped rmcp tool accepts them (ACP asks servers to ignore `meta`
    /// members a later version adds) where it refuses other members it cannot key, and lists
    /// that object open in its input schema. The typed arguments do not carry them, so they are
    /// in no key or fingerprint; the members the type reads there stay keyed. A bare `*` is
    /// a member named `*` (the attribute refuses it).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency::tool::{Prepared, ToolSpec};
    /// use idempotency::Caller;
    /// const CREATE: ToolSpec = ToolSpec::new("create_checkout_session", Duration::from_secs(60))
    ///     .ignoring(&["meta.request_id", "meta.*"]);
    /// let alice = Caller::new("acme", "alice");
    /// let key = |args| Prepared::call(&alice, &CREATE, &args).map(|p| p.key);
    /// let a = key(serde_json::json!({"meta": {"api_version": "1", "request_id": "a"}}))?;
    /// let b = key(serde_json::json!({"meta": {"api_version": "1", "request_id": "b"}}))?;
    /// let c = key(serde_json::json!({"meta": {"api_version": "2", "request_id": "a"}}))?;
    /// assert_eq!(a, b);
    /// assert_ne!(a, c);
    /// # Ok::<(), idempotency::Error>(())
    /// ```
    pub const fn ignoring(mut self, fields: &'static [&'static str]) -> Self {
        self.ignore = fields;
        self
    }

    /// The fields [`ToolSpec::ignoring`] leaves out of the key.
    pub const fn ignored(&self) -> &'static [&'static str] {
        self.ignore
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

/// One call as the engine takes it: the tool, the caller, and what its key and (for business
/// keys) the fingerprint of its full arguments are made from; the engine derives them under its
/// secret and claims the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The key's material.
    pub key: KeyMaterial,
    /// The full arguments' fingerprint material, for business keys.
    pub fingerprint: Option<FingerprintMaterial>,
    /// Who shares the record.
    pub scope: Scope,
    /// The tool called.
    pub spec: ToolSpec,
    /// Who called it.
    pub caller: Caller,
    /// Where the call came from, for its span (set by the MCP integration).
    pub origin: Origin,
}

/// A call's business key: the field (or path) the attribute names, and its value.
#[derive(Clone, Copy, Debug)]
pub struct BusinessKey<'a, B: ?Sized> {
    /// The field's name or path, for the refusal of a call without it.
    pub field: &'a str,
    /// Its value.
    pub value: &'a B,
}

impl Prepared {
    /// The key of a call keyed by all its arguments.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency::{tool::{Prepared, ToolSpec}, Caller};
    /// const CHARGE: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(900));
    /// let p = Prepared::call(&Caller::new("acme", "alice"), &CHARGE, &serde_json::json!({"amount": 1}))?;
    /// assert!(p.fingerprint.is_none());
    /// # Ok::<(), idempotency::Error>(())
    /// ```
    pub fn call<A: Serialize + ?Sized>(
        caller: &Caller,
        spec: &ToolSpec,
        args: &A,
    ) -> Result<Self, Error> {
        let tool = spec.name;
        let owner = Owner {
            caller,
            tool,
            scope: spec.scope.unwrap_or(Scope::Subject),
        };
        let key = KeyMaterial::call(owner, args, spec.ignore).map_err(|e| refused(tool, e))?;
        Ok(Prepared::keyed(owner, spec, key, None))
    }

    /// The key of a call keyed by a business key (the value of the arguments' `field`), with the
    /// full arguments' fingerprint. A missing business key — `null`, `""`, or a composite whose
    /// parts are all missing — is refused before anything is claimed: calls without one cannot
    /// be told apart, so they must never share a record.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency::{tool::{BusinessKey, Prepared, ToolSpec}, Caller, Error};
    /// const SHIP: ToolSpec = ToolSpec::new("create_shipment", Duration::from_secs(900));
    /// let alice = Caller::new("acme", "alice");
    /// let none: Option<&str> = None;
    /// let order = BusinessKey { field: "order_id", value: &none };
    /// let e = Prepared::business(&alice, &SHIP, order, &"apple").unwrap_err();
    /// assert!(matches!(e, Error::Arguments { .. }));
    /// assert!(e.advice().contains("order_id"));
    /// ```
    pub fn business<A: Serialize + ?Sized, B: Serialize + ?Sized>(
        caller: &Caller,
        spec: &ToolSpec,
        business_key: BusinessKey<'_, B>,
        args: &A,
    ) -> Result<Self, Error> {
        let tool = spec.name;
        if is_missing(business_key.value) {
            return Err(refused(
                tool,
                KeyError::MissingBusinessKey {
                    field: business_key.field.to_owned(),
                },
            ));
        }
        let owner = Owner {
            caller,
            tool,
            scope: spec.scope.unwrap_or(Scope::Tenant),
        };
        let key = KeyMaterial::business(owner, business_key.value).map_err(|e| refused(tool, e))?;
        let fingerprint =
            FingerprintMaterial::of(args, spec.ignore).map_err(|e| refused(tool, e))?;
        Ok(Prepared::keyed(owner, spec, key, Some(fingerprint)))
    }
}

impl Prepared {
    /// The key of a call the client software keyed itself ([`ClientKey`]), with the full
    /// arguments' fingerprint: the same key with other arguments is a payload mismatch, never
    /// the old answer. The key is combined with the caller's tenant and subject (whatever the
    /// tool's scope) and the tool, so it never crosses callers.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency::{key::ClientKey, tool::{Prepared, ToolSpec}, Caller};
    /// const CHARGE: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(900));
    /// let key = ClientKey::new("6f1c2a7e-7d55-4c1e-9a53-0b5e3c2f9a10")?;
    /// let alice = Prepared::client(&Caller::new("acme", "alice"), &CHARGE, &key, &1)?;
    /// let bob = Prepared::client(&Caller::new("acme", "bob"), &CHARGE, &key, &1)?;
    /// assert_ne!(alice.key, bob.key);
    /// assert!(alice.fingerprint.is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client<A: Serialize + ?Sized>(
        caller: &Caller,
        spec: &ToolSpec,
        client_key: &ClientKey,
        args: &A,
    ) -> Result<Self, Error> {
        let tool = spec.name;
        let owner = Owner {
            caller,
            tool,
            scope: Scope::Subject,
        };
        let key = KeyMaterial::client(owner, client_key).map_err(|e| refused(tool, e))?;
        let fingerprint =
            FingerprintMaterial::of(args, spec.ignore).map_err(|e| refused(tool, e))?;
        Ok(Prepared::keyed(owner, spec, key, Some(fingerprint)))
    }

    /// Like [`Prepared::business`], except that a call whose business key is missing is keyed by
    /// all its arguments ([`Prepared::call`]) instead of being refused.
    pub fn business_or_call<A: Serialize + ?Sized, B: Serialize + ?Sized>(
        caller: &Caller,
        spec: &ToolSpec,
        business_key: BusinessKey<'_, B>,
        args: &A,
    ) -> Result<Self, Error> {
        if is_missing(business_key.value) {
            Prepared::call(caller, spec, args)
        } else {
            Prepared::business(caller, spec, business_key, args)
        }
    }
}

impl Prepared {
    /// A call of `spec` by the owner's caller, in the owner's scope, under its key and
    /// fingerprint, with no origin yet.
    fn keyed(
        owner: Owner<'_>,
        spec: &ToolSpec,
        key: KeyMaterial,
        fingerprint: Option<FingerprintMaterial>,
    ) -> Prepared {
        Prepared {
            key,
            fingerprint,
            scope: owner.scope,
            spec: *spec,
            caller: owner.caller.clone(),
            origin: Origin::default(),
        }
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

/// A tool the engine must know before its first call, registered at link time (`inventory`):
/// a transactional tool (`start` refuses a store that cannot run it, naming it) or a task tool
/// (`tasks/get` says what its recovery means for a task whose worker is gone).
#[derive(Debug)]
pub struct Registered(ToolSpec);

impl Registered {
    /// The registration of `spec` (a `static`, hence `const`).
    pub(crate) const fn new(spec: ToolSpec) -> Self {
        Registered(spec)
    }
}

inventory::collect!(Registered);

/// The registered tools.
fn registered() -> impl Iterator<Item = &'static ToolSpec> {
    inventory::iter::<Registered>.into_iter().map(|r| &r.0)
}

/// The transactional tools linked into this program (the attribute registers each one), by
/// name, sorted: [`IdempotencyBuilder::start`](crate::IdempotencyBuilder::start) refuses a
/// store that cannot run them, naming the tool, before the first call.
pub(crate) fn transactional_tools() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = registered()
        .filter(|t| t.transactional)
        .map(|t| t.name)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The recovery of the task tool `name` (the attribute registers each task tool, so that
/// `tasks/get` can tell a client what a task whose worker is gone means for that tool), when
/// every registration of that name agrees on it.
#[cfg(feature = "rmcp")]
pub(crate) fn task_recovery(name: &str) -> Option<Recover> {
    let mut found = registered().filter(|t| t.name == name).map(|t| t.recover);
    let first = found.next()?;
    found.all(|r| r == first).then_some(first)
}
