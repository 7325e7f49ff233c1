//! Fuzz target: arbitrary bodies POSTed to the extender's `filter` verb (see `fuzz/harness.rs`).
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::extender_verb(harness::Verb::Filter, data));
