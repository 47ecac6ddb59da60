//! Which checkpoints to verify now ([`Sampler::pick`]): each group-partition at most once per
//! period, at most a fixed number a minute (a token bucket refilled continuously, holding at
//! most ten seconds' worth) and, with [`Sampler::with_byte_budget`], at most so many bytes read
//! a minute (the reads' bytes are charged once they are known: [`Sampler::charge`]); the least
//! recently verified first and, among equals, the groups in turn (a group with a thousand
//! partitions does not hold back one with a single one). Pure: time is given.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::mm2::TopicPartition;

/// A group and one of its target partitions.
pub type Pair = (String, TopicPartition);

/// Token units per verification: the bucket counts in sixtieths of a millisecond's refill so
/// the rate per minute stays exact in integers.
const UNIT: u64 = 60_000;
/// The bucket holds this much of a minute's allowance: a burst after idling stays short.
const BURST_SHARE: u64 = 6;

pub struct Sampler {
    period: Duration,
    per_minute: u64,
    /// Token units (`UNIT` per verification).
    tokens: u64,
    refilled: Instant,
    last: HashMap<Pair, Instant>,
    bytes: Option<ByteBudget>,
}

/// Bytes a minute, spent after the fact: the reads' cost is known only once they are done.
struct ByteBudget {
    per_minute: u64,
    /// Bytes that may still be read; below zero after reads that cost more than it held.
    balance: i64,
    refilled: Instant,
    /// What a verification has cost lately (bytes, a moving average): a pick takes no more
    /// than the balance pays for at that price.
    typical: u64,
}

/// What a verification is taken to cost before any was charged: two reads of one first fetch.
const FIRST_GUESS: u64 = 128 << 10;

impl ByteBudget {
    fn capacity(&self) -> i64 {
        i64::try_from(self.per_minute / BURST_SHARE).unwrap_or(i64::MAX)
    }

    fn refill(&mut self, now: Instant) {
        let ms = now.saturating_duration_since(self.refilled).as_millis();
        let ms = u64::try_from(ms).unwrap_or(u64::MAX);
        // Whole bytes only: the milliseconds not paid for yet stay for the next refill.
        let gained = u128::from(ms) * u128::from(self.per_minute) / 60_000;
        if gained == 0 {
            return;
        }
        let gained = i64::try_from(gained).unwrap_or(i64::MAX);
        self.balance = self.balance.saturating_add(gained).min(self.capacity());
        self.refilled = now;
    }

    /// How many verifications the balance pays for now.
    fn affords(&self) -> usize {
        if self.balance <= 0 {
            return 0;
        }
        let n = self.balance.unsigned_abs() / self.typical.max(1);
        usize::try_from(n).unwrap_or(usize::MAX).max(1)
    }
}

impl Sampler {
    /// Each pair at most once per `period`, at most `per_minute` picks a minute.
    pub fn new(period: Duration, per_minute: u32, now: Instant) -> Self {
        let mut s = Sampler {
            period,
            per_minute: u64::from(per_minute),
            tokens: 0,
            refilled: now,
            last: HashMap::new(),
            bytes: None,
        };
        s.tokens = s.capacity();
        s
    }

    /// Also at most `per_minute` bytes read a minute, charged with [`Self::charge`].
    pub fn with_byte_budget(mut self, per_minute: u64) -> Self {
        let mut budget = ByteBudget {
            per_minute,
            balance: 0,
            refilled: self.refilled,
            typical: FIRST_GUESS,
        };
        budget.balance = budget.capacity();
        self.bytes = Some(budget);
        self
    }

    /// A verification's reads brought `bytes`.
    pub fn charge(&mut self, bytes: u64, now: Instant) {
        if let Some(b) = self.bytes.as_mut() {
            b.refill(now);
            b.balance = b
                .balance
                .saturating_sub(i64::try_from(bytes).unwrap_or(i64::MAX));
            // An eighth of the newest cost: a few large reads raise the price quickly.
            b.typical = (b.typical.saturating_mul(7).saturating_add(bytes)) / 8;
        }
    }

    /// How many verifications the byte budget allows now (no limit without one).
    fn affordable(&mut self, now: Instant) -> usize {
        match self.bytes.as_mut() {
            Some(b) => {
                b.refill(now);
                b.affords()
            }
            None => usize::MAX,
        }
    }

    fn capacity(&self) -> u64 {
        (self.per_minute / BURST_SHARE).max(1).saturating_mul(UNIT)
    }

    fn refill(&mut self, now: Instant) {
        let ms = now.saturating_duration_since(self.refilled).as_millis();
        let ms = u64::try_from(ms).unwrap_or(u64::MAX);
        self.tokens = self
            .tokens
            .saturating_add(ms.saturating_mul(self.per_minute))
            .min(self.capacity());
        self.refilled = now;
    }

    /// Whether a pick now may take anything (the bucket holds a verification): the caller
    /// lists its candidates only then.
    pub fn may_pick(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= UNIT && self.affordable(now) > 0
    }

    /// Up to `room` pairs among `candidates` to verify now; they count as verified at `now`.
    /// Pairs no longer among the candidates are forgotten.
    pub fn pick(&mut self, candidates: &[Pair], room: usize, now: Instant) -> Vec<Pair> {
        self.refill(now);
        let present: HashSet<&Pair> = candidates.iter().collect();
        self.last.retain(|p, _| present.contains(p));
        let allowed = usize::try_from(self.tokens / UNIT).unwrap_or(usize::MAX);
        let budget = room.min(allowed).min(self.affordable(now));
        if budget == 0 {
            return Vec::new();
        }
        // (last verified, place among its group's due pairs, pair): never verified first.
        let mut due: Vec<(Option<Instant>, usize, &Pair)> = Vec::new();
        let mut per_group: HashMap<&str, usize> = HashMap::new();
        for pair in candidates {
            let last = self.last.get(pair).copied();
            if last.is_some_and(|at| now.saturating_duration_since(at) < self.period) {
                continue;
            }
            let place = per_group.entry(pair.0.as_str()).or_default();
            due.push((last, *place, pair));
            *place += 1;
        }
        due.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(b.2)));
        let picked: Vec<Pair> = due
            .into_iter()
            .take(budget)
            .map(|(_, _, p)| p.clone())
            .collect();
        for p in &picked {
            self.last.insert(p.clone(), now);
        }
        let spent = u64::try_from(picked.len())
            .unwrap_or(u64::MAX)
            .saturating_mul(UNIT);
        self.tokens = self.tokens.saturating_sub(spent);
        picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(groups: &[(&str, i32)]) -> Vec<Pair> {
        groups
            .iter()
            .flat_map(|(g, n)| (0..*n).map(|p| (g.to_string(), TopicPartition::new("A.t", p))))
            .collect()
    }

    #[test]
    fn each_pair_at_most_once_per_period() {
        let t0 = Instant::now();
        let all = pairs(&[("g", 3)]);
        let mut s = Sampler::new(Duration::from_secs(60), 1000, t0);
        assert_eq!(s.pick(&all, 100, t0).len(), 3);
        for secs in [1, 30, 59] {
            assert!(
                s.pick(&all, 100, t0 + Duration::from_secs(secs)).is_empty(),
                "{secs}s"
            );
        }
        assert_eq!(s.pick(&all, 100, t0 + Duration::from_secs(60)).len(), 3);
    }

    #[test]
    fn the_cap_holds_over_minutes_whatever_the_ticks() {
        let t0 = Instant::now();
        let all = pairs(&[("g", 5000)]);
        let mut s = Sampler::new(Duration::from_secs(1), 600, t0);
        let mut picked = 0;
        for tick in 0..=600 {
            picked += s
                .pick(&all, usize::MAX, t0 + Duration::from_secs(tick))
                .len();
        }
        // Ten minutes at 600 a minute, plus the first burst (ten seconds' worth).
        assert!(picked <= 6000 + 100, "{picked}");
        assert!(picked >= 6000 - 10, "the rate is reached: {picked}");
    }

    #[test]
    fn an_empty_bucket_asks_for_no_candidates() {
        let t0 = Instant::now();
        let mut s = Sampler::new(Duration::from_secs(1), 60, t0);
        assert!(s.may_pick(t0));
        assert_eq!(s.pick(&pairs(&[("g", 50)]), 50, t0).len(), 10, "the burst");
        assert!(!s.may_pick(t0));
        assert!(s.may_pick(t0 + Duration::from_secs(1)), "one a second");
    }

    #[test]
    fn room_bounds_a_pick() {
        let t0 = Instant::now();
        let mut s = Sampler::new(Duration::from_secs(60), 1000, t0);
        assert_eq!(s.pick(&pairs(&[("g", 50)]), 4, t0).len(), 4);
        assert!(s.pick(&pairs(&[("g", 50)]), 0, t0).is_empty());
    }

    #[test]
    fn groups_take_turns_and_the_least_recently_verified_come_first() {
        let t0 = Instant::now();
        let all = pairs(&[("big", 100), ("small", 1), ("mid", 2)]);
        let mut s = Sampler::new(Duration::from_secs(10), 6000, t0);
        let first: Vec<String> = s.pick(&all, 3, t0).into_iter().map(|p| p.0).collect();
        assert_eq!(first, ["big", "mid", "small"], "one of each group first");
        // Over a period every pair is verified once, none twice.
        let mut seen: HashMap<Pair, u32> = HashMap::new();
        for step in 1..=10 {
            for p in s.pick(&all, 11, t0 + Duration::from_millis(step * 100)) {
                *seen.entry(p).or_default() += 1;
            }
        }
        assert_eq!(seen.len(), all.len() - 3, "every other pair once");
        assert!(seen.values().all(|&n| n == 1));
        // After the period the ones verified first are due first again.
        let again = s.pick(&all, 3, t0 + Duration::from_secs(10));
        assert_eq!(
            again.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
            ["big", "mid", "small"]
        );
    }

    #[test]
    fn the_byte_budget_holds_over_minutes_whatever_a_read_costs() {
        let t0 = Instant::now();
        let all = pairs(&[("g", 5000)]);
        let mib: u64 = 1 << 20;
        let mut s = Sampler::new(Duration::from_secs(1), 1000, t0).with_byte_budget(60 * mib);
        let (mut picked, mut read) = (0u64, 0u64);
        for tick in 0..=600 {
            let now = t0 + Duration::from_secs(tick);
            for _ in s.pick(&all, usize::MAX, now) {
                // Every verification reads 2 MiB: 30 a minute fit the budget.
                s.charge(2 * mib, now);
                picked += 1;
                read += 2 * mib;
            }
        }
        // Ten minutes at 60 MiB, plus the bucket's first ten seconds and one pick's overshoot.
        assert!(read <= 600 * mib + 10 * mib + 4 * mib, "{}", read / mib);
        assert!(
            read >= 600 * mib - 10 * mib,
            "the budget is used: {}",
            read / mib
        );
        assert!(
            picked < 1000,
            "the byte budget binds, not the count: {picked}"
        );
        // Spent: nothing until it refills.
        let now = t0 + Duration::from_secs(600);
        s.charge(100 * mib, now);
        assert!(!s.may_pick(now));
        assert!(s.pick(&all, usize::MAX, now).is_empty());
    }

    #[test]
    fn without_a_byte_budget_charges_change_nothing() {
        let t0 = Instant::now();
        let mut s = Sampler::new(Duration::from_secs(60), 600, t0);
        s.charge(u64::MAX, t0);
        assert_eq!(
            s.pick(&pairs(&[("g", 500)]), 500, t0).len(),
            100,
            "the count's burst"
        );
    }

    #[test]
    fn pairs_that_went_are_forgotten() {
        let t0 = Instant::now();
        let mut s = Sampler::new(Duration::from_secs(60), 1000, t0);
        s.pick(&pairs(&[("g", 2)]), 10, t0);
        s.pick(&pairs(&[("g", 1)]), 10, t0 + Duration::from_secs(1));
        assert_eq!(s.last.len(), 1);
    }
}
