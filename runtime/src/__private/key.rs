//! Deriving a call's key from its typed arguments ([`Keys`]), and the compile-time checks that
//! report unkeyable arguments at the user's type or business-key field.

use serde::Serialize;

use crate::error::Error;
use crate::key::{Caller, ClientKey};
use crate::tool::{BusinessKey, Prepared, ToolSpec};

/// The arguments of a wrapped tool. Named in generated code with the argument type spelled out,
/// so that a type without `Serialize` is reported at that type.
#[diagnostic::on_unimplemented(
    message = "the arguments of an idempotent tool must implement `serde::Serialize`: `{Self}` does not",
    label = "the key is computed from the canonical JSON of `{Self}`",
    note = "add `#[derive(serde::Serialize)]` to `{Self}`"
)]
pub trait Arguments: Serialize {}
impl<A: Serialize + ?Sized> Arguments for A {}

/// What a wrapped call's key is made from besides its arguments: the caller, the tool and, for
/// an rmcp tool taking client keys, the key the client sent. The generated key step calls one
/// of its methods with the arguments' type spelled out (`k.call::<ChargeArgs>(a)`), so that a
/// type without `Serialize` is reported at that type.
#[derive(Debug)]
pub struct Keys {
    caller: Caller,
    spec: ToolSpec,
    client: Option<ClientKey>,
}

impl Keys {
    pub(crate) fn new(caller: Caller, spec: ToolSpec, client: Option<ClientKey>) -> Self {
        Keys {
            caller,
            spec,
            client,
        }
    }

    /// The call keyed by all its arguments ([`Prepared::call`]), or by the client's key when the
    /// request carried one ([`Prepared::client`]).
    pub fn call<A: Arguments + ?Sized>(&self, args: &A) -> Result<Prepared, Error> {
        self.call_as(self.client.as_ref(), args)
    }

    /// [`Keys::call`] with `client`, a key read from the arguments, in place of the request's.
    pub(crate) fn call_as<A: Arguments + ?Sized>(
        &self,
        client: Option<&ClientKey>,
        args: &A,
    ) -> Result<Prepared, Error> {
        match client {
            Some(key) => Prepared::client(&self.caller, &self.spec, key, args),
            None => Prepared::call(&self.caller, &self.spec, args),
        }
    }

    /// The call keyed by its business key `value`, read from the field `field`
    /// ([`Prepared::business`]).
    pub fn business<A: Arguments + ?Sized, B: Serialize + ?Sized>(
        &self,
        field: &str,
        value: &B,
        args: &A,
    ) -> Result<Prepared, Error> {
        let key = BusinessKey { field, value };
        Prepared::business(&self.caller, &self.spec, key, args)
    }

    /// [`Keys::business`], or [`Keys::call`] for a call without its business key
    /// ([`Prepared::business_or_call`]).
    pub fn business_or_call<A: Arguments + ?Sized, B: Serialize + ?Sized>(
        &self,
        field: &str,
        value: &B,
        args: &A,
    ) -> Result<Prepared, Error> {
        let key = BusinessKey { field, value };
        Prepared::business_or_call(&self.caller, &self.spec, key, args)
    }

    /// The probe of one business-key field ([`KeyProbe`]).
    pub fn probe<'a, T: ?Sized>(&self, field: &'a T) -> KeyProbe<'a, T> {
        KeyProbe(KeyField(field))
    }

    /// One business-key field, checked where the attribute names it: the generated key step
    /// passes it the probe's `key()`, which is not a [`BusinessKeyField`] for an `Option`.
    pub fn business_key_field<B: BusinessKeyField + ?Sized>(&self, _field: &B) {}
}

/// A probe that makes an `Option` business-key field a compile error (unless the attribute says
/// what a missing one means): for an `Option`, the inherent `key` below is chosen, and returns a
/// type that cannot be a business key; for any other field, method lookup goes on through
/// `Deref` to [`KeyField::key`], the field itself. Made by [`Keys::probe`].
pub struct KeyProbe<'a, T: ?Sized>(KeyField<'a, T>);

impl<T: ?Sized> std::fmt::Debug for KeyProbe<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyProbe")
    }
}

impl<'a, T: ?Sized> std::ops::Deref for KeyProbe<'a, T> {
    type Target = KeyField<'a, T>;
    fn deref(&self) -> &KeyField<'a, T> {
        &self.0
    }
}

/// What a [`KeyProbe`] of a field that is not an `Option` reaches through `Deref`.
pub struct KeyField<'a, T: ?Sized>(&'a T);

impl<T: ?Sized> std::fmt::Debug for KeyField<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyField")
    }
}

impl<'a, T: ?Sized> KeyField<'a, T> {
    /// The field itself.
    pub fn key(&self) -> &'a T {
        self.0
    }
}

/// What a [`KeyProbe`]'s `key()` gives for an `Option` field: a `business_key` field that may be
/// missing needs `missing_key = "refuse"` (refuse such calls) or `missing_key = "call_key"` (key
/// them by all their arguments).
#[allow(non_camel_case_types)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a business key: an `Option` field needs `missing_key = \"refuse\"` or `missing_key = \"call_key\"`",
    label = "a business key must be a field that is always there",
    note = "for an `Option` field, say what a call without it means: refuse it, or key it by all its arguments"
)]
pub trait BusinessKeyField: Serialize {}
impl<T: Serialize + ?Sized> BusinessKeyField for T {}

/// Stands for an `Option` business-key field; not a [`BusinessKeyField`].
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct an_Option_business_key_needs_missing_key;

impl<T> KeyProbe<'_, Option<T>> {
    /// Chosen for `Option` fields.
    pub fn key(&self) -> &'static an_Option_business_key_needs_missing_key {
        &an_Option_business_key_needs_missing_key
    }
}
