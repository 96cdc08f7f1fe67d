//! Byte sizes as people write them: [`parse_bytes`] (`6GiB`, `512MiB`, `64MB`, `1.5GiB`, `1048576`)
//! and [`format_bytes`] (`22.5 KiB`).

use super::error::{ByteSizeProblem, KvError};

/// Fraction digits kept when parsing; later ones are below a byte for every unit we know.
const MAX_FRACTION_DIGITS: u32 = 24;

/// Parses a byte size: a non-negative decimal number, optional whitespace, and an optional unit.
///
/// Units are case-insensitive: `B`; `KB`, `MB`, `GB`, `TB` (powers of 1000, SI); `KiB`, `MiB`,
/// `GiB`, `TiB` (powers of 1024). No unit means bytes. A bare `K`/`M`/`G`/`T` is refused as
/// ambiguous. Fractions are exact (no floating point) and the result is rounded down to whole
/// bytes: `1.5GiB` = 1,610,612,736. O(len).
pub fn parse_bytes(s: &str) -> Result<u64, KvError> {
    let fail = |problem| KvError::ByteSize { input: s.to_owned(), problem };
    let text = s.trim();
    if text.is_empty() {
        return Err(fail(ByteSizeProblem::Empty));
    }
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let (mantissa, scale) = parse_decimal(number).map_err(fail)?;
    let multiplier = unit_multiplier(unit.trim()).map_err(fail)?;
    let bytes = mantissa.checked_mul(multiplier).ok_or(fail(ByteSizeProblem::TooLarge))?
        / 10u128.pow(scale);
    u64::try_from(bytes).map_err(|_| fail(ByteSizeProblem::TooLarge))
}

/// Splits `"12.345"` into `(12345, 3)` = 12345 / 10^3. Needs at least one digit and at most one dot.
fn parse_decimal(number: &str) -> Result<(u128, u32), ByteSizeProblem> {
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if frac_part.contains('.') || (int_part.is_empty() && frac_part.is_empty()) {
        return Err(ByteSizeProblem::BadNumber);
    }
    let mut mantissa: u128 = 0;
    let mut scale = 0;
    let frac_digits = frac_part.bytes().take(MAX_FRACTION_DIGITS as usize);
    for digit in int_part.bytes().chain(frac_digits) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(digit - b'0')))
            .ok_or(ByteSizeProblem::TooLarge)?;
    }
    scale += frac_part.len().min(MAX_FRACTION_DIGITS as usize) as u32;
    Ok((mantissa, scale))
}

/// Bytes per unit, for a unit already trimmed (case-insensitive).
fn unit_multiplier(unit: &str) -> Result<u128, ByteSizeProblem> {
    const SI: [&str; 4] = ["kb", "mb", "gb", "tb"];
    const BINARY: [&str; 4] = ["kib", "mib", "gib", "tib"];
    const BARE: [&str; 4] = ["k", "m", "g", "t"];
    let unit = unit.to_ascii_lowercase();
    if unit.is_empty() || unit == "b" {
        return Ok(1);
    }
    if let Some(i) = SI.iter().position(|u| *u == unit) {
        return Ok(1000u128.pow(i as u32 + 1));
    }
    if let Some(i) = BINARY.iter().position(|u| *u == unit) {
        return Ok(1u128 << (10 * (i + 1)));
    }
    if BARE.contains(&unit.as_str()) {
        return Err(ByteSizeProblem::AmbiguousUnit);
    }
    if unit.starts_with(['+', '-']) || unit.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(ByteSizeProblem::BadNumber);
    }
    Err(ByteSizeProblem::UnknownUnit)
}

/// Formats a byte count in binary units with at most two decimals, trailing zeros dropped:
/// `23040` → `"22.5 KiB"`, `2^31` → `"2 GiB"`, `1000` → `"1000 B"`. O(1).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / (1u64 << (10 * unit)) as f64;
    // 1023.999 KiB would print as "1024 KiB"; say "1 MiB" instead.
    if (value * 100.0).round() >= 1024.0 * 100.0 && unit + 1 < UNITS.len() {
        unit += 1;
        value /= 1024.0;
    }
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("6GiB"), Ok(6 * GIB));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("64MB"), Ok(64_000_000));
        assert_eq!(parse_bytes("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("1048576"), Ok(1_048_576));
        assert_eq!(parse_bytes("  6 gib "), Ok(6 * GIB));
        assert_eq!(parse_bytes("2kb"), Ok(2000));
        assert_eq!(parse_bytes("2KiB"), Ok(2048));
        assert_eq!(parse_bytes("3TB"), Ok(3_000_000_000_000));
        assert_eq!(parse_bytes("1TiB"), Ok(1 << 40));
        assert_eq!(parse_bytes("100B"), Ok(100));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes(".5KiB"), Ok(512));
        assert_eq!(parse_bytes("0.9GB"), Ok(900_000_000));
        assert_eq!(parse_bytes("1.1KiB"), Ok(1126)); // 1126.4 rounded down
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn explains_bad_input() {
        let problem = |s: &str| match parse_bytes(s) {
            Err(KvError::ByteSize { problem, .. }) => problem,
            other => panic!("{s:?} gave {other:?}"),
        };
        assert_eq!(problem(""), ByteSizeProblem::Empty);
        assert_eq!(problem("   "), ByteSizeProblem::Empty);
        assert_eq!(problem("GiB"), ByteSizeProblem::BadNumber);
        assert_eq!(problem("-4GB"), ByteSizeProblem::BadNumber);
        assert_eq!(problem("1.2.3GB"), ByteSizeProblem::BadNumber);
        assert_eq!(problem("."), ByteSizeProblem::BadNumber);
        assert_eq!(problem("6 G"), ByteSizeProblem::AmbiguousUnit);
        assert_eq!(problem("6k"), ByteSizeProblem::AmbiguousUnit);
        assert_eq!(problem("6 gigs"), ByteSizeProblem::UnknownUnit);
        assert_eq!(problem("1 2"), ByteSizeProblem::BadNumber);
        assert_eq!(problem("18446744073709551616"), ByteSizeProblem::TooLarge);
        assert_eq!(problem("17000000TiB"), ByteSizeProblem::TooLarge);
        assert_eq!(
            problem("999999999999999999999999999999999999999999"),
            ByteSizeProblem::TooLarge
        );
        let msg = parse_bytes("6G").unwrap_err().to_string();
        assert_eq!(
            msg,
            "invalid byte size \"6G\": a bare K/M/G/T is ambiguous; \
             write e.g. GB (10^9 bytes) or GiB (2^30 bytes)"
        );
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1000), "1000 B");
        assert_eq!(format_bytes(1024), "1 KiB");
        assert_eq!(format_bytes(23_040), "22.5 KiB");
        assert_eq!(format_bytes(512 << 10), "512 KiB");
        assert_eq!(format_bytes(2 * GIB), "2 GiB");
        assert_eq!(format_bytes(GIB + GIB / 3), "1.33 GiB");
        assert_eq!(format_bytes((1 << 20) - 1), "1 MiB");
        assert_eq!(format_bytes(u64::MAX), "16 EiB");
    }

    #[test]
    fn format_then_parse_is_close() {
        for bytes in [1u64, 999, 23_040, 368_640, 6 * GIB, 123_456_789_012] {
            let parsed = parse_bytes(&format_bytes(bytes).replace(' ', "")).unwrap();
            let err = parsed.abs_diff(bytes) as f64 / bytes as f64;
            assert!(err < 0.005, "{bytes} -> {} -> {parsed}", format_bytes(bytes));
        }
    }
}
