//! Numbers: floats as ECMAScript writes them (through `ryu-js`), integers with their exact
//! digits, and serde_json's `arbitrary_precision` number text, for RFC 8785 and for a key.

use std::fmt::Write as _;

use super::CanonicalError;

pub(super) fn write_f64(out: &mut String, f: f64) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFiniteNumber);
    }
    // ryu-js writes both zeros as "0", as ECMAScript does.
    out.push_str(ryu_js::Buffer::new().format_finite(f));
    Ok(())
}

pub(super) fn write_f32(out: &mut String, f: f32) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFiniteNumber);
    }
    out.push_str(ryu_js::Buffer::new().format_finite(f));
    Ok(())
}

pub(super) fn write_int(out: &mut String, v: impl std::fmt::Display) {
    // Writing into a String cannot fail.
    let _ = write!(out, "{v}");
}

/// A number given as JSON text (serde_json's `arbitrary_precision` token): integers keep their
/// digits, anything else goes through an `f64` like every float.
pub(super) fn write_number_text(out: &mut String, text: &str) -> Result<(), CanonicalError> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let significant = digits.trim_start_matches('0');
        if significant.is_empty() {
            out.push('0');
        } else {
            if digits.len() != text.len() {
                out.push('-');
            }
            out.push_str(significant);
        }
        return Ok(());
    }
    let f: f64 = text
        .parse()
        .map_err(|_| CanonicalError::Custom(format!("{text:?} is not a JSON number")))?;
    write_f64(out, f)
}

/// Marks the float just written (its ECMAScript text is `out[start..]`) as a float: `.0` after
/// a whole number, and the sign of a negative zero (`-0.0`). Still valid JSON.
pub(super) fn mark_float(out: &mut String, start: usize, negative: bool) {
    let text = &out[start..];
    if text == "0" && negative {
        out.insert(start, '-');
    }
    if !out[start..].contains(['.', 'e']) {
        out.push_str(".0");
    }
}

/// A number given as JSON text (serde_json's `arbitrary_precision` token), for a key: digits
/// within 64 bits are an integer; digits beyond, and any number with a fraction or exponent
/// whose value is whole, are written out exactly as a float (`…000.0`), as serde_json reads
/// them back as floats; other fractions go through an `f64`.
pub(super) fn write_number_text_typed(out: &mut String, text: &str) -> Result<(), CanonicalError> {
    let bad = || CanonicalError::Custom(format!("{text:?} is not a JSON number"));
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if !body.is_empty() && body.bytes().all(|b| b.is_ascii_digit()) {
        if text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok() {
            return write_number_text(out, text);
        }
        write_number_text(out, text)?;
        out.push_str(".0");
        return Ok(());
    }
    // mantissa digits and the power of ten that scales them
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], body[i + 1..].parse::<i64>().map_err(|_| bad())?),
        None => (body, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let digits = format!("{int}{frac}");
    let scale = exponent - frac.len() as i64;
    let significant = digits.trim_end_matches('0');
    let trailing = (digits.len() - significant.len()) as i64;
    let whole = significant.is_empty() || scale + trailing >= 0;
    if whole && scale <= 400 {
        let mut exact = significant.trim_start_matches('0').to_owned();
        if exact.is_empty() {
            out.push_str(if negative { "-0.0" } else { "0.0" });
            return Ok(());
        }
        exact.extend(std::iter::repeat_n(
            '0',
            usize::try_from(scale + trailing).unwrap_or(0),
        ));
        if negative {
            out.push('-');
        }
        out.push_str(&exact);
        out.push_str(".0");
        return Ok(());
    }
    let f: f64 = text.parse().map_err(|_| bad())?;
    let start = out.len();
    write_f64(out, f)?;
    mark_float(out, start, f.is_sign_negative());
    Ok(())
}
