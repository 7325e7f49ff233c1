//! What this build is: the crate's version, the commit it was built from and the compiler that
//! built it, as `build.rs` stamped them. `--version` prints them and the
//! `gpu_extender_build_info` metric carries them, so an operator can tell which build runs.

/// The crate's version (`Cargo.toml`), which the chart's `appVersion` follows.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit, 12 hex digits: from the `SOURCE_COMMIT` variable when the build has it (the
/// image build: the Dockerfile's argument of that name), else from `git` in a checkout, else
/// `unknown`.
pub const COMMIT: &str = env!("BUILD_INFO_COMMIT");

/// `rustc --version` of the compiler that built it.
pub const RUSTC: &str = env!("BUILD_INFO_RUSTC");

/// What `gpu-extender --version` prints after the name: `0.1.0 (commit 0123456789ab, rustc
/// 1.95.0 (...))`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BUILD_INFO_COMMIT"),
    ", ",
    env!("BUILD_INFO_RUSTC"),
    ")"
);

/// The Rust version alone (`1.95.0` of `rustc 1.95.0 (...)`), the metric's `rust_version`.
pub fn rust_version() -> &'static str {
    RUSTC
        .strip_prefix("rustc ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or(RUSTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_stamped() {
        assert!(LONG_VERSION.starts_with(VERSION));
        assert!(LONG_VERSION.contains(COMMIT));
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() >= 7 && COMMIT.chars().all(|c| c.is_ascii_hexdigit())),
            "{COMMIT}"
        );
        assert!(RUSTC.starts_with("rustc "), "{RUSTC}");
        assert!(
            rust_version()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit()),
            "{}",
            rust_version()
        );
    }
}
