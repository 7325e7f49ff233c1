//! MIG slices as NVIDIA's device plugin serves them under its `mixed` strategy: one extended
//! resource per profile (`nvidia.com/mig-3g.20gb: 2`), counted per node, with kubelet and the
//! device plugin choosing which instance a pod gets. The vocabulary lives here: a profile, and a
//! count of slices of one profile (what a node advertises, what a pod asks for and holds), kept
//! sorted by profile so that equal holdings compare equal. The table counts them per node
//! ([`crate::NodeState::mig_held`]); how nodes rank for them is [`crate::policy::mig`].

use std::fmt;
use std::sync::Arc;

use thiserror::Error;

/// A name that is no MIG profile; shown to users in the pod's FailedScheduling event.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error(
    "{0:?} is not a MIG profile: expected <compute>g.<memory>gb with an optional suffix, such as 3g.20gb or 1g.10gb.me"
)]
pub struct BadMigProfile(pub String);

/// A MIG profile as the device plugin's resource names it after `mig-`: `<g>g.<m>gb`, the GPU
/// instance's compute slices and its memory in GB, then an optional variant suffix (`.me` in
/// `1g.10gb.me`, NVIDIA's `1g.10gb+me`: a resource name cannot hold `+`, so the device plugin
/// writes `.`). Compared by name; cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigProfile {
    // The name first: the derived order and equality are the name's, since the numbers below
    // are read from it.
    name: Arc<str>,
    compute_slices: u8,
    memory_gb: u32,
}

impl MigProfile {
    /// Reads a profile name (`3g.20gb`, `1g.10gb.me`, `1g.10gb+me`). Anything else, compute
    /// instance profiles (`1c.3g.20gb`, which the device plugin does not serve) included, is an
    /// error naming the text.
    pub fn parse(text: &str) -> Result<Self, BadMigProfile> {
        let bad = || BadMigProfile(text.to_owned());
        let (compute, rest) = text.split_once("g.").ok_or_else(bad)?;
        let compute_slices: u8 = number(compute).ok_or_else(bad)?;
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (memory, rest) = rest.split_at(digits);
        let memory_gb: u32 = number(memory).ok_or_else(bad)?;
        let suffix = rest.strip_prefix("gb").ok_or_else(bad)?;
        if compute_slices == 0 || memory_gb == 0 || !valid_suffix(suffix) {
            return Err(bad());
        }
        Ok(Self {
            name: Arc::from(text),
            compute_slices,
            memory_gb,
        })
    }

    /// The name, as read.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The GPU instance's compute slices (the `3` of `3g.20gb`): of 7 on an A100 or H100, of 4
    /// on an A30.
    pub fn compute_slices(&self) -> u8 {
        self.compute_slices
    }

    /// The memory the profile names, in MiB (`20gb` is 20 GiB here; NVIDIA rounds, a `3g.20gb`
    /// instance has about 19.6 GiB). A plain number: the units live in `model`, which holds
    /// this module's slices.
    pub fn memory_mib(&self) -> u64 {
        u64::from(self.memory_gb) * 1024
    }
}

impl fmt::Display for MigProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// A whole number of plain decimal digits.
fn number<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Empty, or a separator (`.`, `+`, `-`) followed by lower-case letters, digits and separators,
/// ending in a letter or digit (`.me`, `+me`, `.me.all`, `+gfx`).
fn valid_suffix(suffix: &str) -> bool {
    let Some(body) = suffix.strip_prefix(['.', '+', '-']) else {
        return suffix.is_empty();
    };
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    body.chars()
        .all(|c| allowed(c) || matches!(c, '.' | '+' | '-'))
        && body.chars().next().is_some_and(allowed)
        && body.chars().last().is_some_and(allowed)
}

/// Slices of one profile: what a node advertises, or what a pod asks for and holds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigSlices {
    pub profile: MigProfile,
    pub count: u32,
}

impl MigSlices {
    /// `count` slices of `profile`.
    pub fn new(profile: MigProfile, count: u32) -> Self {
        Self { profile, count }
    }
}

/// `slices` sorted by profile, each profile once (its counts added up) and none with a count of
/// 0: the form nodes, requests and allocations keep them in.
pub fn normalized(mut slices: Vec<MigSlices>) -> Vec<MigSlices> {
    slices.sort_by(|a, b| a.profile.cmp(&b.profile));
    let mut merged: Vec<MigSlices> = Vec::with_capacity(slices.len());
    for entry in slices {
        if entry.count == 0 {
            continue;
        }
        match merged.last_mut() {
            Some(last) if last.profile == entry.profile => {
                last.count = last.count.saturating_add(entry.count);
            }
            _ => merged.push(entry),
        }
    }
    merged
}

/// How many slices of `profile` normalized `slices` list (0 when none).
pub fn count_of(slices: &[MigSlices], profile: &MigProfile) -> u32 {
    slices
        .binary_search_by(|entry| entry.profile.cmp(profile))
        .map_or(0, |position| slices[position].count)
}

/// Adds `change` to normalized `held` (takes it away, saturating, when `adding` is false);
/// `held` stays normalized, so taking away what was added leaves it as it was.
pub(crate) fn apply(held: &mut Vec<MigSlices>, change: &[MigSlices], adding: bool) {
    for entry in change.iter().filter(|entry| entry.count > 0) {
        match held.binary_search_by(|known| known.profile.cmp(&entry.profile)) {
            Ok(position) => {
                let known = &mut held[position];
                known.count = if adding {
                    known.count.saturating_add(entry.count)
                } else {
                    known.count.saturating_sub(entry.count)
                };
                if known.count == 0 {
                    held.remove(position);
                }
            }
            Err(position) if adding => held.insert(position, entry.clone()),
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(text: &str) -> MigProfile {
        MigProfile::parse(text).unwrap()
    }

    #[test]
    fn profiles_read_compute_slices_memory_and_a_suffix() {
        let p = profile("3g.20gb");
        assert_eq!((p.compute_slices(), p.memory_mib()), (3, 20 * 1024));
        assert_eq!(p.to_string(), "3g.20gb");
        for ok in [
            "1g.10gb.me",
            "1g.10gb+me",
            "7g.141gb",
            "1g.24gb+gfx",
            "1g.5gb.me.all",
        ] {
            assert_eq!(profile(ok).as_str(), ok);
        }
        assert_eq!(profile("7g.141gb").memory_mib(), 141 * 1024);
    }

    #[test]
    fn garbage_is_refused_in_words() {
        for bad in [
            "",
            "3g",
            "3g.20",
            "3g.20g",
            "g.20gb",
            "0g.20gb",
            "3g.0gb",
            "3G.20GB",
            "1c.3g.20gb",
            "3g.20gb.",
            "3g.20gb.ME",
            "3g.20gbme",
            "300g.20gb",
            "3g.99999999999gb",
            "-3g.20gb",
            " 3g.20gb",
        ] {
            let error = MigProfile::parse(bad).unwrap_err();
            assert_eq!(error, BadMigProfile(bad.to_owned()), "{bad:?}");
            assert!(error.to_string().contains("3g.20gb"), "{error}");
        }
    }

    #[test]
    fn normalizing_sorts_merges_and_drops_zero_counts() {
        let slices = normalized(vec![
            MigSlices::new(profile("3g.20gb"), 1),
            MigSlices::new(profile("1g.5gb"), 0),
            MigSlices::new(profile("1g.10gb"), 2),
            MigSlices::new(profile("3g.20gb"), 2),
        ]);
        assert_eq!(
            slices,
            vec![
                MigSlices::new(profile("1g.10gb"), 2),
                MigSlices::new(profile("3g.20gb"), 3),
            ]
        );
        assert_eq!(count_of(&slices, &profile("3g.20gb")), 3);
        assert_eq!(count_of(&slices, &profile("1g.5gb")), 0);
    }

    #[test]
    fn taking_away_what_was_added_restores_the_holding() {
        let before = vec![MigSlices::new(profile("1g.10gb"), 2)];
        let change = normalized(vec![
            MigSlices::new(profile("3g.20gb"), 1),
            MigSlices::new(profile("1g.10gb"), 3),
        ]);
        let mut held = before.clone();
        apply(&mut held, &change, true);
        assert_eq!(count_of(&held, &profile("1g.10gb")), 5);
        assert_eq!(count_of(&held, &profile("3g.20gb")), 1);
        apply(&mut held, &change, false);
        assert_eq!(held, before);
        // Taking away more than is held stops at none.
        apply(&mut held, &change, false);
        assert!(held.is_empty());
    }
}
