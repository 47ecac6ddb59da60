#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mirrorflow_fuzz::rewritten_batches(data));
