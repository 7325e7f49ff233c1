//! Fit and score in one call: the verdict, placement and score that bind, filter and prioritize
//! ask of one node. Sits above both [`fit`](super::fit) (where the pod can go) and
//! [`policy`](super::policy) (which GPUs, how good), which therefore never import each other
//! both ways.

use super::fit::{RejectReason, fit_with, footprint_with};
use super::policy::fgd::FgdCache;
use super::policy::fgd_plus::Taking;
use super::policy::{Evaluation, Policy};
use super::request::PodRequest;
use super::state::{NodeState, PerGpu};

impl Policy {
    /// Fit and score in one call, with the placement: what bind asks of the chosen node.
    pub fn evaluate(
        &self,
        node: &NodeState,
        request: &PodRequest,
    ) -> Result<Evaluation, RejectReason> {
        let mut cache = FgdCache::default();
        let choice = self.share_choice(node, request);
        let allocation = fit_with(node, request, self, choice, &mut cache)?;
        let score = self.score_with(node, &allocation, &mut cache);
        Ok(Evaluation { allocation, score })
    }

    /// The verdict and score of [`Policy::evaluate`] (equal to
    /// `evaluate(node, request).map(|e| e.score)`, bit for bit) without building the placement:
    /// what filter and prioritize ask of every candidate node. The same placement procedure runs,
    /// but what it chooses is recorded on the stack as the node's usage afterwards instead of as
    /// a [`PodAllocation`] (a few heap blocks and the node name's reference count per node).
    pub fn evaluate_score(
        &self,
        node: &NodeState,
        request: &PodRequest,
    ) -> Result<f64, RejectReason> {
        // Allocations name GPUs by index and scores read them back by index: the footprint,
        // which works on positions, gives the same usage only when indices are positions.
        if !node.profile.contiguous {
            return self
                .evaluate(node, request)
                .map(|evaluation| evaluation.score);
        }
        let mut cache = FgdCache::default();
        // The node's usage, then the placement's scratch, then the usage the pod leaves: built
        // here and written in place (moving it out of the placement was a `memcpy` call, 10% of
        // filtering a share pod).
        let mut after = PerGpu::copy_of(&node.gpus);
        let quality = footprint_with(node, request, self, &mut cache, &mut after)?;
        let taking = Taking {
            cpu: request.cpu,
            memory: request.memory,
            // The placement succeeded, so the pod holds GPUs exactly when it asks for any.
            gpus: request.wants_gpu(),
        };
        Ok(self.score_after(node, &after, taking, quality, &mut cache))
    }
}
