//! The enum options of `#[idempotent]`: each value with its spelling in the attribute and what it
//! means. The macro's "is not a …: expected …" errors and the runtime's `as_str` are both read
//! from these tables, so a spelling cannot differ between the two.

/// An option whose value is one of a few spellings (`recover = "rerun"`).
pub trait Choice: Copy + Sized + 'static {
    /// The option's name in the attribute, e.g. `recover`.
    const OPTION: &'static str;
    /// What a value is called in an error: "`x` is not *a recovery*".
    const NOUN: &'static str;
    /// A value to show in "`recover` takes a string, e.g. recover = \"rerun\"".
    const EXAMPLE: &'static str;
    /// Every value, in the order errors list them.
    const SPELLINGS: &'static [Spelling<Self>];

    /// The value spelled `text`, or an error that lists the spellings and what they mean.
    fn parse(text: &str) -> Result<Self, String> {
        if let Some(s) = Self::SPELLINGS.iter().find(|s| s.text == text) {
            return Ok(s.value);
        }
        let mut expected = String::new();
        let last = Self::SPELLINGS.len().saturating_sub(1);
        for (i, s) in Self::SPELLINGS.iter().enumerate() {
            if i > 0 {
                expected.push_str(if i == last { " or " } else { ", " });
            }
            expected.push('"');
            expected.push_str(s.text);
            expected.push('"');
            if !s.meaning.is_empty() {
                expected.push_str(" (");
                expected.push_str(s.meaning);
                expected.push(')');
            }
        }
        Err(format!(
            "`{text}` is not {}: expected {expected}",
            Self::NOUN
        ))
    }
}

/// One value of a [`Choice`]: how the attribute spells it and what it means.
#[derive(Clone, Copy, Debug)]
pub struct Spelling<T> {
    /// The attribute's spelling, e.g. `"rerun"`.
    pub text: &'static str,
    /// The value.
    pub value: T,
    /// What it means, in the words of an error message; empty when the spelling says it all.
    pub meaning: &'static str,
}

macro_rules! choice {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $option:literal, $noun:literal, e.g. $example:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal $(: $meaning:literal)?, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// The attribute's spelling of this value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl Choice for $name {
            const OPTION: &'static str = $option;
            const NOUN: &'static str = $noun;
            const EXAMPLE: &'static str = $example;
            const SPELLINGS: &'static [Spelling<Self>] = &[
                $( Spelling { text: $text, value: $name::$variant, meaning: choice!(@meaning $($meaning)?) }, )+
            ];
        }
    };
    (@meaning) => { "" };
    (@meaning $meaning:literal) => { $meaning };
}

choice! {
    /// What happens to a call whose worker is gone — it crashed, panicked, timed out or could not
    /// record its outcome, so its lease passed unrenewed or its outcome is unknown
    /// (`#[idempotent(recover = "...")]`).
    #[derive(Default)]
    pub enum Recover: "recover", "a recovery", e.g. "rerun" {
        /// Truthful and safe for any tool: repeats are told "outcome unknown — do not retry" until
        /// something settles the record (a `Reconcile` of yours, `idempotency-admin settle`).
        #[default]
        Unknown = "unknown": "repeats are told the outcome is unknown until it is settled",
        /// The next repeat runs the body again **under the same reference** (one runner among
        /// concurrent repeats and replicas, fenced; the others, with a `wait`, wait for its
        /// answer). Right when the side effect deduplicates on
        /// the reference downstream (the tool passes `Call::current().reference()` as the
        /// processor's or carrier's idempotency key): the processor then returns the original
        /// result instead of acting twice. Wrong for anything else.
        Rerun = "rerun": "the next repeat runs the body again under the same reference; for side effects that deduplicate on it",
        /// Your `Reconcile` settles it from the processor's record (`IdempotencyBuilder::reconcile`
        /// or a `tasks::Reconciler`); until then repeats are told "outcome unknown".
        Reconcile = "reconcile": "your Reconcile settles it",
    }
}

choice! {
    /// Who shares a tool's records: every subject of the caller's tenant, or only the caller's
    /// subject. It decides whether the subject is part of the key, and who may look a record up
    /// by its reference.
    pub enum Scope: "scope", "a scope", e.g. "tenant" {
        /// Any subject of the tenant: the same business key (or call) from two subjects of one
        /// tenant is one operation, and either may ask its status. The default for business keys,
        /// which name a tenant-wide thing (an order is the organisation's, whichever agent retries
        /// it).
        Tenant = "tenant": "every subject of the caller's tenant shares the records",
        /// Only the caller's subject: another subject of the tenant gets neither the replay nor
        /// the status. The default for call keys.
        Subject = "subject": "only the caller's subject",
    }
}

choice! {
    /// How the handler's `Err` is recorded (`on_error = "..."`).
    pub enum OnError: "on_error", "a disposition", e.g. "retryable" {
        /// Not stored: the next repeat runs the body again.
        Retryable = "retryable",
        /// Stored as the answer: repeats get the same error.
        Definitive = "definitive",
        /// Stored as "outcome unknown": the body may have acted.
        Unknown = "unknown",
    }
}

choice! {
    /// What a call without its business key means (`missing_key = "..."`).
    pub enum MissingKey: "missing_key", "what a missing business key can mean", e.g. "refuse" {
        /// The call is refused.
        Refuse = "refuse": "refuse the call",
        /// The call is keyed by all its arguments.
        CallKey = "call_key": "key it by all its arguments",
    }
}

choice! {
    /// Whether an rmcp tool takes the client's own idempotency key (`client_key = "..."`).
    pub enum ClientKey: "client_key", "a client-key mode", e.g. "accept" {
        /// A key the client sends scopes the call; without one, the server derives the key.
        Accept = "accept": "a key the client sends in `_meta` or the `Idempotency-Key` header scopes the call; without one, the server derives the key",
        /// A call without a client key is refused.
        Require = "require": "a call without one is refused",
    }
}

choice! {
    /// The shape of the wrapper's own answers on an rmcp tool (`answers = "..."`).
    pub enum Answers: "answers", "an answer shape", e.g. "acp" {
        /// This library's: `isError` results with `idempotency/status`, SEP-3182's JSON-RPC errors
        /// for client keys. The default.
        Mcp = "mcp": "this library's answers (the default)",
        /// The Agentic Commerce Protocol's: JSON-RPC `-32000` with ACP's `Error` in `data`.
        Acp = "acp": "ACP's Error object in a JSON-RPC -32000 error",
        /// The Universal Commerce Protocol's: JSON-RPC `-32000` with a UCP error message in `data`.
        Ucp = "ucp": "a UCP error message in a JSON-RPC -32000 error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Choice + PartialEq + std::fmt::Debug>(as_str: fn(T) -> &'static str) {
        for s in T::SPELLINGS {
            assert_eq!(T::parse(s.text), Ok(s.value));
            assert_eq!(as_str(s.value), s.text);
        }
        assert!(T::SPELLINGS.iter().any(|s| s.text == T::EXAMPLE));
        let err = T::parse("nope").unwrap_err();
        assert!(err.starts_with(&format!("`nope` is not {}: expected \"", T::NOUN)));
        for s in T::SPELLINGS {
            assert!(err.contains(&format!("\"{}\"", s.text)), "{err}");
        }
    }

    #[test]
    fn every_spelling_parses_to_its_value_and_back() {
        round_trip::<Recover>(Recover::as_str);
        round_trip::<Scope>(Scope::as_str);
        round_trip::<OnError>(OnError::as_str);
        round_trip::<MissingKey>(MissingKey::as_str);
        round_trip::<ClientKey>(ClientKey::as_str);
        round_trip::<Answers>(Answers::as_str);
    }

    #[test]
    fn errors_list_the_values_with_their_meaning() {
        assert_eq!(
            OnError::parse("maybe").unwrap_err(),
            "`maybe` is not a disposition: expected \"retryable\", \"definitive\" or \"unknown\""
        );
        assert_eq!(
            Scope::parse("org").unwrap_err(),
            "`org` is not a scope: expected \"tenant\" (every subject of the caller's tenant \
             shares the records) or \"subject\" (only the caller's subject)"
        );
        assert_eq!(Recover::default(), Recover::Unknown);
    }
}
