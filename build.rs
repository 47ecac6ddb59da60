//! The binary is linked with `--wrap` for librdkafka's lz4, zstd and snappy inflaters, so its
//! reads of compressed batches go to the bounded ones of `mirrorflow-rdkafka-ext`.

include!("crates/rdkafka-ext/src/inflater/symbols.rs");

fn main() {
    for symbol in WRAPPED {
        println!("cargo::rustc-link-arg-bins=-Wl,--wrap={symbol}");
    }
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=crates/rdkafka-ext/src/inflater/symbols.rs");
}
