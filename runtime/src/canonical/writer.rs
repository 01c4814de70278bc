//! What a value is written with: the output, the depth and the [`Mode`]. The serializer
//! (`serializer.rs`) and the object writer (`object.rs`) both hold one; keeping it here lets
//! each of them use it without using the other.

use super::{CanonicalError, MAX_DEPTH};

/// What the text is for: RFC 8785 for [`canonical_json`], or a key (see [`typed_canonical`]).
#[derive(Clone, Copy)]
pub(super) struct Mode {
    /// Keys: floats keep a mark that they are floats (`1.0`, `-0.0`), serde_json's private
    /// number and raw-value tokens are read strictly.
    pub(super) typed: bool,
    /// Top-level object members left out (volatile fields).
    pub(super) skip: &'static [&'static str],
}

pub(super) const JCS: Mode = Mode {
    typed: false,
    skip: &[],
};

/// Writes one value into `out`; `depth` is the number of levels around it.
pub(super) struct Ser<'a> {
    pub(super) out: &'a mut String,
    pub(super) depth: usize,
    pub(super) mode: Mode,
}

impl<'a> Ser<'a> {
    /// The depth of something nested one level inside the current value.
    pub(super) fn inner_depth(&self) -> Result<usize, CanonicalError> {
        if self.depth >= MAX_DEPTH {
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        } else {
            Ok(self.depth + 1)
        }
    }
}
