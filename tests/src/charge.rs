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

/// Charges `amount` as alice's `charge_card` call through `engine` (a 15-minute window, errors
/// retryable). The handler counts one charge in `charges`, then awaits `meanwhile` (what the test
/// does while the processor works) and answers `amount`.
pub async fn counted_charge(
    engine: &idempotency::Idempotency,
    charges: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
    amount: u64,
    meanwhile: impl std::future::Future<Output = ()> + Send,
) -> idempotency::outcome::Outcome<u64, Wrapper> {
    use idempotency::{outcome::ErrorPolicy, tool::Prepared, Caller};
    let caller = Caller::new("acme", "alice");
    let prepared = Prepared::call(&caller, &crate::CHARGE_CARD, &amount).expect("key");
    let charges = charges.clone();
    engine
        .execute(prepared, ErrorPolicy::retryable(), async move {
            charges.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            meanwhile.await;
            Ok(amount)
        })
        .await
}
