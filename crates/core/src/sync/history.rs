//! Every run of a partition that left the head, a few bytes each: [`History`].
//!
//! # Why
//! The store's run list keeps 64 runs, log-spaced, so an offset far behind the head translates
//! only coarsely. That is cheap on a plain topic (one run for its whole life) but not where
//! every few records start a new run: a transactional source copied without its markers gets a
//! new delta at every transaction, a compacted one at every hole. A group committed in the
//! middle of such a history (a consumer far behind, a replicator catching up, a group rewound)
//! re-read up to a hundred records per partition after failover. History keeps those runs
//! exactly, so the store translates every offset since its oldest kept run as if it had kept
//! every run.
//!
//! # Encoding
//! A run is stored relative to the end of the run before it: the gap up to its start and its
//! length, on both sides, as zigzag varints (about 5 bytes for a transaction's run). Runs of
//! the same shape in a row (fixed-size transactions, a regular pattern of holes) are one entry
//! with a count, so a regular marker pattern costs the same few bytes however long it lasts.
//! Every [`ANCHOR_EVERY`] entries an anchor records the absolute position, so a translation
//! decodes at most that many entries after a binary search.
//!
//! # Bounded
//! The bytes and the anchors stay within the budget ([`super::StoreConfig::history_bytes`]):
//! when full, the oldest block of entries goes. The run list still translates those offsets,
//! coarsely, as before.

use std::mem::size_of;

use super::store::Run;

/// Entries between two anchors: a translation decodes at most this many.
const ANCHOR_EVERY: usize = 32;

/// A run's shape relative to the end of the run before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    gap_up: i64,
    gap_down: i64,
    len_up: i64,
    len_down: i64,
    exact: bool,
}

impl Shape {
    fn of(run: &Run, prev_end: (i64, i64)) -> Self {
        Self {
            gap_up: run.up.saturating_sub(prev_end.0),
            gap_down: run.down.saturating_sub(prev_end.1),
            len_up: run.end_up.saturating_sub(run.up),
            len_down: run.end_down.saturating_sub(run.down),
            exact: run.exact,
        }
    }

    /// The `j`-th run of an entry of this shape that starts after `base`.
    fn run(&self, base: (i64, i64), j: u64) -> Run {
        let j = i64::try_from(j).unwrap_or(i64::MAX);
        let up = base
            .0
            .saturating_add(self.gap_up)
            .saturating_add(j.saturating_mul(self.period_up()));
        let down = base
            .1
            .saturating_add(self.gap_down)
            .saturating_add(j.saturating_mul(self.gap_down.saturating_add(self.len_down)));
        Run {
            up,
            down,
            end_up: up.saturating_add(self.len_up),
            end_down: down.saturating_add(self.len_down),
            exact: self.exact,
            dense: self.exact,
        }
    }

    /// Upstream offsets from one run's start to the next one's, at least 1: two runs never
    /// start at the same offset.
    fn period_up(&self) -> i64 {
        self.gap_up.saturating_add(self.len_up).max(1)
    }

    /// Where the last of `count` runs of this shape after `base` ends.
    fn end(&self, base: (i64, i64), count: u64) -> (i64, i64) {
        let last = self.run(base, count.saturating_sub(1));
        (last.end_up, last.end_down)
    }
}

/// Runs of one shape in a row, starting after `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    base: (i64, i64),
    shape: Shape,
    count: u64,
}

impl Entry {
    fn first_up(&self) -> i64 {
        self.shape.run(self.base, 0).up
    }

    fn end(&self) -> (i64, i64) {
        self.shape.end(self.base, self.count)
    }
}

#[derive(Debug, Clone, Copy)]
struct Anchor {
    /// Byte offset of the block's first entry.
    pos: usize,
    /// The end of the run before the block's first entry.
    base: (i64, i64),
    first_up: i64,
}

/// The runs of one partition that left the head, oldest first (see the module docs).
#[derive(Debug, Clone, Default)]
pub(super) struct History {
    bytes: Vec<u8>,
    anchors: Vec<Anchor>,
    /// Entries encoded since the newest anchor.
    since_anchor: usize,
    /// The newest entry, kept decoded while runs of its shape may still follow.
    pending: Option<Entry>,
}

impl History {
    /// Appends the run that just stopped being the head. Runs arrive in order and never
    /// overlap; `budget` bounds the bytes of entries and anchors held.
    pub(super) fn push(&mut self, run: &Run, budget: usize) {
        let Some(pending) = self.pending.as_mut() else {
            self.pending = Some(Entry {
                base: (run.up, run.down),
                shape: Shape::of(run, (run.up, run.down)),
                count: 1,
            });
            return;
        };
        let shape = Shape::of(run, pending.end());
        if shape == pending.shape {
            pending.count = pending.count.saturating_add(1);
            return;
        }
        let next = Entry {
            base: pending.end(),
            shape,
            count: 1,
        };
        let done = std::mem::replace(pending, next);
        self.encode(done, budget);
    }

    fn encode(&mut self, entry: Entry, budget: usize) {
        if budget == 0 {
            return;
        }
        if self.anchors.is_empty() || self.since_anchor >= ANCHOR_EVERY {
            if self.anchors.len() == self.anchors.capacity() {
                // A quarter more at a time: doubling would leave half the budget unused.
                self.anchors.reserve_exact((self.anchors.len() / 4).max(4));
            }
            self.anchors.push(Anchor {
                pos: self.bytes.len(),
                base: entry.base,
                first_up: entry.first_up(),
            });
            self.since_anchor = 0;
        }
        let s = entry.shape;
        let mut encoded = [0_u8; 5 * 10];
        let mut n = 0;
        // The usual run has as many offsets on both sides: a flag then, not a fifth number.
        let extra_down = s.len_down.saturating_sub(s.len_up);
        let tag = entry.count.saturating_sub(1).saturating_mul(4)
            | u64::from(extra_down != 0) << 1
            | u64::from(s.exact);
        let values = [
            tag,
            zigzag(s.gap_up),
            zigzag(s.gap_down),
            zigzag(s.len_up),
            zigzag(extra_down),
        ];
        let fields = if extra_down == 0 { 4 } else { 5 };
        for &value in &values[..fields] {
            n += write_varint(value, &mut encoded[n..]);
        }
        self.reserve(n, budget);
        self.bytes.extend_from_slice(&encoded[..n]);
        self.since_anchor += 1;
        while self.used_bytes() > budget && !self.anchors.is_empty() {
            self.drop_oldest_block();
        }
    }

    /// Grows the byte buffer by at most doubling and never past the budget, so its capacity
    /// (what [`Self::memory_bytes`] counts) stays bounded.
    fn reserve(&mut self, n: usize, budget: usize) {
        let need = self.bytes.len() + n;
        if need <= self.bytes.capacity() {
            return;
        }
        let want = (self.bytes.len() * 2).max(64).min(budget).max(need);
        self.bytes.reserve_exact(want - self.bytes.len());
    }

    fn drop_oldest_block(&mut self) {
        let Some(cut) = self.anchors.get(1).map(|a| a.pos) else {
            self.bytes.clear();
            self.anchors.clear();
            self.since_anchor = 0;
            return;
        };
        self.bytes.drain(..cut);
        self.anchors.remove(0);
        for a in &mut self.anchors {
            a.pos -= cut;
        }
    }

    /// What the budget bounds: the entries and anchors held.
    fn used_bytes(&self) -> usize {
        self.bytes.len() + self.anchors.len() * size_of::<Anchor>()
    }

    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }

    /// The oldest upstream offset held.
    pub(super) fn first_up(&self) -> Option<i64> {
        self.anchors
            .first()
            .map(|a| a.first_up)
            .or_else(|| self.pending.map(|p| p.first_up()))
    }

    /// The run holding `c` (the newest one starting at or before it) and the run after it, or
    /// `None` after the newest run held (the caller's head follows). `None` overall when `c`
    /// precedes every run held.
    pub(super) fn around(&self, c: i64) -> Option<(Run, Option<Run>)> {
        let block = self.anchors.partition_point(|a| a.first_up <= c);
        let mut entries = match block.checked_sub(1) {
            Some(k) => self.entries_from(k),
            None if self.anchors.is_empty() => self.entries_from(0),
            None => return None,
        };
        let mut found: Option<Run> = None;
        for entry in entries.by_ref() {
            let first = entry.shape.run(entry.base, 0);
            if first.up > c {
                // `c` sits after the previous entry's last run; this entry's first run follows.
                return found.map(|r| (r, Some(first)));
            }
            let j = u64::try_from(c.saturating_sub(first.up) / entry.shape.period_up())
                .unwrap_or(0)
                .min(entry.count - 1);
            let run = entry.shape.run(entry.base, j);
            if j + 1 < entry.count {
                return Some((run, Some(entry.shape.run(entry.base, j + 1))));
            }
            found = Some(run);
        }
        found.map(|r| (r, None))
    }

    /// Entries from anchor `k` on (from the pending one when there is no anchor).
    fn entries_from(&self, k: usize) -> impl Iterator<Item = Entry> + '_ {
        let (pos, base) = self
            .anchors
            .get(k)
            .map_or((self.bytes.len(), (0, 0)), |a| (a.pos, a.base));
        Decoder {
            bytes: &self.bytes[pos..],
            base,
        }
        .chain(self.pending)
    }

    /// Bytes allocated on the heap (the struct itself is its owner's).
    pub(super) fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.anchors.capacity() * size_of::<Anchor>()
    }
}

struct Decoder<'a> {
    bytes: &'a [u8],
    base: (i64, i64),
}

impl Iterator for Decoder<'_> {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        let mut values = [0_u64; 4];
        for v in &mut values {
            *v = read_varint(&mut self.bytes)?;
        }
        let [tag, gap_up, gap_down, len_up] = values;
        let extra_down = if tag & 2 == 2 {
            read_varint(&mut self.bytes)?
        } else {
            0
        };
        let len_up = unzigzag(len_up);
        let shape = Shape {
            gap_up: unzigzag(gap_up),
            gap_down: unzigzag(gap_down),
            len_up,
            len_down: len_up.saturating_add(unzigzag(extra_down)),
            exact: tag & 1 == 1,
        };
        let entry = Entry {
            base: self.base,
            shape,
            count: (tag >> 2).saturating_add(1),
        };
        self.base = entry.end();
        Some(entry)
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// LEB128; returns the bytes written (at most 10).
fn write_varint(mut v: u64, out: &mut [u8]) -> usize {
    let mut n = 0;
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out[n] = byte;
            return n + 1;
        }
        out[n] = byte | 0x80;
        n += 1;
    }
}

fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut v = 0_u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(up: i64, down: i64, end_up: i64, end_down: i64) -> Run {
        Run {
            up,
            down,
            end_up,
            end_down,
            exact: true,
            dense: true,
        }
    }

    #[test]
    fn varints_and_zigzag_round_trip() {
        for v in [0, 1, -1, 63, -64, 64, i64::MAX, i64::MIN, 1 << 40] {
            let mut buf = [0_u8; 10];
            let n = write_varint(zigzag(v), &mut buf);
            let mut slice = &buf[..n];
            assert_eq!(read_varint(&mut slice).map(unzigzag), Some(v));
            assert!(slice.is_empty());
        }
    }

    #[test]
    fn every_run_comes_back_whatever_its_shape() {
        let mut h = History::default();
        // Irregular transactions: n records, then a marker; sometimes an aborted one.
        let mut runs = Vec::new();
        let (mut up, mut down) = (10_i64, 0_i64);
        for i in 0..200_i64 {
            let n = 1 + (i * 7) % 5;
            runs.push(run(up, down, up + n - 1, down + n - 1));
            up += n + 1 + if i % 10 == 3 { 4 } else { 0 };
            down += n;
        }
        for r in &runs {
            h.push(r, 1 << 20);
        }
        assert_eq!(h.first_up(), Some(10));
        for (i, r) in runs.iter().enumerate() {
            for c in r.up..=r.end_up {
                let (got, next) = h.around(c).unwrap();
                assert_eq!(got, *r, "c={c}");
                assert_eq!(next, runs.get(i + 1).copied(), "c={c}");
            }
        }
        assert_eq!(h.around(9), None);
    }

    #[test]
    fn a_regular_pattern_costs_one_entry() {
        let mut h = History::default();
        for i in 0..100_000_i64 {
            // 9 records and a commit marker, forever.
            h.push(&run(i * 10, i * 9, i * 10 + 8, i * 9 + 8), 1 << 20);
        }
        // The first run (measured from itself) and then one shape, 99,999 times.
        assert!(h.bytes.len() <= 10, "{} bytes", h.bytes.len());
        assert!(h.pending.is_some_and(|p| p.count == 99_999));
        let (r, next) = h.around(543_215).unwrap();
        assert_eq!(r, run(543_210, 488_889, 543_218, 488_897));
        assert_eq!(next, Some(run(543_220, 488_898, 543_228, 488_906)));
    }

    #[test]
    fn the_budget_drops_the_oldest_runs_only() {
        let budget = 2_048;
        let mut h = History::default();
        let mut up = 0_i64;
        let mut runs = Vec::new();
        for i in 0..10_000_i64 {
            let n = 1 + (i * 13) % 7;
            let r = run(up, up - i, up + n - 1, up - i + n - 1);
            h.push(&r, budget);
            runs.push(r);
            assert!(h.used_bytes() <= budget, "{} bytes", h.used_bytes());
            up += n + 1;
        }
        let first = h.first_up().unwrap();
        assert!(first > 0, "nothing was dropped");
        for r in runs.iter().filter(|r| r.up >= first) {
            assert_eq!(h.around(r.up).map(|x| x.0), Some(*r));
        }
        assert_eq!(h.around(first - 1), None);
    }
}
