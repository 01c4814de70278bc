//! Why a fenced update or a takeover of a SQL store changed nothing, from the row a follow-up
//! read found under the key's `ref`.

use super::{generation_of, rest_of, split_state};
use crate::key::Key;
use crate::record::RecordState;
use crate::store::{StoreError, Token, WORKER_SETTLES};

/// What a fenced update requires: the states it applies in, and what it is (for the error when
/// it keeps losing races).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fence {
    pub(crate) allowed: &'static [RecordState],
    pub(crate) what: &'static str,
}

impl Fence {
    pub(crate) const COMPLETION: Fence = Fence {
        allowed: WORKER_SETTLES,
        what: "the completion",
    };
    pub(crate) const RELEASE: Fence = Fence {
        allowed: WORKER_SETTLES,
        what: "the release",
    };
    pub(crate) const MARK_UNKNOWN: Fence = Fence {
        allowed: &[RecordState::InFlight],
        what: "marking the outcome unknown",
    };
    pub(crate) const RENEWAL: Fence = Fence {
        allowed: &[RecordState::InFlight],
        what: "the lease renewal",
    };
    pub(crate) const SETTLEMENT: Fence = Fence {
        allowed: &[RecordState::InFlight, RecordState::Unknown],
        what: "the settlement",
    };
}

/// What a fenced update's follow-up read finds under the key's `ref`: generation, token,
/// state, key_rest.
pub(crate) type FenceRow = (i32, i64, i16, Vec<u8>);

/// Why a fenced update changed nothing, from the row as a follow-up read found it (`None`: no
/// row): `Err` with the answer, or `Ok(())` when the row now matches what the update required
/// (it was purged and claimed again in between), so the update should run again.
pub(crate) fn why_fenced(
    key: &Key,
    token: Token,
    row: Option<FenceRow>,
    allowed: &[RecordState],
) -> Result<(), StoreError> {
    let Some((generation, current, code, _)) = row.filter(|r| r.3 == rest_of(key)) else {
        return Err(StoreError::NotFound);
    };
    let reference = key.reference(generation_of(i64::from(generation))?);
    if current != token.0 {
        return Err(StoreError::Fenced { reference });
    }
    let (state, _) = split_state(code)?;
    if !allowed.contains(&state) {
        return Err(StoreError::WrongState {
            reference,
            state: state.as_str(),
        });
    }
    Ok(())
}

/// Why a takeover ([`Transition::TakeOver`](crate::store::Transition::TakeOver)) changed
/// nothing, from the row as a follow-up read found it (`None`: no row): no record of this key,
/// or one in a state (or with a live lease) a takeover may not touch.
pub(crate) fn why_not_taken(key: &Key, row: Option<FenceRow>) -> StoreError {
    let Some((generation, _, code, _)) = row.filter(|r| r.3 == rest_of(key)) else {
        return StoreError::NotFound;
    };
    match (generation_of(i64::from(generation)), split_state(code)) {
        (Ok(g), Ok((state, _))) => StoreError::WrongState {
            reference: key.reference(g),
            state: state.as_str(),
        },
        (Err(e), _) | (_, Err(e)) => e,
    }
}
