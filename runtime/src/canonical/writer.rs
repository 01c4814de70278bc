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
    /// Members left out (volatile fields), by path: `sent_at` at the top, `meta.request_id`
    /// inside the top-level `meta` object.
    pub(super) skip: &'static [&'static str],
    /// The path of the object whose members are written with this mode (`""` at the top,
    /// `"meta."` inside `meta`), while a path in `skip` runs through it; `None` elsewhere.
    pub(super) at: Option<&'static str>,
}

pub(super) const JCS: Mode = Mode {
    typed: false,
    skip: &[],
    at: None,
};

impl Mode {
    /// The mode of a member named `name` of an object written with `self`: `None` when the
    /// member is left out (its path is in `skip`), else the mode its value is written with.
    pub(super) fn member(self, name: &str) -> Option<Mode> {
        let Some(prefix) = self.at else {
            return Some(self);
        };
        let mut inside = None;
        for path in self.skip {
            let Some(after) = path
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix(name))
            else {
                continue;
            };
            // `meta.*` leaves out no member of `meta`: the typed value holds only what its type
            // reads, which is keyed (the check accepts the rest unread, see `mcp::arguments`).
            if after.is_empty() && !path.ends_with(".*") {
                return None;
            }
            if inside.is_none() && after.starts_with('.') {
                inside = path.get(..prefix.len() + name.len() + 1);
            }
        }
        Some(Mode { at: inside, ..self })
    }

    /// The mode of what is not an object member (an array's element, a variant's content):
    /// paths in `skip` name object members only.
    pub(super) fn unnamed(self) -> Mode {
        Mode { at: None, ..self }
    }
}

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
