//! Fuzz target: arbitrary JSON read as a Node and translated as the watch would (see `fuzz/harness.rs`).
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::node(data));
