//! Kubernetes resource quantities, read only as far as the operator must compare them with the
//! installer's bounds: a whole or decimal number (at most three decimals) with one of the
//! suffixes `Ki Mi Gi Ti`, `k M G T`, `m` (cpu only) or none. Anything else (exponents, `Pi`,
//! signs, `128m` of memory) is refused rather than guessed at; the arithmetic saturates.

/// The longest quantity text read; real ones are a few characters.
const MAX_LEN: usize = 32;

/// A quantity in thousandths of its unit (millicores for cpu, millibytes for memory), so cpu's
/// `m` and decimals compare exactly.
pub type Milli = u128;

/// Why a quantity was not read, for a message that says how to write it.
pub fn expected(milli_allowed: bool) -> &'static str {
    if milli_allowed {
        "a whole or decimal number (at most 3 decimals), with no suffix or one of m, k, M, G, T, Ki, Mi, Gi, Ti, e.g. 500m or 2"
    } else {
        "a whole or decimal number (at most 3 decimals), with no suffix or one of k, M, G, T, Ki, Mi, Gi, Ti, e.g. 512Mi or 1Gi"
    }
}

/// The quantity in thousandths, or `None` when it is not one this parser reads. `m` is taken
/// only where `milli_allowed` (cpu): `128m` of memory is a hundredth of a byte, always a slip.
pub fn parse(text: &str, milli_allowed: bool) -> Option<Milli> {
    if text.is_empty() || text.len() > MAX_LEN {
        return None;
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if suffix == "m" {
        // Thousandths already; a fraction of a millicore is below what Kubernetes keeps.
        return milli_allowed
            .then(|| whole(number))
            .flatten()
            .filter(|_| !number.contains('.'));
    }
    let factor: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    Some(thousandths(number)?.saturating_mul(factor))
}

/// Digits only, as a number (saturating).
fn whole(digits: &str) -> Option<u128> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(digits.bytes().fold(0u128, |n, b| {
        n.saturating_mul(10).saturating_add(u128::from(b - b'0'))
    }))
}

/// `12`, `0.5` or `1.25` in thousandths.
fn thousandths(number: &str) -> Option<u128> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if number.ends_with('.') || frac.len() > 3 || (!frac.is_empty() && int.is_empty()) {
        return None;
    }
    let int = whole(int)?;
    let frac = if frac.is_empty() {
        0
    } else {
        whole(frac)? * 10u128.pow(3 - frac.len() as u32)
    };
    Some(int.saturating_mul(1000).saturating_add(frac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_suffixes_kubernetes_uses_for_cpu_and_memory() {
        for (text, cpu, milli) in [
            ("2", true, 2_000),
            ("0.5", true, 500),
            ("1.25", true, 1_250),
            ("500m", true, 500),
            ("0", false, 0),
            ("1k", false, 1_000_000),
            ("1M", false, 1_000_000_000),
            ("1G", false, 1_000_000_000_000),
            ("1T", false, 1_000_000_000_000_000),
            ("1Ki", false, 1_024_000),
            ("128Mi", false, 128 * (1 << 20) * 1000),
            ("1.5Gi", false, 1_500 * (1 << 30)),
            ("2Ti", false, 2_000 * (1u128 << 40)),
        ] {
            assert_eq!(parse(text, cpu), Some(milli), "{text}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_compare_exactly() {
        for (text, cpu) in [
            ("", true),
            ("m", true),
            ("1e3", true),
            ("1E", false),
            ("1Pi", false),
            ("1Ei", false),
            ("-1", true),
            ("+1", true),
            (" 1", true),
            ("1 Gi", false),
            ("1.", true),
            (".5", true),
            ("0.0005", true),
            ("1.5m", true),
            ("1..2", true),
            ("128m", false),
            ("1gi", false),
            ("1Kib", false),
            ("١", true),
            ("9999999999999999999999999999999999Gi", false),
        ] {
            assert_eq!(parse(text, cpu), None, "{text:?}");
        }
    }

    #[test]
    fn large_numbers_saturate_instead_of_wrapping() {
        let big = "9".repeat(31);
        assert_eq!(parse(&format!("{big}T"), false), Some(u128::MAX));
        assert!(parse(&big, true).is_some_and(|n| n > 1_000_000_000_000));
    }
}
