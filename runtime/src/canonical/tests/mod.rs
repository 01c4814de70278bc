//! Tests of the canonical JSON text: RFC 8785 output ([`jcs`]), the key's typed form
//! ([`keyed`]) and properties over generated JSON values ([`properties`]).

mod jcs;
mod keyed;
mod properties;
