//! The option that refuses a new key for a request identical to one already sent with another
//! key ([`IdempotencyLayer::refuse_fresh_keys`]): a client that makes a fresh key on every
//! attempt defeats idempotency, and this catches it.
//!
//! A request that is about to run (its own key claimed) records "this request's fingerprint
//! belongs to key K" for the window, in a record of its own keyed by the caller, the operation
//! (and the route, with [`KeyScope::Path`]) and the fingerprint value. The same request under
//! another key within the window finds K's mark and is refused; under K again it finds its own
//! mark and runs (a retry after a `5xx`).
//!
//! [`IdempotencyLayer::refuse_fresh_keys`]: super::IdempotencyLayer::refuse_fresh_keys
//! [`KeyScope::Path`]: super::KeyScope::Path

use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::Config;
use super::fingerprint::sha256_hex;
use super::problem::Problem;
use crate::key::{ClientKey, Reference};
use crate::outcome::{ErrorPolicy, Failure};
use crate::tool::{Prepared, ToolSpec};
use crate::{Caller, Error};

/// The name of the marks' records (the operation is in their key).
const MARKS: &str = "idempotency_http_same_request";

/// How long a mark's repeat waits for a mark being written (a few store round trips).
const WAIT: Duration = Duration::from_secs(5);

/// What a mark is keyed by: the operation, the route (for path-scoped keys) and the request's
/// fingerprint value.
#[derive(Debug, Serialize)]
pub(super) struct SameRequest<'a> {
    pub(super) operation: &'a str,
    pub(super) route: Option<&'a str>,
    pub(super) request: &'a Value,
}

/// A mark: the key that sent the request first (a digest of it) and the reference it runs
/// under.
#[derive(Debug, Serialize, Deserialize)]
struct Mark {
    key: String,
    reference: Option<String>,
}

/// Marks `same` as `key`'s for the window, or refuses the request when another key marked it.
pub(super) async fn check(
    config: &Config,
    caller: &Caller,
    same: SameRequest<'_>,
    key: &ClientKey,
) -> Result<(), Problem> {
    let Some(window) = config.fresh_keys else {
        return Ok(());
    };
    let spec = ToolSpec::new(MARKS, window).with_wait(WAIT);
    let prepared = Prepared::call(caller, &spec, &same)
        .map_err(|e| Problem::from_error(&e, config.retry_after))?;
    let digest = sha256_hex(key.as_str().as_bytes());
    let mine = Mark {
        key: digest.clone(),
        reference: crate::Call::current().map(|c| c.reference().to_string()),
    };
    let out =
        config
            .engine
            .execute_raw::<Mark, Infallible, _>(prepared, ErrorPolicy::retryable(), async move {
                Ok(mine)
            })
            .await;
    let operation = config.spec.name();
    match out.result {
        Ok(mark) if mark.key == digest => Ok(()),
        Ok(mark) => {
            let earlier = mark.reference.and_then(|r| r.parse::<Reference>().ok());
            Err(Problem::fresh_key(operation, earlier))
        }
        Err(Failure::Wrapper(Error::InFlight { .. })) => Err(Problem::fresh_key(operation, None)),
        // The mark could not be written or read: the request did not run, whatever the mark's
        // own record says.
        Err(Failure::Wrapper(e)) => Err(Problem::unchecked(operation, &e, config.retry_after)),
        Err(Failure::Handler(never)) => match never {},
    }
}
