//! Kubernetes resource quantities (`"1"`, `"250m"`, `"2Gi"`, `"1.5"`, `"1e3"`), parsed exactly:
//! the value is kept as an integer mantissa with decimal and binary exponents, so rounding
//! happens once, in the direction the caller asks for. Only [`super::translate`] uses this: it
//! is the sole owner of quantity parsing.

use std::fmt;

/// An exactly parsed quantity: `mantissa × 10^exp10 × 2^exp2`, with a sign.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    mantissa: u128,
    exp10: i32,
    exp2: u32,
    /// Whether a unit suffix or exponent was written (`"8"` has none, `"8Gi"` has one).
    has_unit: bool,
    /// Whether the suffix was a binary one (`Ki` .. `Ei`).
    binary: bool,
}

/// Why a quantity string is not valid, or does not fit the caller's unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantityError {
    Syntax,
    Negative,
    TooLarge,
    NotWhole,
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Syntax => "not a Kubernetes quantity (examples: 1, 500m, 2Gi, 1.5)",
            Self::Negative => "must not be negative",
            Self::TooLarge => "is too large",
            Self::NotWhole => "must be a whole number",
        })
    }
}

impl Quantity {
    /// Parses the canonical and non-canonical forms the API server accepts.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let text = text.trim();
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(QuantityError::Syntax);
        }
        let digits = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 36 {
            return Err(QuantityError::TooLarge);
        }
        let mantissa = if digits.is_empty() {
            0
        } else {
            digits.parse::<u128>().map_err(|_| QuantityError::Syntax)?
        };
        let fraction_digits = i32::try_from(fraction.len()).map_err(|_| QuantityError::TooLarge)?;
        let (exp10, exp2, binary) = parse_suffix(suffix)?;
        Ok(Self {
            negative: negative && mantissa != 0,
            mantissa,
            exp10: exp10 - fraction_digits,
            exp2,
            has_unit: !suffix.is_empty(),
            binary,
        })
    }

    /// Whether a unit suffix or exponent was written.
    pub fn has_unit(&self) -> bool {
        self.has_unit
    }

    /// Whether the unit was binary (`Ki`, `Mi`, `Gi`, ...).
    pub fn is_binary(&self) -> bool {
        self.binary
    }

    /// `ceil(value × num / den)`, for a non-negative quantity.
    pub fn ceil_scaled(&self, num: u128, den: u128) -> Result<u64, QuantityError> {
        let (n, d) = self.ratio(num, den)?;
        to_u64(n.div_ceil(d))
    }

    /// `floor(value × num / den)`, for a non-negative quantity.
    pub fn floor_scaled(&self, num: u128, den: u128) -> Result<u64, QuantityError> {
        let (n, d) = self.ratio(num, den)?;
        to_u64(n / d)
    }

    /// The value as a whole number; a fraction is an error (`"1000m"` is 1, `"500m"` is not).
    pub fn whole(&self) -> Result<u64, QuantityError> {
        let (n, d) = self.ratio(1, 1)?;
        if n % d != 0 {
            return Err(QuantityError::NotWhole);
        }
        to_u64(n / d)
    }

    /// The exact value times `num / den` as a numerator and denominator.
    fn ratio(&self, num: u128, den: u128) -> Result<(u128, u128), QuantityError> {
        if self.negative {
            return Err(QuantityError::Negative);
        }
        if self.mantissa == 0 {
            return Ok((0, 1));
        }
        let mut n = self
            .mantissa
            .checked_mul(num)
            .ok_or(QuantityError::TooLarge)?;
        let mut d = den.max(1);
        let pow10 = |e: u32| 10u128.checked_pow(e).ok_or(QuantityError::TooLarge);
        if self.exp10 >= 0 {
            n = n
                .checked_mul(pow10(self.exp10.unsigned_abs())?)
                .ok_or(QuantityError::TooLarge)?;
        } else {
            d = d
                .checked_mul(pow10(self.exp10.unsigned_abs())?)
                .ok_or(QuantityError::TooLarge)?;
        }
        n = n
            .checked_mul(
                2u128
                    .checked_pow(self.exp2)
                    .ok_or(QuantityError::TooLarge)?,
            )
            .ok_or(QuantityError::TooLarge)?;
        Ok((n, d))
    }
}

fn to_u64(value: u128) -> Result<u64, QuantityError> {
    u64::try_from(value).map_err(|_| QuantityError::TooLarge)
}

/// `(decimal exponent, binary exponent, is binary)` of a suffix.
fn parse_suffix(suffix: &str) -> Result<(i32, u32, bool), QuantityError> {
    let decimal = |e: i32| Ok((e, 0, false));
    let binary = |e: u32| Ok((0, e, true));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        other => {
            // A decimal exponent: e or E followed by a signed integer.
            let exponent = other
                .strip_prefix(['e', 'E'])
                .ok_or(QuantityError::Syntax)?;
            let unsigned = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Syntax);
            }
            let value: i32 = exponent.parse().map_err(|_| QuantityError::TooLarge)?;
            if value.abs() > 60 {
                return Err(QuantityError::TooLarge);
            }
            decimal(value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MILLI: (u128, u128) = (1000, 1);
    const MIB: (u128, u128) = (1, 1 << 20);

    fn milli(text: &str) -> Result<u64, QuantityError> {
        Quantity::parse(text)?.ceil_scaled(MILLI.0, MILLI.1)
    }

    fn mib(text: &str) -> Result<u64, QuantityError> {
        Quantity::parse(text)?.ceil_scaled(MIB.0, MIB.1)
    }

    #[test]
    fn cpu_forms() {
        assert_eq!(milli("1"), Ok(1000));
        assert_eq!(milli("1000m"), Ok(1000));
        assert_eq!(milli("250m"), Ok(250));
        assert_eq!(milli("0.5"), Ok(500));
        assert_eq!(milli(".5"), Ok(500));
        assert_eq!(milli("2."), Ok(2000));
        assert_eq!(milli("1e3"), Ok(1_000_000));
        assert_eq!(milli("1E-3"), Ok(1));
        assert_eq!(
            milli("100u"),
            Ok(1),
            "sub-milli rounds up, as Kubernetes does"
        );
        assert_eq!(milli("+2"), Ok(2000));
        assert_eq!(milli("0"), Ok(0));
        assert_eq!(milli("-0"), Ok(0));
    }

    #[test]
    fn memory_forms() {
        assert_eq!(mib("2Gi"), Ok(2048));
        assert_eq!(mib("512Mi"), Ok(512));
        assert_eq!(mib("1G"), Ok(954), "1e9 bytes is 953.67 MiB, rounded up");
        assert_eq!(mib("1024Ki"), Ok(1));
        assert_eq!(
            mib("1"),
            Ok(1),
            "one byte still takes a MiB when rounding up"
        );
        assert_eq!(mib("1.5Gi"), Ok(1536));
        assert_eq!(mib("1Ti"), Ok(1 << 20));
        assert_eq!(
            Quantity::parse("1G").unwrap().floor_scaled(MIB.0, MIB.1),
            Ok(953)
        );
    }

    #[test]
    fn whole_numbers() {
        assert_eq!(Quantity::parse("2").unwrap().whole(), Ok(2));
        assert_eq!(Quantity::parse("1000m").unwrap().whole(), Ok(1));
        assert_eq!(Quantity::parse("2k").unwrap().whole(), Ok(2000));
        assert_eq!(
            Quantity::parse("500m").unwrap().whole(),
            Err(QuantityError::NotWhole)
        );
        assert_eq!(
            Quantity::parse("1.5").unwrap().whole(),
            Err(QuantityError::NotWhole)
        );
        assert_eq!(
            Quantity::parse("-1").unwrap().whole(),
            Err(QuantityError::Negative)
        );
        assert!(Quantity::parse("8Gi").unwrap().is_binary());
        assert!(!Quantity::parse("8").unwrap().has_unit());
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        for bad in [
            "", "abc", "1.2.3", "1x", "Gi", "1 Gi", "1e", "1e+", "--1", "1Gii", ".", "1e99999", "١",
        ] {
            assert!(
                Quantity::parse(bad).is_err()
                    || Quantity::parse(bad)
                        .and_then(|q| q.ceil_scaled(1000, 1))
                        .is_err(),
                "{bad:?} should be rejected"
            );
        }
        assert_eq!(
            milli("99999999999999999999999999999999999"),
            Err(QuantityError::TooLarge)
        );
        assert_eq!(milli("1E60"), Err(QuantityError::TooLarge));
        assert_eq!(mib("16Ei"), Ok(1 << 44));
    }
}
