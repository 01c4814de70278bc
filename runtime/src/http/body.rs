//! Reading a body whole, within a bound: the request's before it is fingerprinted, the
//! response's before it is stored.

use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// Why a body was not read whole.
#[derive(Debug)]
pub(super) enum Unread {
    /// It is longer than the bound.
    TooLarge,
    /// The stream failed (the peer went away, the inner body's own error); its message.
    Failed(String),
}

/// `body` whole, if it has at most `limit` bytes.
pub(super) async fn read<B>(body: B, limit: usize) -> Result<Bytes, Unread>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if body.size_hint().lower() > limit as u64 {
        return Err(Unread::TooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Unread::TooLarge),
        Err(e) => Err(Unread::Failed(e.to_string())),
    }
}
