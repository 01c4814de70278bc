//! The record layout of the Redis store: a record as the scripts store it (one string, see
//! `Record`), packed by the client and read back, and the codes of its states.

use redis::Value;

use super::conn::int;
use super::{ClaimRequest, StoreError};
use crate::record::RecordState;

/// The state codes of the records (the SQL stores' codes).
const IN_FLIGHT: i64 = 0;
pub(super) const COMPLETED_OK: i64 = 1;
pub(super) const UNKNOWN: i64 = 2;
pub(super) const RELEASED: i64 = 3;
pub(super) const COMPLETED_ERR: i64 = 4;

pub(super) fn generation(v: &Value) -> Result<u32, StoreError> {
    let g = int(v)?;
    u32::try_from(g)
        .ok()
        .filter(|g| *g >= 1)
        .ok_or_else(|| StoreError::corrupt(format!("generation {g} is out of range")))
}

pub(super) fn state_name(code: i64) -> Result<(RecordState, Option<bool>), StoreError> {
    Ok(match code {
        IN_FLIGHT => (RecordState::InFlight, None),
        COMPLETED_OK => (RecordState::Completed, Some(true)),
        UNKNOWN => (RecordState::Unknown, None),
        RELEASED => (RecordState::Released, None),
        COMPLETED_ERR => (RecordState::Completed, Some(false)),
        other => return Err(StoreError::corrupt(format!("unknown record state {other}"))),
    })
}

/// The length of a record's head (`>BI4dddd`).
pub(super) const HEAD: usize = 37;

/// A record as the scripts store it: one string. A 37-byte head `>BI4dddd` (state, generation,
/// claim time, lease or window end, completion time, the tool's window from the claim; doubles
/// hold milliseconds exactly), then
/// the key rest (24 bytes) and the token (8 bytes, big-endian) at fixed places, so a fenced
/// script compares them without unpacking the rest; then the fingerprint (after a 1-byte
/// length), tenant, subject and tool (2-byte lengths) and the answer (4-byte length, empty
/// until settled). The client packs everything after the head (the claim's "tail"); the script
/// only prefixes the head, on the server's clock. One string is a third of the memory of a hash
/// of the same fields once the answer passes the hash's compact encoding.
pub(super) struct Record<'a> {
    pub(super) state: u8,
    pub(super) generation: u32,
    pub(super) key_rest: &'a [u8],
    pub(super) claimed: i64,
    pub(super) ends: i64,
    pub(super) completed: i64,
    /// The tool's window in ms, as the claim recorded it.
    pub(super) window: i64,
    /// Empty for a call key, else the business key's 32-byte fingerprint.
    pub(super) fingerprint: &'a [u8],
    pub(super) tenant: &'a [u8],
    pub(super) subject: &'a [u8],
    pub(super) tool: &'a [u8],
    pub(super) response: &'a [u8],
}

impl<'a> Record<'a> {
    /// A new record's string: a zeroed head (the claim writes it, see `HEAD`), then what
    /// follows it with an empty answer (the "tail" the claim script takes). One buffer, so the
    /// claim that writes the whole string neither allocates nor copies it again.
    pub(super) fn blank(req: &ClaimRequest<'_>) -> Result<Vec<u8>, StoreError> {
        let fingerprint = req
            .fingerprint
            .as_ref()
            .map_or(&[][..], |f| &f.as_bytes()[..]);
        let subject = req.subject.unwrap_or("");
        let mut tail = Vec::with_capacity(
            HEAD + 24
                + 8
                + 1
                + fingerprint.len()
                + 6
                + req.tenant.len()
                + subject.len()
                + req.tool.len()
                + 4,
        );
        tail.extend_from_slice(&[0; HEAD]);
        tail.extend_from_slice(&req.key.as_bytes()[8..]);
        tail.extend_from_slice(&req.token.0.to_be_bytes());
        let too_long = |what: &str| StoreError::Config {
            problem: format!(
                "the {what} of a call is too long for the Redis record (at most 65,535 bytes)"
            ),
            source: None,
        };
        tail.push(u8::try_from(fingerprint.len()).map_err(|_| too_long("fingerprint"))?);
        tail.extend_from_slice(fingerprint);
        for (what, field) in [
            ("tenant", req.tenant),
            ("subject", subject),
            ("tool name", req.tool),
        ] {
            let n = u16::try_from(field.len()).map_err(|_| too_long(what))?;
            tail.extend_from_slice(&n.to_be_bytes());
            tail.extend_from_slice(field.as_bytes());
        }
        tail.extend_from_slice(&[0; 4]);
        Ok(tail)
    }

    pub(super) fn parse(b: &'a [u8]) -> Result<Self, StoreError> {
        let short = || StoreError::corrupt("a record is shorter than its fields say");
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&'a [u8], StoreError> {
            let s = b.get(at..at + n).ok_or_else(short)?;
            at += n;
            Ok(s)
        };
        let state = take(1)?[0];
        let generation = u32::from_be_bytes(take(4)?.try_into().map_err(|_| short())?);
        let mut time = || -> Result<i64, StoreError> {
            let t = f64::from_be_bytes(take(8)?.try_into().map_err(|_| short())?);
            if !t.is_finite() {
                return Err(StoreError::corrupt(
                    "a record holds a time that is not a number",
                ));
            }
            Ok(t as i64)
        };
        let (claimed, ends, completed, window) = (time()?, time()?, time()?, time()?);
        let (key_rest, _token) = (take(24)?, take(8)?);
        let mut string = |len_bytes: usize| -> Result<&'a [u8], StoreError> {
            let mut n = 0usize;
            for byte in take(len_bytes)? {
                n = n << 8 | usize::from(*byte);
            }
            take(n)
        };
        let fingerprint = string(1)?;
        let (tenant, subject, tool) = (string(2)?, string(2)?, string(2)?);
        let response = string(4)?;
        if at != b.len() {
            return Err(StoreError::corrupt(format!(
                "a record is {} bytes long, {} more than its fields say",
                b.len(),
                b.len() - at.min(b.len())
            )));
        }
        if generation == 0 {
            return Err(StoreError::corrupt("a record's generation is 0"));
        }
        if !matches!(fingerprint.len(), 0 | 32) {
            return Err(StoreError::corrupt(format!(
                "a record's fingerprint is {} bytes long, not 32",
                fingerprint.len()
            )));
        }
        Ok(Record {
            state,
            generation,
            key_rest,
            claimed,
            ends,
            completed,
            window,
            fingerprint,
            tenant,
            subject,
            tool,
            response,
        })
    }
}
