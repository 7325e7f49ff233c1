//! gpu-extender binary.
fn main() {}
