//! The harness itself: a plane starts, takes fake GPU nodes and pods, and stops.

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::harness::run;
use crate::objects::{GPU_MEM, GpuNode, Mode, PodSpec, create_node, create_pod, pods};

#[test]
fn plane_takes_fake_gpu_nodes_and_pods() {
    run("plane", async |c| {
        let node = GpuNode::new("t4-a", Mode::Share, 4, "Tesla-T4", 16);
        create_node(&c.client, &node).await?;
        let got = Api::<Node>::all(c.client.clone()).get("t4-a").await?;
        let alloc = got.status.and_then(|s| s.allocatable).unwrap_or_default();
        ensure!(
            alloc.get(GPU_MEM).map(|q| q.0.as_str()) == Some("64"),
            "allocatable {alloc:?}"
        );
        create_pod(&c.client, &PodSpec::new("p", GPU_MEM, 4)).await?;
        let pod = pods(&c.client).get("p").await?;
        ensure!(pod.spec.and_then(|s| s.node_name).is_none());
        let _ = Duration::ZERO;
        Ok(())
    });
}
