//! The one duration grammar of this workspace: a positive whole number and a unit (`ms`, `s`,
//! `m`, `h` or `d`), e.g. `"500ms"`, `"90s"`, `"15m"`, `"2h"`, `"1d"`. The `#[idempotent]`
//! attribute reads its `window`, `timeout` and `wait` with it, and `idempotency-admin` its
//! `--older-than`, `--retention` and `--redis-retention`.
//!
//! It lives here, in the small crate the macro, the runtime and the CLI all depend on (as
//! `serde_derive_internals` serves `serde_derive`), so there is one copy of it.

const DURATION_FORMS: &str =
    "a positive whole number and a unit (`ms`, `s`, `m`, `h` or `d`), e.g. \"500ms\", \"90s\", \"15m\", \"2h\", \"1d\"";

/// `"15m"` → 900 000 ms. Units `ms`, `s`, `m`, `h`, `d`; zero, a missing number or unit, spaces and
/// values that overflow `u64` milliseconds are errors.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let factor: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ if s.is_empty() => {
            return Err(format!(
                "an empty string is not a duration: expected {DURATION_FORMS}"
            ))
        }
        _ if digits.is_empty() => {
            return Err(format!(
                "`{s}` is not a duration: expected {DURATION_FORMS}"
            ))
        }
        _ => {
            return Err(format!(
                "`{s}` has no valid unit: expected {DURATION_FORMS}"
            ))
        }
    };
    if digits.is_empty() {
        return Err(format!("`{s}` has no number: expected {DURATION_FORMS}"));
    }
    let too_large = || {
        format!(
            "`{s}` is too large: expected {DURATION_FORMS}, at most {} ms",
            u64::MAX
        )
    };
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    if n == 0 {
        return Err(format!("`{s}` is zero: expected {DURATION_FORMS}"));
    }
    n.checked_mul(factor).ok_or_else(too_large)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15m"), Ok(900_000));
        assert_eq!(parse_duration("90s"), Ok(90_000));
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("2h"), Ok(7_200_000));
        assert_eq!(parse_duration("1d"), Ok(86_400_000));
        for bad in [
            "15x",
            "0s",
            "",
            "m",
            "15",
            " 15m",
            "15 m",
            "1.5h",
            "-1s",
            "99999999999999999999h",
            "9999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest::proptest! {
        #[test]
        fn duration_parser_never_panics(s in "\\PC{0,12}") {
            let _ = parse_duration(&s);
        }
    }
}
