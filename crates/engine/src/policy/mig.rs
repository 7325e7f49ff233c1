//! How nodes rank for a pod that asks for MIG slices: binpack, fgd and fgd-plus pack slices onto
//! nodes whose slices are already in use, so that untouched MIG cards stay free to be
//! repartitioned or turned back into whole GPUs; spread puts them on untouched nodes first. The
//! extender sees slices per node and profile, never per card (kubelet picks the instance), so
//! "in use" is the node's. The policies' own measures (GPU utilisation, fragmentation) read
//! whole cards and shares, which slices leave unchanged, so they do not rank slices.

use crate::mig::MigSlices;
use crate::state::NodeState;

use super::ScoringPolicy;

/// The score, on 0..=100, of placing slices `asked` on `node` as it is before the placement:
/// packing, a node with some MIG slice in use scores in 50..=100 and an untouched one in 0..50,
/// and within each the fewer slices of the asked profiles are left free after the placement, the
/// higher (1 / (1 + left) of the band). Spread scores 100 minus that, which reverses the order.
pub fn score(scoring: ScoringPolicy, node: &NodeState, asked: &[MigSlices]) -> f64 {
    let left: u64 = asked
        .iter()
        .map(|slices| u64::from(node.mig_free(&slices.profile).saturating_sub(slices.count)))
        .sum();
    let closeness = 1.0 / (1.0 + left as f64);
    let packed = if node.mig_in_use() {
        50.0 + 50.0 * closeness
    } else {
        49.0 * closeness
    };
    match scoring {
        ScoringPolicy::Spread => 100.0 - packed,
        ScoringPolicy::Binpack | ScoringPolicy::Fgd | ScoringPolicy::FgdPlus => packed,
    }
}

/// A placement's score with its MIG slices weighed in: `grants_score` (the policy's score of the
/// GPU grants) when the pod asks for no slice, the MIG [`score`] alone when it asks for slices
/// and no grant, the mean of the two when it asks for both.
pub fn combined(
    scoring: ScoringPolicy,
    grants_score: f64,
    node: &NodeState,
    asked: &[MigSlices],
    grants: bool,
) -> f64 {
    if asked.is_empty() {
        return grants_score;
    }
    let slices = score(scoring, node, asked);
    if grants {
        (grants_score + slices) / 2.0
    } else {
        slices
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::PodAllocation;
    use crate::mig::MigProfile;
    use crate::model::{CpuMilli, GpuMode, MemMiB, NodeSpec};

    fn slices(profile: &str, count: u32) -> MigSlices {
        MigSlices::new(MigProfile::parse(profile).unwrap(), count)
    }

    /// A node advertising `advertised` slices of 1g.10gb with `held` of them held.
    fn node(advertised: u32, held: u32) -> NodeState {
        let spec = NodeSpec::uniform("n", GpuMode::Exclusive, 0, "A100", MemMiB(0))
            .with_mig(vec![slices("1g.10gb", advertised)]);
        let mut node = NodeState::new(spec);
        let mut pod = PodAllocation::host_only(node.spec.name.clone(), CpuMilli(0), MemMiB(0));
        pod.mig = vec![slices("1g.10gb", held)];
        node.add(&pod);
        node
    }

    #[test]
    fn packing_puts_nodes_in_use_first_then_the_fewest_left() {
        let asked = [slices("1g.10gb", 1)];
        let score = |n: &NodeState| score(ScoringPolicy::Binpack, n, &asked);
        // In use, 1 left after; in use, 5 left; untouched, 0 left; untouched, 6 left.
        let order = [node(7, 5), node(7, 1), node(1, 0), node(7, 0)];
        for pair in order.windows(2) {
            assert!(score(&pair[0]) > score(&pair[1]), "{pair:?}");
        }
        assert!((50.0..=100.0).contains(&score(&order[1])));
        assert!((0.0..50.0).contains(&score(&order[2])));
        for scoring in [ScoringPolicy::Fgd, ScoringPolicy::FgdPlus] {
            assert_eq!(super::score(scoring, &order[0], &asked), score(&order[0]));
        }
    }

    #[test]
    fn spread_reverses_the_order() {
        let asked = [slices("1g.10gb", 1)];
        let order = [node(7, 5), node(7, 1), node(1, 0), node(7, 0)];
        for pair in order.windows(2) {
            assert!(
                score(ScoringPolicy::Spread, &pair[0], &asked)
                    < score(ScoringPolicy::Spread, &pair[1], &asked)
            );
        }
    }

    #[test]
    fn slices_alone_take_the_mig_score_and_both_the_mean() {
        let n = node(7, 1);
        let asked = [slices("1g.10gb", 1)];
        let mig = score(ScoringPolicy::Binpack, &n, &asked);
        assert_eq!(combined(ScoringPolicy::Binpack, 10.0, &n, &[], true), 10.0);
        assert_eq!(
            combined(ScoringPolicy::Binpack, 10.0, &n, &asked, false),
            mig
        );
        assert_eq!(
            combined(ScoringPolicy::Binpack, 10.0, &n, &asked, true),
            (10.0 + mig) / 2.0
        );
    }
}
