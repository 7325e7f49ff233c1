//! Fuzz target: arbitrary bodies POSTed to the extender's `bind` verb (see `fuzz/harness.rs`).
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::extender_verb(harness::Verb::Bind, data));
