//! The crate's tests and benchmarks read batches through librdkafka as the binary does: linked
//! with the same `--wrap`s, so librdkafka's lz4, zstd and snappy reads come to this crate's
//! inflaters. Every integration test and benchmark then calls `inflater::linked()`: without
//! that reference the linker does not take the wrapped symbols, and it fails to link.

include!("src/inflater/symbols.rs");

fn main() {
    for symbol in WRAPPED {
        println!("cargo::rustc-link-arg-tests=-Wl,--wrap={symbol}");
        println!("cargo::rustc-link-arg-benches=-Wl,--wrap={symbol}");
    }
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/inflater/symbols.rs");
}
