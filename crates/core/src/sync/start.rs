//! Where a copy started reading a partition: [`CopyStart`], carried on the first offset sync
//! after it.
//!
//! A sync maps a record. A group may have committed a position with no record behind it: in a
//! range the source's cleaner removed, or among aborted records and transaction markers. Such
//! a position between two synced records translates with the first one's run. Below the first
//! record the copy read, no sync covers it, and MM2's rule gives nothing: a group committed
//! just before the first record a compacted partition still holds had no checkpoint at all.
//! The copy knows more: it read from a position (its seek) and found nothing before the
//! record, so every position in between maps where that record's reader must start (with
//! aligned offsets: to the same number, the target holding invisible fillers there).
//!
//! The start rides in a header of the record's own sync, not in a sync of its own: MM2's
//! readers ignore headers, and a sync at a position without a record would make their rule
//! (`down + 1` past a sync) skip the record at `down`.

/// Header on the first offset sync after a copy started reading a partition below that sync's
/// record; value `upstream:downstream` in decimal ([`CopyStart::header_value`]).
pub const SYNC_START_HEADER: &str = "mirrorflow.sync.start";

/// The longest header value read: two `i64`s in decimal and the colon.
const MAX_HEADER: usize = 2 * 19 + 1;

/// The copy read the source partition from position `upstream`; a reader starting on the
/// target at `downstream` reads what a source reader at `upstream` reads next. No source
/// record lies between `upstream` and the record of the sync that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyStart {
    pub upstream: i64,
    pub downstream: i64,
}

impl CopyStart {
    pub fn header_value(&self) -> String {
        format!("{}:{}", self.upstream, self.downstream)
    }

    /// The start a header value says, for a sync at `(up, down)`: `None` unless it is well
    /// formed and lies at or before the sync on both sides (a start past its record says
    /// nothing true).
    pub fn from_header(value: &[u8], up: i64, down: i64) -> Option<Self> {
        if value.len() > MAX_HEADER {
            return None;
        }
        let text = std::str::from_utf8(value).ok()?;
        let (a, b) = text.split_once(':')?;
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                .then(|| s.parse::<i64>().ok())
                .flatten()
        };
        let start = CopyStart {
            upstream: number(a)?,
            downstream: number(b)?,
        };
        (start.upstream <= up && start.downstream <= down).then_some(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_round_trips_and_hostile_values_are_nothing() {
        let s = CopyStart {
            upstream: 0,
            downstream: 7,
        };
        assert_eq!(
            CopyStart::from_header(s.header_value().as_bytes(), 360, 7),
            Some(s)
        );
        let max = format!("{}:{}", i64::MAX, i64::MAX);
        assert!(CopyStart::from_header(max.as_bytes(), i64::MAX, i64::MAX).is_some());
        for bad in [
            &b""[..],
            b":",
            b"1:",
            b":1",
            b"-1:0",
            b"0:-1",
            b"+1:0",
            b"1:2:3",
            b"1 :2",
            b"99999999999999999999:0",
            b"\xff:0",
            b"dense",
        ] {
            assert_eq!(CopyStart::from_header(bad, 360, 7), None, "{bad:?}");
        }
        let long = vec![b'0'; MAX_HEADER + 1];
        assert_eq!(CopyStart::from_header(&long, 360, 7), None);
        assert_eq!(
            CopyStart::from_header(b"361:0", 360, 7),
            None,
            "past its record"
        );
        assert_eq!(CopyStart::from_header(b"0:8", 360, 7), None);
    }
}
