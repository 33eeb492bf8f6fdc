//! JSON integers as JSON Schema counts them: a number whose value is whole,
//! however it is written. `1450`, `1450.0` and `1.45e3` are one value, and
//! the OpenAPI document's `"type": "integer"` calls all three valid, so the
//! parser must too. Read exactly from the number's text (the workspace's
//! serde_json keeps it, `arbitrary_precision`), never through a float that
//! would round `4932.0000000000001` to a whole number.

/// Most digits a value up to `u64::MAX` has.
const U64_DIGITS_MAX: usize = 20;

/// The whole value of a JSON number's text, if it is whole and fits a
/// `u64`; `None` for a fraction, a negative value other than zero, or a
/// value past `u64::MAX`.
pub fn whole_number(text: &str) -> Option<u64> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (integral, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if integral.is_empty() || !integral.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{integral}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    if negative {
        return None;
    }
    // The value is digits x 10^shift.
    let shift = exponent.checked_sub(i64::try_from(fraction.len()).ok()?)?;
    let whole = if shift >= 0 {
        let zeros = usize::try_from(shift).ok()?;
        if digits.len().checked_add(zeros)? > U64_DIGITS_MAX {
            return None;
        }
        format!("{digits}{}", "0".repeat(zeros))
    } else {
        let dropped = usize::try_from(shift.unsigned_abs()).ok()?;
        if dropped >= digits.len() {
            return None;
        }
        let (kept, rest) = digits.split_at(digits.len() - dropped);
        if rest.bytes().any(|b| b != b'0') {
            return None;
        }
        kept.to_owned()
    };
    whole.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_values_are_read_however_they_are_written() {
        for (text, value) in [
            ("1450", 1450),
            ("1450.0", 1450),
            ("1.45e3", 1450),
            ("14500E-1", 1450),
            ("0", 0),
            ("-0", 0),
            ("-0.0e5", 0),
            ("0.000", 0),
            ("18446744073709551615", u64::MAX),
            ("9007199254740991.000", 9_007_199_254_740_991),
        ] {
            assert_eq!(whole_number(text), Some(value), "{text}");
        }
    }

    #[test]
    fn fractions_negatives_and_overflow_are_not_whole() {
        for text in [
            "1.5",
            "4932.0000000000001",
            "1e-1",
            "-1",
            "-1.0",
            "18446744073709551616",
            "1e20",
            "1e999999999999",
            "1e-999999999999",
            ".5",
            "1.2.3",
            "",
        ] {
            assert_eq!(whole_number(text), None, "{text}");
        }
    }
}
