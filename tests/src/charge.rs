//! The `charge_card` handler's fixtures that several test files share: its error type (one
//! variant per disposition), the engine error wrapped as a handler error, and the reference the
//! running call is under, as a processor stub records it.

use idempotency::{Classify, Disposition, Error};
use serde::{Deserialize, Serialize};

/// The charge's own errors, one per disposition, and an engine error as the handler reports it.
#[derive(Debug, thiserror::Error, Serialize, Deserialize, PartialEq)]
pub enum ChargeError {
    /// Definitive: the processor said no.
    #[error("card declined")]
    Declined,
    /// Retryable: the processor was not reached.
    #[error("processor unreachable")]
    Down,
    /// Unknown: the processor did not answer in time.
    #[error("processor timed out")]
    Timeout,
    /// Unknown: an engine error, by its advice.
    #[error("{0}")]
    Wrapper(String),
}

impl From<Error> for ChargeError {
    fn from(e: Error) -> Self {
        ChargeError::Wrapper(e.advice())
    }
}

impl Classify for ChargeError {
    fn disposition(&self) -> Disposition {
        match self {
            ChargeError::Declined => Disposition::Definitive,
            ChargeError::Down => Disposition::Retryable,
            ChargeError::Timeout | ChargeError::Wrapper(_) => Disposition::Unknown,
        }
    }
}

/// A handler error that is only an engine error (for handlers whose own work cannot fail).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Wrapper(#[from] pub Error);

/// The reference of the call running on this task (as a processor stub records it); empty
/// outside a call.
pub fn current_reference() -> String {
    idempotency::Call::current()
        .map(|c| c.reference().to_string())
        .unwrap_or_default()
}
