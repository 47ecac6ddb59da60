//! A global allocator that counts: the bytes live now, the peak since the last [`measure`], and
//! the largest single request. A decoder that sizes a buffer from a declared length shows up in
//! the largest request, whether or not the kernel backs it with memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize, request: usize) {
    let now = CURRENT.fetch_add(by, Relaxed).saturating_add(by);
    PEAK.fetch_max(now, Relaxed);
    LARGEST.fetch_max(request, Relaxed);
}

// SAFETY (all four): every call is passed on unchanged to the system allocator; only counters
// are updated around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size(), layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size(), layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            grew(new_size - layout.size(), new_size);
        } else {
            CURRENT.fetch_sub(layout.size() - new_size, Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What one call allocated: the peak above what was live before it, and the largest request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Allocated {
    pub peak: usize,
    pub largest: usize,
}

pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Allocated) {
    let before = CURRENT.load(Relaxed);
    PEAK.store(before, Relaxed);
    LARGEST.store(0, Relaxed);
    let out = f();
    let allocated = Allocated {
        peak: PEAK.load(Relaxed).saturating_sub(before),
        largest: LARGEST.load(Relaxed),
    };
    (out, allocated)
}

/// Bytes in the unit a person reads.
pub fn human(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
