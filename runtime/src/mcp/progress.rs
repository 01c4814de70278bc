//! Progress notifications for a repeat that waits for the call in progress (`wait`), to a client
//! that sent a progress token with its `tools/call`: one as the wait begins and one a second,
//! `progress` the milliseconds waited and `total` the most it may wait.

use std::sync::Arc;

use rmcp::model::ProgressNotificationParam;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::progress::{Reporter, Waiting};

/// The reporter for `request`: `None` unless its client sent a progress token.
pub(crate) fn progress_of(request: &RequestContext<RoleServer>) -> Option<Reporter> {
    let token = request.meta.get_progress_token()?;
    let peer = request.peer.clone();
    Some(Reporter(Arc::new(move |w: Waiting| {
        let note = ProgressNotificationParam::new(token.clone(), w.waited.as_millis() as f64)
            .with_total(w.wait.as_millis() as f64)
            .with_message(format!(
                "This call is already in progress (ref {}); waiting for its answer.",
                w.reference
            ));
        let peer = peer.clone();
        tokio::spawn(async move {
            if let Err(e) = peer.notify_progress(note).await {
                tracing::debug!(error = %e, "idempotency: could not send a progress notification");
            }
        });
    })))
}
