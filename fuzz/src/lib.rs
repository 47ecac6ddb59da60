//! Fuzz target bodies: those over mirrorflow-core's decoders ([`core_bodies`], also run on
//! stable by `crates/core/tests/fuzz_corpus.rs`) and those over mirrorflow-conn's connection
//! code ([`conn_bodies`], run on stable by `crates/conn/tests/fuzz_corpus.rs`). Each stable
//! runner includes only its own file, so the core's tests still build without OpenSSL.
//!
//! Each body panics only when an invariant is broken, which is what the fuzzer looks for.

pub mod conn_bodies;
pub mod core_bodies;

pub use conn_bodies::*;
pub use core_bodies::*;
