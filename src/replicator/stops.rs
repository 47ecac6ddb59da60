//! What stopped, for the refusal record the source loop's discovery writes into the positions
//! topic (which the status shows in `Replicating`): filled by the copy's stall watch, by the
//! policies that stop a partition they cannot copy, and by the loops that cannot read an
//! internal topic ([`super::reach::Reachability::hold`]). It sits below every loop, so each
//! reaches it without importing another's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::kafka::refusals::Refusal;

/// Why each stopped partition stopped, by remote (or followed internal) topic and partition:
/// one record per topic, naming each of its stopped partitions.
pub type Stops = Arc<Mutex<BTreeMap<(String, i32), Refusal>>>;

/// The stops recorded so far, for the refusal record (which joins those of one topic into one).
pub fn stops_now(stops: &Stops) -> Vec<Refusal> {
    lock(stops).values().cloned().collect()
}

/// A place for stops, empty.
pub fn no_stops() -> Stops {
    Arc::new(Mutex::new(BTreeMap::new()))
}

/// The lock of the replicator's shared state (these stops, a copy thread's policy). A panic
/// while holding one leaves the state as consistent as any crash would, so a poisoned lock is
/// used as it is.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
