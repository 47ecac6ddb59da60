//! Giving freed heap memory back to the system.
//!
//! glibc's allocator returns memory to the system only from the top of each arena; memory
//! freed below a block still in use stays in the process. The operator's probe clients
//! (librdkafka, in C) and its watch and reconcile code (Rust) share that allocator across one
//! arena per thread that allocates: at 500 flows 56 of its 127 MiB were free blocks kept this
//! way, and deleting 499 flows freed their clients, caches and statuses without the resident
//! size going down (bench/results/2026-12-03-operator-scale-memory). `malloc_trim` hands the
//! free pages of every arena back.

/// Returns the free pages of every heap arena to the system; true when some were returned.
/// Walks every arena under its lock (milliseconds for a heap of a hundred MiB): call it now
/// and then, not per allocation. A no-op where the allocator is not glibc's.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointer and only works on the allocator's own free
        // lists, under their locks; it is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Keeps glibc to at most `max_arenas` heap arenas. Call once at start, before other threads
/// allocate. Skipped (false) when the environment tunes the allocator itself
/// (`GLIBC_TUNABLES`, `MALLOC_ARENA_MAX`), or where the allocator is not glibc's.
///
/// Why: librdkafka's broker threads (tens of them: every client has a few) and the copy thread
/// each take an arena of their own (up to 8 per core), and multi-MiB fetch and decompression
/// buffers freed in one stay there, held for that thread. At 2,000 partitions 104 MiB of arenas
/// held 29-50 MiB in use (`malloc_stats` at the end of a copy,
/// bench/results/2026-12-04-partitions-rss/). glibc's mmap threshold is left dynamic: fixing
/// it low saved more memory but cost a third more CPU per record (a mapping per fetch).
pub fn limit_arenas(max_arenas: i32) -> bool {
    if std::env::var_os("GLIBC_TUNABLES").is_some()
        || std::env::var_os("MALLOC_ARENA_MAX").is_some()
    {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes the allocator's parameters, under its own lock.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, max_arenas) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = max_arenas;
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn freed_memory_can_be_released_at_any_time() {
        let blocks: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 * 1024]).collect();
        // Every other block freed: holes below blocks still in use, which only a trim returns.
        let kept: Vec<Vec<u8>> = blocks.into_iter().step_by(2).collect();
        super::release_free_memory();
        assert!(kept.iter().enumerate().all(|(i, b)| b[0] == (2 * i) as u8));
    }
}
