//! Durations in specs are written the Kubernetes way ("500ms", "5s", "1m30s"), so `kubectl`
//! users read them like any other resource's, and CEL's `duration()` can check them in the CRD.

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The regex the CRD schema enforces; [`SpecDuration::parse`] accepts exactly this language.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// A non-negative duration written as a sequence of `<integer><unit>` with units h, m, s, ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpecDuration(pub Duration);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{text}' is not a duration: write it like 500ms, 5s, 1m30s or 1h")]
pub struct DurationError {
    pub text: String,
}

impl SpecDuration {
    pub const fn from_secs(secs: u64) -> Self {
        SpecDuration(Duration::from_secs(secs))
    }

    pub const fn from_millis(ms: u64) -> Self {
        SpecDuration(Duration::from_millis(ms))
    }

    pub fn parse(text: &str) -> Result<Self, DurationError> {
        let err = || DurationError {
            text: text.to_string(),
        };
        if text.is_empty() {
            return Err(err());
        }
        let mut total = Duration::ZERO;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
            if digits == 0 {
                return Err(err());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| err())?;
            rest = &rest[digits..];
            let (unit, len) = if rest.starts_with("ms") {
                (Duration::from_millis(1), 2)
            } else if rest.starts_with('s') {
                (Duration::from_secs(1), 1)
            } else if rest.starts_with('m') {
                (Duration::from_secs(60), 1)
            } else if rest.starts_with('h') {
                (Duration::from_secs(3600), 1)
            } else {
                return Err(err());
            };
            rest = &rest[len..];
            let part = unit.checked_mul(u32::try_from(n).map_err(|_| err())?);
            total = part.and_then(|p| total.checked_add(p)).ok_or_else(err)?;
        }
        Ok(SpecDuration(total))
    }

    pub fn as_duration(self) -> Duration {
        self.0
    }
}

impl fmt::Display for SpecDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        let (h, m, s, rest_ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if s > 0 {
            write!(f, "{s}s")?;
        }
        if rest_ms > 0 {
            write!(f, "{rest_ms}ms")?;
        }
        Ok(())
    }
}

impl Serialize for SpecDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SpecDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        SpecDuration::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for SpecDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": 32,
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_style_durations() {
        assert_eq!(
            SpecDuration::parse("500ms").map(|d| d.0),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            SpecDuration::parse("1m30s").map(|d| d.0),
            Ok(Duration::from_secs(90))
        );
        assert_eq!(
            SpecDuration::parse("2h").map(|d| d.0),
            Ok(Duration::from_secs(7200))
        );
        assert_eq!(SpecDuration::parse("0s").map(|d| d.0), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_what_the_schema_refuses() {
        let re = regex::Regex::new(DURATION_PATTERN).unwrap();
        for bad in [
            "",
            "5",
            "s",
            "-1s",
            "1.5s",
            "5 s",
            "1d",
            "99999999999999999999s",
        ] {
            assert!(SpecDuration::parse(bad).is_err(), "{bad}");
            if re.is_match(bad) {
                // Only overflow may pass the pattern and still be refused.
                assert!(bad.len() > 15, "{bad}");
            }
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["500ms", "5s", "1m30s", "2h", "1h1m1s1ms", "0s"] {
            let d = SpecDuration::parse(text).unwrap();
            assert_eq!(d.to_string(), text);
            assert_eq!(SpecDuration::parse(&d.to_string()), Ok(d));
        }
    }
}
