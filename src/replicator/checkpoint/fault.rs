//! A test-only fault: every checkpoint written points this many records past its translation,
//! so the world tests can show that the verification catches a broken translation. Read from
//! [`SKEW_ENV`] by debug builds only (the world tests run the debug binary); a release build
//! (every image) never reads it, and no spec field reaches it.

/// The variable a debug build reads the skew from (records, 0 to 1000).
#[cfg(debug_assertions)]
pub const SKEW_ENV: &str = "MIRRORFLOW_TEST_CHECKPOINT_SKEW";

/// Records to add to every checkpoint's downstream offset (0 unless injected).
#[cfg(debug_assertions)]
pub fn skew() -> i64 {
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| {
        let skew = std::env::var(SKEW_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .filter(|n| (0..=1000).contains(n))
            .unwrap_or(0);
        if skew != 0 {
            tracing::warn!(
                skew,
                "{SKEW_ENV}: every checkpoint is written {skew} records past its translation (test fault injection)"
            );
        }
        skew
    })
}

#[cfg(not(debug_assertions))]
pub fn skew() -> i64 {
    0
}
