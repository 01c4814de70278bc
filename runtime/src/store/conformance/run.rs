//! Running one case in a task of its own, so that its failure (a panic) is caught and reported
//! with its name.

use std::any::Any;
use std::fmt::Write;
use std::sync::Arc;

use super::subject::Subject;
use super::{Case, Factory, Options};

/// Runs `case` on a fresh store from `factory`: `Err` with the failure's message when it failed.
pub(super) async fn one(
    case: &Case,
    factory: &impl Factory,
    options: &Options,
) -> Result<(), String> {
    let subject = Subject {
        store: Arc::new(factory.store().await),
        crowd: options.crowd,
    };
    let body = case.body;
    match tokio::spawn(async move { body(&subject).await }).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_panic() => Err(message(e.into_panic())),
        Err(e) => Err(format!("the case's task was cancelled: {e}")),
    }
}

/// What a panic said.
fn message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => (*s).to_owned(),
            Err(_) => "a panic without a message".to_owned(),
        },
    }
}

/// The report of a run where `failed` (case, why) of `total` cases failed.
pub(super) fn report(failed: &[(&str, String)], total: usize) -> String {
    let mut out = format!(
        "{} of {total} store conformance cases failed:",
        failed.len()
    );
    for (name, why) in failed {
        let _ = write!(out, "\n\n- `{name}`:\n    {}", why.replace('\n', "\n    "));
    }
    out
}
